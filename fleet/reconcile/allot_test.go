package reconcile

import (
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/providers"
)

// TestAllot: the allocator's share caps the target, its named nodes drain
// first (not the ones the reconciler would pick: the newest), zero holds
// the fleet at no nodes through drains without destroying it, and
// lifting the share lets the fleet grow back.
func TestAllot(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	f := testFleet(2, 4)
	w := newWorld(t, f, a)
	w.settleRunning(4, "setup")
	// n001 and n002 are the oldest: the reconciler alone drains the newest.
	w.allot = &Allot{Nodes: 2, Drain: []string{"n002", "n001"}, Reason: "reclaimed by project b"}
	w.targetAt = w.now
	p := w.pass()
	var drained []string
	for _, d := range actionsOf[Drain](p) {
		drained = append(drained, d.NodeID)
	}
	slices.Sort(drained)
	if !slices.Equal(drained, []string{"n001", "n002"}) || p.Target != 2 {
		t.Fatalf("drained %v (target %d), want the allocator's n001, n002 at 2", drained, p.Target)
	}
	w.settleRunning(2, "after shrink")

	w.allot = &Allot{Nodes: 0, Reason: "pause: budget exhausted"}
	p = w.pass()
	ds := actionsOf[Drain](p)
	if len(ds) != 2 || !strings.Contains(ds[0].Reason, "budget exhausted") {
		t.Fatalf("pause: drains %+v, want both nodes with the allocator's reason", ds)
	}
	w.settleRunning(0, "paused")
	if p := w.pass(); len(p.Actions) != 0 {
		t.Fatalf("a paused fleet at 0 does something: %v", p.Actions)
	}

	w.allot = nil
	w.targetAt = w.now
	w.settleRunning(4, "resumed")
}
