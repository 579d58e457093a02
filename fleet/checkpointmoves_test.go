package fleet

import (
	"math"
	"testing"

	"github.com/fleetd/fleetd/fleet/placement"
)

// TestCheckpointMoves: the status view prices a move away from the store
// as placement does: another region of the same cloud at the inter-region
// rate, another cloud at internet egress, each node restoring it all.
func TestCheckpointMoves(t *testing.T) {
	src := placement.Location{Cloud: "aws", Region: "us-west-2"}
	m := &placement.MoveCost{Bytes: 200e9, Source: src, Egress: placement.DefaultEgress, RestoreMiBps: 100}
	got := checkpointMoves(m, 3)
	want := []struct {
		to    string
		perGB float64
	}{{"aws:*", 0.02}, {"gcp", 0.09}}
	if len(got) != len(want) {
		t.Fatalf("moves %+v, want %d rows", got, len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.To != w.to || g.PerGB != w.perGB || math.Abs(g.EgressUSD-200*w.perGB*3) > 1e-9 {
			t.Errorf("row %d = %+v; want to %s at $%.2f/GB, $%.2f for 3 nodes", i, g, w.to, w.perGB, 200*w.perGB*3)
		}
		if math.Abs(g.RestoreSeconds-200e9/(1<<20)/100) > 1e-6 || g.AsOf == "" || g.Source == "" {
			t.Errorf("row %d restore %.0fs, as of %q, source %q", i, g.RestoreSeconds, g.AsOf, g.Source)
		}
	}
	// A GCS store: the other cloud is AWS, at GCP's internet egress.
	m.Source = placement.Location{Cloud: "gcp", Region: "us-central1"}
	if got := checkpointMoves(m, 1); len(got) != 2 || got[1].To != "aws" || got[1].PerGB != 0.12 {
		t.Errorf("from gcp: %+v", got)
	}
	for name, mc := range map[string]*placement.MoveCost{
		"no size":  {Source: src, Egress: placement.DefaultEgress},
		"no cloud": {Bytes: 1e9, Egress: placement.DefaultEgress},
		"nil":      nil,
	} {
		if got := checkpointMoves(mc, 2); got != nil {
			t.Errorf("%s: %+v, want none", name, got)
		}
	}
}
