package aws_test

import (
	"encoding/json"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakeec2"
	"github.com/fleetd/fleetd/providers/providertest"
)

// conformanceOptions provoke the typed errors through the fake behind the
// config's endpoint; each subtest has its own fake, so the knobs do not leak.
func conformanceOptions(t *testing.T) providertest.Options {
	return providertest.Options{
		InvalidConfig: func(cfg providers.Config) providers.Config {
			return config(t, cfg.Fleet, with(baseBlock(endpointOf(t, cfg)), "no_such_attribute", true))
		},
		CapacityError: func(cfg providers.Config, off providers.Offering) providers.Config {
			fakeOf(t, cfg).SetCapacity(off.Zone, off.InstanceType, 0)
			return cfg
		},
		QuotaError: func(cfg providers.Config, off providers.Offering) providers.Config {
			market := fakeec2.MarketOnDemand
			if off.CapacityType == providers.Spot {
				market = fakeec2.MarketSpot
			}
			fakeOf(t, cfg).SetVCPUQuota(off.Region, market, 0)
			return cfg
		},
	}
}

func endpointOf(t *testing.T, cfg providers.Config) string {
	t.Helper()
	var b struct {
		Endpoint string `json:"endpoint"`
	}
	if err := json.Unmarshal(cfg.Raw, &b); err != nil {
		t.Fatal(err)
	}
	return b.Endpoint
}

func TestConformance(t *testing.T) {
	providertest.Run(t, func(t *testing.T) (providers.Provider, providers.Config) {
		_, url := newFake(t)
		return aws.New(testOptions()), config(t, "conformance", baseBlock(url))
	}, conformanceOptions(t))
}

func TestConformanceOverGRPC(t *testing.T) {
	providertest.RunOverGRPC(t, aws.Name, func(t *testing.T) providers.Config {
		_, url := newFake(t)
		return config(t, "conformance", baseBlock(url))
	}, conformanceOptions(t))
}
