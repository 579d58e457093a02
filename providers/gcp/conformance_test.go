package gcp_test

import (
	"encoding/json"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
	"github.com/fleetd/fleetd/providers/providertest"
)

// conformanceOptions provokes the typed errors through the fake behind
// the config, which works the same in-process and with the provider in a
// plugin subprocess (the fake always runs in the test process).
func conformanceOptions(t *testing.T) providertest.Options {
	return providertest.Options{
		InvalidConfig: func(cfg providers.Config) providers.Config {
			var block map[string]any
			if err := json.Unmarshal(cfg.Raw, &block); err != nil {
				t.Fatal(err)
			}
			block["no_such_attribute"] = true
			raw, _ := json.Marshal(block)
			return providers.Config{Fleet: cfg.Fleet, Raw: raw}
		},
		CapacityError: func(cfg providers.Config, off providers.Offering) providers.Config {
			fakeOf(t, cfg).SetStockout(off.Zone, true)
			return cfg
		},
		QuotaError: func(cfg providers.Config, off providers.Offering) providers.Config {
			fakeOf(t, cfg).SetInsertFault("", fakegce.QuotaFault("GPUS_ALL_REGIONS", ""))
			return cfg
		},
	}
}

func TestConformance(t *testing.T) {
	providertest.Run(t, func(t *testing.T) (providers.Provider, providers.Config) {
		_, cfg := newFake(t, fakegce.Options{}, nil)
		return newProvider(), cfg
	}, conformanceOptions(t))
}

func TestConformanceOverGRPC(t *testing.T) {
	providertest.RunOverGRPC(t, gcp.Name, func(t *testing.T) providers.Config {
		_, cfg := newFake(t, fakegce.Options{}, nil)
		return cfg
	}, conformanceOptions(t))
}
