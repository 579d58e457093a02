package main

import (
	"os"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/gcp"
)

func init() {
	builtinProviders[gcp.Name] = func() providers.Provider {
		// The plugin inherits the daemon's environment.
		return gcp.New(gcp.Options{BillingAPIKey: os.Getenv("FLEETD_GCP_BILLING_API_KEY")})
	}
}
