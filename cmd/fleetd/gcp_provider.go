package main

import (
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/gcp"
)

func init() {
	builtinProviders[gcp.Name] = func() providers.Provider { return gcp.New(gcp.Options{}) }
}
