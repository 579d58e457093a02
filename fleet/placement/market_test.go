package placement

import (
	"math"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// TestObserveSpot: the history follows capacity as the market shows it,
// counts the fleet's own spot nodes as up, ignores what it cannot use or
// cannot see, and changes only when the market does.
func TestObserveSpot(t *testing.T) {
	f := fleet(1, 1)
	a := off("aws", "us-east-1a", "p4d", providers.Spot, 10, 1)
	b := off("aws", "us-east-1b", "p4d", providers.Spot, 10, 0)
	odA := off("aws", "us-east-1a", "p4d", providers.OnDemand, 30, -1)
	unknown := off("aws", "us-east-1c", "p4d", providers.Spot, 10, -1)
	other := off("aws", "us-east-1d", "p4d", providers.Spot, 10, 1)
	other.GPUs = 4 // the fleet wants 8-GPU nodes
	with := func(o providers.Offering, avail int) providers.Offering { o.Available = avail; return o }
	at := func(m float64) time.Time { return t0.Add(time.Duration(m * float64(time.Minute))) }

	type want struct {
		key       string
		up, first bool
		since     time.Time
		ends      int
		upMinutes float64
	}
	steps := []struct {
		name    string
		now     time.Time
		offs    []providers.Offering
		running map[string]bool
		changed bool
		want    []want
	}{
		{"first look: known spot offerings only", at(0), []providers.Offering{a, b, odA, unknown, other}, nil, true,
			[]want{{a.Key(), true, true, at(0), 0, 0}, {b.Key(), false, true, at(0), 0, 0}}},
		{"nothing moved", at(5), []providers.Offering{a, b, odA}, nil, false,
			[]want{{a.Key(), true, true, at(0), 0, 0}, {b.Key(), false, true, at(0), 0, 0}}},
		{"our node took a's last instance: still up; b comes up", at(10), []providers.Offering{with(a, 0), with(b, 2)}, map[string]bool{a.Key(): true}, true,
			[]want{{a.Key(), true, true, at(0), 0, 0}, {b.Key(), true, false, at(10), 0, 0}}},
		{"a's capacity goes (our node interrupted)", at(40), []providers.Offering{with(a, 0), with(b, 2)}, nil, true,
			[]want{{a.Key(), false, false, at(40), 1, 40}, {b.Key(), true, false, at(10), 0, 0}}},
		{"a missing from the market keeps its state; b goes", at(70), []providers.Offering{with(b, 0)}, nil, true,
			[]want{{a.Key(), false, false, at(40), 1, 40}, {b.Key(), false, false, at(70), 1, 60}}},
		{"a back", at(80), []providers.Offering{with(a, 3), with(b, 0)}, nil, true,
			[]want{{a.Key(), true, false, at(80), 1, 40}, {b.Key(), false, false, at(70), 1, 60}}},
	}
	var h []SpotSeen
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			prev := h
			h = ObserveSpot(h, f, st.offs, st.running, st.now)
			same := len(prev) == len(h) && (len(h) == 0 || &prev[0] == &h[0])
			if same == st.changed {
				t.Fatalf("changed = %v, want %v", !same, st.changed)
			}
			if len(h) != len(st.want) {
				t.Fatalf("history %+v, want %d entries", h, len(st.want))
			}
			for i, w := range st.want {
				s := h[i]
				if s.Key != w.key || s.Up != w.up || s.First != w.first || !s.Since.Equal(w.since) || s.Ends != w.ends || s.UpSeconds != w.upMinutes*60 {
					t.Errorf("entry %d = %+v, want %+v", i, s, w)
				}
			}
		})
	}
	if got, _ := SeenOf(h, a.Key()); got.UpFor(at(95)) != 15*time.Minute {
		t.Fatalf("a up for %s, want 15m", got.UpFor(at(95)))
	}
	if got, _ := SeenOf(h, b.Key()); got.UpFor(at(95)) != 0 {
		t.Fatalf("b is down but up for %s", got.UpFor(at(95)))
	}
	if _, ok := SeenOf(h, unknown.Key()); ok {
		t.Fatalf("an offering of unknown availability is tracked")
	}
}

func TestExpectedRun(t *testing.T) {
	o := off("aws", "us-east-1a", "p4d", providers.Spot, 10, 1)
	now := t0.Add(10 * time.Hour)
	h := func(x float64) time.Duration { return time.Duration(x * float64(time.Hour)) }
	tests := []struct {
		name string
		seen []SpotSeen
		rec  state.OfferingRecord
		want time.Duration
	}{
		// m = (0 + 8)/1 = 8 h; a run up since the first look counts a
		// mean run of age: 8 + (2 + 8)/2.
		{"up since the first look", []SpotSeen{{Key: o.Key(), Up: true, First: true, Since: now.Add(-2 * time.Hour)}}, state.OfferingRecord{}, h(13)},
		// Four runs of 1 h ended: m = (4 + 8)/5 = 2.4 h; just back.
		{"flapping, just back", []SpotSeen{{Key: o.Key(), Up: true, Since: now, Ends: 4, UpSeconds: 4 * 3600}}, state.OfferingRecord{}, h(2.4)},
		{"flapping, up 3 h", []SpotSeen{{Key: o.Key(), Up: true, Since: now.Add(-3 * time.Hour), Ends: 4, UpSeconds: 4 * 3600}}, state.OfferingRecord{}, h(3.9)},
		// One 40 h run ended: m = 48/2 = 24 h.
		{"one long run ended, back an hour", []SpotSeen{{Key: o.Key(), Up: true, Since: now.Add(-time.Hour), Ends: 1, UpSeconds: 40 * 3600}}, state.OfferingRecord{}, h(24.5)},
		// Not tracked (availability unknown): the daemon's own record,
		// m = (22 + 8)/(2 + 1) = 10 h, age unknown (a mean run).
		{"untracked: own interruptions", nil, state.OfferingRecord{Key: o.Key(), Interruptions: 2, RunSeconds: 22 * 3600}, h(15)},
		{"untracked, no history", nil, state.OfferingRecord{}, h(12)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ExpectedRun(o, tt.seen, tt.rec, now)
			if d := got - tt.want; d < -time.Second || d > time.Second {
				t.Fatalf("ExpectedRun = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestChangeRate(t *testing.T) {
	now := t0.Add(10 * time.Hour)
	spotRec := state.OfferingRecord{Key: "aws/us-east-1/us-east-1a/p4d/spot", Interruptions: 3, RunSeconds: 12 * 3600}
	odRec := state.OfferingRecord{Key: "aws/us-east-1/us-east-1a/p4d/on-demand", Interruptions: 9, RunSeconds: 1000 * 3600}
	recs := map[string]state.OfferingRecord{spotRec.Key: spotRec, odRec.Key: odRec}
	tests := []struct {
		name string
		seen []SpotSeen
		want float64
	}{
		{"no history at all: the prior", nil, 1 / MarketPriorHours},
		// Market history wins over the records: (2 + 1)/(6 + 4 + 2 + 8).
		{"market", []SpotSeen{
			{Key: "a", Up: true, Since: now.Add(-4 * time.Hour), Ends: 1, UpSeconds: 6 * 3600},
			{Key: "b", Up: false, Since: now.Add(-time.Hour), Ends: 1, UpSeconds: 2 * 3600},
		}, 3.0 / 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := recs
			if tt.name == "no history at all: the prior" {
				r = nil
			}
			if got := ChangeRate(tt.seen, r, now); math.Abs(got-tt.want) > 1e-12 {
				t.Fatalf("ChangeRate = %v, want %v", got, tt.want)
			}
		})
	}
	// Without market history: own spot interruptions over spot hours,
	// on-demand records ignored: (3 + 1)/(12 + 8).
	if got := ChangeRate(nil, recs, now); math.Abs(got-0.2) > 1e-12 {
		t.Fatalf("ChangeRate from records = %v, want 0.2", got)
	}
}

// TestSlackValue: the closed form against its definition, λ =
// (S(n+1) − S(n+2))/d with S(k) = ∫₀^C P(Poisson(ν·t) ≥ k) dt integrated
// numerically, and its shape.
func TestSlackValue(t *testing.T) {
	d := 12 * time.Minute
	S := func(k int, nu, c float64) float64 {
		const steps = 20000
		dt := c / steps
		sum := 0.0
		for i := range steps {
			mu := nu * (float64(i) + 0.5) * dt
			cdf, term := 0.0, math.Exp(-mu)
			for j := range k {
				cdf += term
				term *= mu / float64(j+1)
			}
			sum += max(0, 1-cdf) * dt
		}
		return sum
	}
	tests := []struct {
		free, left time.Duration
		nu         float64
	}{
		{3*time.Hour + 33*time.Minute, 48 * time.Hour, 0.1},
		{3*time.Hour + 33*time.Minute, 48 * time.Hour, 0.4},
		{time.Hour, 30 * time.Hour, 0.25},
		{10 * time.Minute, 5 * time.Hour, 0.5},
		{0, 20 * time.Hour, 0.05},
	}
	for _, tt := range tests {
		n := int(tt.free / d)
		c := tt.left.Hours()
		want := (S(n+1, tt.nu, c) - S(n+2, tt.nu, c)) / d.Hours()
		got := SlackValue(tt.free, tt.left, d, tt.nu)
		if math.Abs(got-want) > 1e-3*max(1, want) {
			t.Errorf("SlackValue(%s, %s, ν=%v) = %v, integral %v", tt.free, tt.left, tt.nu, got, want)
		}
	}
	// Plenty of slack for a calm market: next to nothing; the same slack
	// in a volatile market: a lot; no slack: 1/(ν·d) times P(N ≥ 2).
	if v := SlackValue(11*time.Hour, 48*time.Hour, d, 0.05); v > 1e-6 {
		t.Errorf("calm, 11 h free: λ = %v", v)
	}
	if v := SlackValue(3*time.Hour, 48*time.Hour, d, 0.5); v < 0.9/(0.5*0.2) {
		t.Errorf("volatile, 3 h free: λ = %v", v)
	}
	// More slack is worth less per hour; more work left, more.
	for free := time.Duration(0); free < 5*time.Hour; free += d {
		if SlackValue(free+d, 30*time.Hour, d, 0.3) > SlackValue(free, 30*time.Hour, d, 0.3) {
			t.Fatalf("λ grows with slack at %s", free)
		}
	}
	if SlackValue(2*time.Hour, 40*time.Hour, d, 0.3) < SlackValue(2*time.Hour, 20*time.Hour, d, 0.3) {
		t.Fatalf("λ shrinks with work left")
	}
	for _, z := range []struct {
		free, left, d time.Duration
		nu            float64
	}{{time.Hour, 0, d, 0.3}, {time.Hour, time.Hour, 0, 0.3}, {time.Hour, time.Hour, d, 0}} {
		if v := SlackValue(z.free, z.left, z.d, z.nu); v != 0 {
			t.Errorf("SlackValue(%+v) = %v, want 0", z, v)
		}
	}
}

func TestPoissonTail(t *testing.T) {
	for _, tt := range []struct {
		mu   float64
		k    int
		want float64
	}{
		{0, 0, 1}, {0, 3, 0}, {2, 0, 1},
		{2, 1, 1 - math.Exp(-2)},
		{2, 3, 1 - math.Exp(-2)*(1+2+2)},
		{0.01, 5, 8.264185641806e-13}, // e^-0.01 · Σ 0.01^j/j! from 5: no cancellation
		{50, 200, 0},
	} {
		if got := PoissonTail(tt.mu, tt.k); math.Abs(got-tt.want) > 1e-9*max(tt.want, 1e-6) {
			t.Errorf("P(Poisson(%v) ≥ %d) = %v, want %v", tt.mu, tt.k, got, tt.want)
		}
	}
}
