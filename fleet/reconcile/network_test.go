package reconcile

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// TestLaunchNetwork: launches of an "auto" fleet on an EFA offering ask
// for the fabric and the incarnation's placement group, until capacity
// failures in the group make them launch without it, saying so in the
// node's reason (its transition event).
func TestLaunchNetwork(t *testing.T) {
	efa := offering("us-east-1a", "p5.48xlarge", providers.Spot, 30)
	efa.Network = providers.NetworkInfo{Fabric: providers.FabricEFA, Interfaces: 32, BandwidthGbps: 3200}
	streak := func(n int) state.OfferingRecord {
		rec := state.OfferingRecord{Key: efa.Key()}
		for i := range n {
			rec = placement.MarkUnavailable(rec, t0.Add(time.Duration(i-n)*40*time.Minute), "InsufficientInstanceCapacity: no capacity in the placement group", placement.UnavailableCapacity)
		}
		return rec
	}
	for _, c := range []struct {
		name      string
		mode      spec.Network
		rec       state.OfferingRecord
		wantGroup string
		fallback  bool
	}{
		{"standard", spec.NetworkStandard, state.OfferingRecord{}, "", false},
		{"auto", spec.NetworkAuto, state.OfferingRecord{}, "fleetd-bert", false},
		{"auto after failures", spec.NetworkAuto, streak(placement.GroupFallbackAfter), "", true},
		{"fast after failures", spec.NetworkFast, streak(placement.GroupFallbackAfter), "fleetd-bert", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := testFleet(2, 2)
			f.Node.Network = c.mode
			w := newWorld(t, f, efa)
			w.records[efa.Key()] = c.rec
			launches := 0
			for _, a := range Reconcile(w.input()).Actions {
				l, ok := a.(Launch)
				if !ok {
					continue
				}
				launches++
				if l.Network.Group != c.wantGroup || l.Network.Fabric != (c.mode != spec.NetworkStandard) {
					t.Errorf("launch network %+v, want group %q", l.Network, c.wantGroup)
				}
				if got := strings.Contains(l.Node.Reason, "launching without a group"); got != c.fallback {
					t.Errorf("reason %q: fallback said %v, want %v", l.Node.Reason, got, c.fallback)
				}
				if !reflect.DeepEqual(l.Node.Network, l.Network) {
					t.Errorf("node record's network %+v, launch's %+v: a relaunch must repeat the request", l.Node.Network, l.Network)
				}
				if c.wantGroup != "" && l.Network.GroupTags[providers.TagDaemonID] != "d1" {
					t.Errorf("group tags %v", l.Network.GroupTags)
				}
			}
			if launches != 2 {
				t.Fatalf("%d launches, want 2", launches)
			}
		})
	}
}
