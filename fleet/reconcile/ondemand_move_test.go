package reconcile

import (
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// TestOnDemandJobMovesToSpotElsewhere: a job that fell back to on-demand
// in one zone moves whole to spot in another zone when its own zone has no
// spot; nodes are never spread over two zones.
func TestOnDemandJobMovesToSpotElsewhere(t *testing.T) {
	spotA := offering("us-east-1a", "p4d", providers.Spot, 10)
	spotB := offering("us-east-1b", "p4d", providers.Spot, 11)
	odA := offering("us-east-1a", "p4d", providers.OnDemand, 30)
	w := newWorld(t, testFleet(2, 2), spotA, spotB, odA)
	w.failKeys[spotA.Key()] = true
	w.failKeys[spotB.Key()] = true
	for w.now.Sub(t0) < 20*time.Minute {
		w.pass()
		w.tick(step)
	}
	if n := w.liveBy(func(n state.Node) bool { return n.Offering.CapacityType == providers.OnDemand }); n != 2 {
		t.Fatalf("%d on-demand live, want 2\n%s", n, w.dump())
	}

	// Spot comes back in zone b only.
	w.failKeys[spotB.Key()] = false
	moved := false
	for w.now.Sub(t0) < 3*time.Hour {
		p := w.pass()
		for _, l := range actionsOf[Launch](p) {
			if l.Offering.Zone == "us-east-1b" {
				moved = true
			}
		}
		zones := map[string]bool{}
		for _, n := range w.nodes {
			if Live(n.State) {
				zones[n.Offering.Zone] = true
			}
		}
		if len(zones) > 1 {
			t.Fatalf("live nodes in %d zones\n%s", len(zones), w.dump())
		}
		w.tick(step)
	}
	if !moved {
		t.Fatalf("the job never moved to spot in us-east-1b\n%s", w.dump())
	}
	if n := w.liveBy(func(n state.Node) bool {
		return n.State == state.NodeRunning && n.Offering.Key() == spotB.Key()
	}); n != 2 {
		t.Fatalf("%d running on %s, want 2\n%s", n, spotB.Key(), w.dump())
	}
}
