package local_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/local"
	"github.com/fleetd/fleetd/providers/providertest"
)

// conformanceConfig returns a block over a fresh state dir, with extra
// attributes merged in, and makes sure no node of that dir outlives the
// test (whatever process launched it).
func conformanceConfig(t *testing.T, fleet string) providers.Config {
	t.Helper()
	dir := t.TempDir()
	cfg := blockConfig(t, fleet, dir, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		p := local.New(local.Options{StopGrace: 2 * time.Second})
		insts, _ := p.List(ctx, cfg, nil)
		for _, in := range insts {
			_ = p.Delete(ctx, cfg, in.ID)
		}
	})
	return cfg
}

func blockConfig(t *testing.T, fleet, stateDir string, extra map[string]any) providers.Config {
	t.Helper()
	block := map[string]any{"state_dir": stateDir}
	for k, v := range extra {
		block[k] = v
	}
	raw, err := json.Marshal(block)
	if err != nil {
		t.Fatal(err)
	}
	return providers.Config{Fleet: fleet, Raw: raw}
}

func stateDirOf(t *testing.T, cfg providers.Config) string {
	var b struct {
		StateDir string `json:"state_dir"`
	}
	if err := json.Unmarshal(cfg.Raw, &b); err != nil {
		t.Fatal(err)
	}
	return b.StateDir
}

func conformanceOptions(t *testing.T) providertest.Options {
	return providertest.Options{
		InvalidConfig: func(cfg providers.Config) providers.Config {
			return blockConfig(t, cfg.Fleet, stateDirOf(t, cfg), map[string]any{"no_such_attribute": true})
		},
		CapacityError: func(cfg providers.Config, off providers.Offering) providers.Config {
			return blockConfig(t, cfg.Fleet, stateDirOf(t, cfg), map[string]any{"capacity": map[string]int{off.Zone: 0}})
		},
		Interrupter: true,
	}
}

func TestConformance(t *testing.T) {
	providertest.Run(t, func(t *testing.T) (providers.Provider, providers.Config) {
		return local.New(local.Options{StopGrace: 2 * time.Second}), conformanceConfig(t, "conformance")
	}, conformanceOptions(t))
}

func TestConformanceOverGRPC(t *testing.T) {
	providertest.RunOverGRPC(t, local.Name, func(t *testing.T) providers.Config {
		return conformanceConfig(t, "conformance")
	}, conformanceOptions(t))
}
