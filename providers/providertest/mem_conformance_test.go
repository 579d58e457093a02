package providertest_test

import (
	"encoding/json"
	"os"
	"path"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

func TestMain(m *testing.M) {
	providertest.ServePluginIfRequested(map[string]func() providers.Provider{
		providertest.MemName: func() providers.Provider { return providertest.NewMemProvider() },
	})
	os.Exit(m.Run())
}

func memConfig(t *testing.T, fleet string, mc providertest.MemConfig) providers.Config {
	t.Helper()
	raw, err := json.Marshal(mc)
	if err != nil {
		t.Fatal(err)
	}
	return providers.Config{Fleet: fleet, Raw: raw}
}

// memOptions provokes MemProvider's typed errors through its config knobs,
// which work the same in-process and in a plugin subprocess.
func memOptions(t *testing.T) providertest.Options {
	zero := 0
	return providertest.Options{
		InvalidConfig: func(cfg providers.Config) providers.Config {
			return providers.Config{Fleet: cfg.Fleet, Raw: json.RawMessage(`{"no_such_knob": true}`)}
		},
		CapacityError: func(cfg providers.Config, off providers.Offering) providers.Config {
			return memConfig(t, cfg.Fleet, providertest.MemConfig{Capacity: map[string]int{off.Key(): 0}})
		},
		QuotaError: func(cfg providers.Config, off providers.Offering) providers.Config {
			return memConfig(t, cfg.Fleet, providertest.MemConfig{QuotaGPUs: &zero})
		},
		// The cheapest offering is GPU-less; launch a GPU one so the
		// quota check (in GPUs) applies.
		LaunchOffering: func(offs []providers.Offering) providers.Offering {
			for _, o := range offs {
				if o.GPUs > 0 && o.CapacityType == providers.Spot {
					return o
				}
			}
			t.Fatal("mem has no GPU spot offering")
			return providers.Offering{}
		},
		Interrupter: true,
	}
}

func TestMemProviderConformance(t *testing.T) {
	providertest.Run(t, func(t *testing.T) (providers.Provider, providers.Config) {
		return providertest.NewMemProvider(), providers.Config{Fleet: "conformance"}
	}, memOptions(t))
}

func TestMemProviderConformanceOverGRPC(t *testing.T) {
	providertest.RunOverGRPC(t, providertest.MemName, func(t *testing.T) providers.Config {
		return providers.Config{Fleet: "conformance"}
	}, memOptions(t))
}

// TestSkip checks that Options.Skip skips exactly the named checks.
func TestSkip(t *testing.T) {
	tests := []struct {
		name string
		skip map[string]string
	}{
		{"none", nil},
		{"one", map[string]string{"CreateIsIdempotent": "the backend ignores idempotency tokens"}},
		{"two", map[string]string{"ListFiltersByTags": "x", "Interrupt": "y"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ran := map[string]bool{}
			opts := memOptions(t)
			opts.Skip = tc.skip
			providertest.Run(t, func(st *testing.T) (providers.Provider, providers.Config) {
				ran[path.Base(st.Name())] = true
				return providertest.NewMemProvider(), providers.Config{Fleet: "conformance"}
			}, opts)
			for _, check := range []string{"Info", "CreateIsIdempotent", "ListFiltersByTags", "Interrupt"} {
				_, skipped := tc.skip[check]
				if ran[check] == skipped {
					t.Errorf("check %s ran = %v with Skip %v", check, ran[check], tc.skip)
				}
			}
		})
	}
}
