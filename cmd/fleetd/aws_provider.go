package main

import (
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
)

// The EC2 provider, served as a plugin subprocess like every built-in.
func init() {
	builtinProviders[aws.Name] = func() providers.Provider { return aws.New(aws.Options{}) }
}
