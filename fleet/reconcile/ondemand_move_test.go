package reconcile

import (
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// TestOnDemandJobMovesToSpotElsewhere: a job that fell back to on-demand
// in one zone moves whole to spot in another zone when its own zone has no
// spot. The members of a round are never spread over two zones. At
// max_nodes the move is make-before-break: the rendezvous keeps the new
// nodes out of the full round, so the on-demand nodes keep training until
// the spot nodes joined and only then go. Below max_nodes the new nodes
// would be merged into the running round: the on-demand nodes go first.
func TestOnDemandJobMovesToSpotElsewhere(t *testing.T) {
	spotA := offering("us-east-1a", "p4d", providers.Spot, 10)
	spotB := offering("us-east-1b", "p4d", providers.Spot, 11)
	odA := offering("us-east-1a", "p4d", providers.OnDemand, 30)
	tests := []struct {
		name          string
		maxNodes      int
		desired       int
		beforeJoining bool // the on-demand nodes go before the spot nodes joined
	}{
		{"at max_nodes: make-before-break", 2, 0, false},
		{"below max_nodes: on-demand first", 3, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := testFleet(2, tt.maxNodes)
			f.DesiredNodes = tt.desired
			w := newWorld(t, f, spotA, spotB, odA)
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
			moved, retired := false, map[string]bool{}
			for w.now.Sub(t0) < 3*time.Hour {
				p := w.pass()
				for _, l := range actionsOf[Launch](p) {
					if l.Offering.Zone == "us-east-1b" {
						moved = true
					}
				}
				zones := map[string]bool{}
				for id := range w.inRound {
					zones[w.nodes[id].Offering.Zone] = true
				}
				if len(zones) > 1 {
					t.Fatalf("round members in %d zones\n%s", len(zones), w.dump())
				}
				for _, tr := range actionsOf[Transition](p) {
					if tr.Node.Offering.CapacityType != providers.OnDemand || !Live(tr.From) || Live(tr.To) {
						continue
					}
					retired[tr.Node.ID] = true
					joined := w.liveBy(func(n state.Node) bool {
						return n.Offering.Key() == spotB.Key() && (n.State == state.NodeJoined || n.State == state.NodeRunning)
					})
					if (joined == 0) != tt.beforeJoining {
						t.Fatalf("on-demand node %s retired with %d spot nodes joined\n%s", tr.Node.ID, joined, w.dump())
					}
				}
				w.tick(step)
			}
			if !moved || len(retired) != 2 {
				t.Fatalf("moved %v, %d on-demand nodes retired\n%s", moved, len(retired), w.dump())
			}
			if n := w.liveBy(func(n state.Node) bool {
				return n.State == state.NodeRunning && n.Offering.Key() == spotB.Key()
			}); n != 2 {
				t.Fatalf("%d running on %s, want 2\n%s", n, spotB.Key(), w.dump())
			}
		})
	}
}
