package main

import (
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/sim"
)

// The trace-driven market is a built-in provider: as a plugin it runs the
// trace in (scaled) real time; `fleetd sim` drives it in virtual time.
func init() {
	builtinProviders[sim.Name] = func() providers.Provider { return sim.New(sim.Options{}) }
	builtinSchemas[sim.Name] = sim.Schema
}
