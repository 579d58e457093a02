package fleet

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/controller"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers/providertest"
)

// TestNewFleetStartsFromDeploymentHistory: what one fleet saw of the spot
// market is kept per deployment, and a fleet applied later starts from it
// (the current runs' states included while the history is fresh) instead
// of from the prior; `fleetd offerings` explains the spot figures.
func TestNewFleetStartsFromDeploymentHistory(t *testing.T) {
	mem := providertest.NewMemProvider()
	// Capacity limits make the mem provider report availability, which
	// the market history needs.
	for _, o := range providertest.MemOfferings() {
		if o.GPUType == "T4" && o.CapacityType == "spot" {
			mem.SetCapacity(o.Key(), 5)
		}
	}
	td := startTestDaemon(t, t.TempDir(), mem)
	ctx := context.Background()
	td.apply(ctx, t, "train.hcl", memSpec)
	var first controller.MarketHistory
	waitFor(t, "the deployment's market history", 10*time.Second, func() bool {
		first = readMarketHistory(t, td)
		return len(first.Spot) == 2
	})

	second := strings.Replace(memSpec, `fleet "train"`, `fleet "later"`, 1)
	td.apply(ctx, t, "later.hcl", second)
	var rt controller.SavedRuntime
	waitFor(t, "the later fleet's runtime", 10*time.Second, func() bool {
		rt = readRuntime(t, td, "later")
		return len(rt.Fallback.Spot) == 2
	})
	for i, s := range rt.Fallback.Spot {
		f := first.Spot[i]
		if s.Key != f.Key || !s.Since.Equal(f.Since) || s.Up != f.Up {
			t.Errorf("later fleet's %s: up %v since %s, want the deployment's up %v since %s", s.Key, s.Up, s.Since, f.Up, f.Since)
		}
	}

	var views []OfferingsView
	if err := td.client.Do(ctx, "POST", "/v1/offerings", nil, api.ApplyRequest{Filename: "later.hcl", Source: second}, &views); err != nil {
		t.Fatal(err)
	}
	for _, r := range views[0].Offerings {
		if r.Offering.GPUType == "T4" && r.Offering.CapacityType == "spot" && (r.ExpectedRun <= 0 || r.InterruptionCost <= 0) {
			t.Errorf("%s: expected run %.1f h, interruptions $%.4f/h; want both explained", r.Offering.Key(), r.ExpectedRun, r.InterruptionCost)
		}
	}
}

func readMarketHistory(t *testing.T, td *testDaemon) controller.MarketHistory {
	t.Helper()
	return stateView(t, td, controller.LoadMarketHistory)
}

func readRuntime(t *testing.T, td *testDaemon, fleet string) controller.SavedRuntime {
	t.Helper()
	var rt controller.SavedRuntime
	if err := td.Store().View(context.Background(), func(tx state.Tx) error {
		b, err := tx.Meta(controller.RuntimeKey(fleet))
		if err != nil || len(b) == 0 {
			return err
		}
		return json.Unmarshal(b, &rt)
	}); err != nil {
		t.Fatal(err)
	}
	return rt
}
