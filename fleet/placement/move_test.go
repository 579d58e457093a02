package placement

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
)

func TestEgressRate(t *testing.T) {
	loc := func(c, r string) Location { return Location{Cloud: c, Region: r} }
	over := DefaultEgress.With([]EgressRate{
		{From: "aws:us-east-1", To: "gcp:us-east4", PerGB: 0.01}, // an interconnect
		{From: "aws", To: "gcp", PerGB: 0.05},
		{From: "gcp:us-central1", To: "gcp:us-central1", PerGB: 0.001},
	}, "spec")
	cases := []struct {
		name     string
		t        EgressTable
		src, dst Location
		want     float64
	}{
		{"same region", DefaultEgress, loc("aws", "us-east-1"), loc("aws", "us-east-1"), 0},
		{"aws inter-region", DefaultEgress, loc("aws", "us-east-1"), loc("aws", "us-west-2"), 0.02},
		{"aws to gcp", DefaultEgress, loc("aws", "us-east-1"), loc("gcp", "us-central1"), 0.09},
		{"gcp to aws", DefaultEgress, loc("gcp", "us-central1"), loc("aws", "us-east-1"), 0.12},
		{"gcp inter-region", DefaultEgress, loc("gcp", "us-central1"), loc("gcp", "us-east4"), 0.02},
		{"local is free", DefaultEgress, loc("local", "local"), loc("aws", "us-east-1"), 0},
		{"unknown source", DefaultEgress, Location{}, loc("aws", "us-east-1"), 0},
		{"pair override", over, loc("aws", "us-east-1"), loc("gcp", "us-east4"), 0.01},
		{"cloud override", over, loc("aws", "us-west-2"), loc("gcp", "us-east4"), 0.05},
		{"override keeps other defaults", over, loc("aws", "us-west-2"), loc("aws", "us-east-1"), 0.02},
		{"same region priced explicitly", over, loc("gcp", "us-central1"), loc("gcp", "us-central1"), 0.001},
	}
	for _, c := range cases {
		if got, _ := c.t.Rate(c.src, c.dst); got != c.want {
			t.Errorf("%s: %s→%s = %g, want %g", c.name, c.src, c.dst, got, c.want)
		}
	}
}

func TestMoveEstimate(t *testing.T) {
	m := &MoveCost{Bytes: 200e9, Source: Location{"aws", "us-east-1"}, Egress: DefaultEgress, RestoreMiBps: 200, Horizon: 6 * time.Hour}
	a := off("aws", "us-west-2a", "p4d", providers.Spot, 8, 4)
	e, ok := m.Estimate(m.Source, []providers.Offering{a, a})
	if !ok {
		t.Fatal("no estimate")
	}
	secs := 200e9 / (1 << 20) / 200.0
	if e.EgressUSD != 200*0.02*2 || math.Abs(e.RestoreSeconds-secs) > 1e-6 || math.Abs(e.RestoreUSD-secs/3600*16) > 1e-9 {
		t.Fatalf("estimate %+v", e)
	}
	if want := (e.EgressUSD + e.RestoreUSD) / (6 * 16); math.Abs(e.PerGPUHour-want) > 1e-12 {
		t.Fatalf("per GPU-hour %g, want %g", e.PerGPUHour, want)
	}
	if !strings.Contains(e.String(), "aws:us-east-1→aws:us-west-2") || !strings.Contains(e.String(), "egress $8.00") {
		t.Fatalf("%s", e)
	}
	if _, ok := (*MoveCost)(nil).Estimate(m.Source, []providers.Offering{a}); ok {
		t.Fatal("a nil move cost estimated something")
	}
}

// TestMoveCostChangesPlacement: the checkpoint's journey decides between
// groups that price alone ranks the other way.
func TestMoveCostChangesPlacement(t *testing.T) {
	west := off("aws", "us-west-2a", "p4d", providers.Spot, 8.00, 4) // $1.00/GPU-h, far from the store
	east := off("aws", "us-east-1a", "p4d", providers.Spot, 8.40, 4) // $1.05/GPU-h, next to the store
	move := &MoveCost{Bytes: 200e9, Source: Location{"aws", "us-east-1"}, Egress: DefaultEgress, RestoreMiBps: 200, Horizon: 6 * time.Hour}

	// A job that lost every node restarts: where its checkpoint is wins.
	for _, tc := range []struct {
		move *MoveCost
		want string
	}{{nil, west.Zone}, {move, east.Zone}} {
		ch := Choose(ChooseInput{Fleet: fleet(2, 2), Offerings: []providers.Offering{west, east}, Now: t0, Need: 2, Target: 2,
			Capacity: SpotOnly("test"), AtBoundary: true, Move: tc.move})
		if len(ch.Launch) != 2 || ch.Launch[0].Zone != tc.want {
			t.Fatalf("move %v: launch %v, want %s", tc.move != nil, keys(ch.Launch), tc.want)
		}
		if tc.move != nil && (ch.Move == nil || ch.Move.EgressUSD != 0 || ch.Move.RestoreSeconds == 0) {
			t.Fatalf("the choice's move estimate %+v", ch.Move)
		}
	}

	// A job on GCP that could move to AWS for price: 18% cheaper, worth
	// it with a small checkpoint, not with 500 GB across clouds.
	gcp := off("gcp", "us-central1-a", "a2", providers.Spot, 9.60, 4) // $1.20/GPU-h
	aws := off("aws", "us-east-1a", "p4d", providers.Spot, 7.84, 4)   // $0.98/GPU-h
	for _, tc := range []struct {
		bytes   int64
		migrate bool
	}{{0, true}, {1e9, true}, {500e9, false}} {
		m := &MoveCost{Bytes: tc.bytes, Egress: DefaultEgress, RestoreMiBps: 200, Horizon: 6 * time.Hour}
		ch := Choose(ChooseInput{Fleet: fleet(1, 2), Offerings: []providers.Offering{gcp, aws}, Now: t0, Nodes: []providers.Offering{gcp},
			Need: 1, Target: 2, Capacity: SpotOnly("test"), AtBoundary: true, Move: m})
		if ch.Migrate != tc.migrate {
			t.Fatalf("%d bytes: migrate %v (%s), want %v", tc.bytes, ch.Migrate, ch.Reason, tc.migrate)
		}
		if tc.migrate && tc.bytes > 0 && !strings.Contains(ch.Reason, "egress $") {
			t.Errorf("reason lacks the move cost: %s", ch.Reason)
		}
	}
}
