package placement

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/spec/spectest"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func fleet(minN, maxN int) *spec.Fleet { return spectest.TypedFleet(minN, maxN, "aws", "gcp") }

// off builds an 8-GPU offering; zone "us-east-1a" → region "us-east-1".
func off(prov, zone, typ string, ct providers.CapacityType, price float64, avail int) providers.Offering {
	return spectest.Offering(prov, zone, typ, ct, price, avail)
}

func keys(offs []providers.Offering) []string {
	var out []string
	for _, o := range offs {
		out = append(out, o.Key())
	}
	return out
}

func TestFilter(t *testing.T) {
	base := off("aws", "us-east-1a", "p4d.24xlarge", providers.Spot, 10, -1)
	mod := func(fn func(*providers.Offering)) providers.Offering {
		o := base
		fn(&o)
		return o
	}
	tests := []struct {
		name  string
		fleet func(*spec.Fleet)
		o     providers.Offering
		want  string // substring of the exclusion; "" = passes
	}{
		{"fits", nil, base, ""},
		{"gpu count must match", nil, mod(func(o *providers.Offering) { o.GPUs = 16 }), "16 GPUs"},
		{"gpu type case-insensitive", func(f *spec.Fleet) { f.Node.GPUTypes = []string{"a100", "H100"} }, base, ""},
		{"gpu type mismatch", func(f *spec.Fleet) { f.Node.GPUTypes = []string{"H100"} }, base, "GPU type"},
		{"min vcpus", func(f *spec.Fleet) { f.Node.MinVCPUs = 128 }, base, "vCPUs"},
		{"min memory", func(f *spec.Fleet) { f.Node.MinMemoryGiB = 2000 }, base, "GiB"},
		{"price cap", func(f *spec.Fleet) { f.Node.MaxPricePerGPUHour = 1.0 }, base, "max_price_per_gpu_hour"},
		{"price cap ok", func(f *spec.Fleet) { f.Node.MaxPricePerGPUHour = 1.25 }, base, ""},
		{"provider not in fleet", nil, mod(func(o *providers.Offering) { o.Provider = "azure" }), "not in the fleet"},
		{"on-demand kept for fallback", nil, mod(func(o *providers.Offering) { o.CapacityType = providers.OnDemand }), ""},
		{"on-demand dropped when fallback never", func(f *spec.Fleet) { f.Placement.Fallback = spec.FallbackNever },
			mod(func(o *providers.Offering) { o.CapacityType = providers.OnDemand }), "fallback is never"},
		{"spot dropped for on-demand node", func(f *spec.Fleet) { f.Node.Spot = false }, base, "asks for on-demand"},
		{"cpu fleet accepts any gpu count", func(f *spec.Fleet) { f.Node.GPUs = 0 }, mod(func(o *providers.Offering) { o.GPUs = 0 }), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fleet(1, 2)
			if tt.fleet != nil {
				tt.fleet(f)
			}
			got := Exclusion(f, tt.o)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Fatalf("Exclusion = %q, want %q", got, tt.want)
			}
			if n := len(Filter(f, []providers.Offering{tt.o})); (n == 1) != (tt.want == "") {
				t.Fatalf("Filter kept %d, exclusion %q", n, got)
			}
		})
	}
}

func TestRateAndScore(t *testing.T) {
	m := DefaultModel()
	spot := off("aws", "us-east-1a", "p4d", providers.Spot, 16, -1)
	od := off("aws", "us-east-1a", "p4d", providers.OnDemand, 32, -1)
	tests := []struct {
		name string
		o    providers.Offering
		rec  state.OfferingRecord
		rate float64
	}{
		{"unseen spot gets the prior", spot, state.OfferingRecord{}, 1.0 / 20},
		{"unseen on-demand is clean", od, state.OfferingRecord{}, 0},
		{"history dominates", spot, state.OfferingRecord{Interruptions: 10, RunSeconds: 100 * 3600}, 11.0 / 120},
		{"on-demand history", od, state.OfferingRecord{Interruptions: 1, RunSeconds: 80 * 3600}, 1.0 / 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := m.Evaluate(tt.o, tt.rec, spec.StrategyLowestPrice)
			if math.Abs(c.Rate-tt.rate) > 1e-12 {
				t.Fatalf("rate = %v, want %v", c.Rate, tt.rate)
			}
			wantU := 1 / (1 + tt.rate*(10.0/60))
			if math.Abs(c.Useful-wantU) > 1e-12 {
				t.Fatalf("useful = %v, want %v", c.Useful, wantU)
			}
			if want := tt.o.PricePerHour / (8 * wantU); math.Abs(c.Score-want) > 1e-9 {
				t.Fatalf("score = %v, want %v", c.Score, want)
			}
			if c.Weighted != tt.o.PricePerGPUHour() {
				t.Fatalf("lowest-price weight = %v, want raw $/GPU-h %v", c.Weighted, tt.o.PricePerGPUHour())
			}
		})
	}
	// A flaky cheap offering loses to a clean one that costs a bit more.
	flaky := m.Evaluate(off("aws", "us-east-1a", "x", providers.Spot, 10, -1), state.OfferingRecord{Interruptions: 30, RunSeconds: 10 * 3600}, spec.StrategyPriceCapacity)
	clean := m.Evaluate(off("aws", "us-east-1b", "x", providers.Spot, 11, -1), state.OfferingRecord{RunSeconds: 100 * 3600}, spec.StrategyPriceCapacity)
	if !(clean.Score < flaky.Score) {
		t.Fatalf("clean %.4f should beat flaky %.4f", clean.Score, flaky.Score)
	}
}

func TestStrategyOrder(t *testing.T) {
	scarce := off("aws", "us-east-1a", "cheap", providers.Spot, 10, 1)
	plenty := off("aws", "us-east-1b", "pricier", providers.Spot, 11, 50)
	unknown := off("aws", "us-east-1c", "unknown", providers.Spot, 10.5, -1)
	tests := []struct {
		s    spec.Strategy
		want []string
	}{
		// price-capacity: 10·(1+0.3·4/5)=12.4, 11·(1+0.3·4/54)=11.24, 10.5·1.15=12.075
		{spec.StrategyPriceCapacity, []string{"pricier", "unknown", "cheap"}},
		{spec.StrategyLowestPrice, []string{"cheap", "unknown", "pricier"}},
		{spec.StrategyCapacity, []string{"pricier", "cheap", "unknown"}},
	}
	for _, tt := range tests {
		t.Run(string(tt.s), func(t *testing.T) {
			f := fleet(1, 4)
			f.Placement.Strategy = tt.s
			r := Rank(f, []providers.Offering{scarce, plenty, unknown}, nil, t0, DefaultModel())
			var got []string
			for _, x := range r {
				got = append(got, x.Offering.InstanceType)
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("order = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRankExcluded(t *testing.T) {
	f := fleet(1, 4)
	good := off("aws", "us-east-1a", "good", providers.Spot, 10, -1)
	down := off("aws", "us-east-1b", "down", providers.Spot, 9, -1)
	empty := off("aws", "us-east-1c", "empty", providers.Spot, 9, 0)
	wrong := off("aws", "us-east-1d", "wrong", providers.Spot, 1, -1)
	wrong.GPUs = 4
	recs := map[string]state.OfferingRecord{down.Key(): MarkUnavailable(state.OfferingRecord{Key: down.Key()}, t0, "ICE", UnavailableCapacity)}
	r := Rank(f, []providers.Offering{wrong, empty, down, good}, recs, t0.Add(time.Minute), DefaultModel())
	if r[0].Offering.InstanceType != "good" || r[0].Excluded != "" {
		t.Fatalf("first = %+v", r[0])
	}
	want := map[string]string{"wrong": "4 GPUs", "empty": "no capacity", "down": "unavailable until"}
	for _, x := range r[1:] {
		if !strings.Contains(x.Excluded, want[x.Offering.InstanceType]) {
			t.Errorf("%s excluded %q, want %q", x.Offering.InstanceType, x.Excluded, want[x.Offering.InstanceType])
		}
	}
	if r[3].UnavailableUntil.IsZero() && r[1].UnavailableUntil.IsZero() && r[2].UnavailableUntil.IsZero() {
		t.Errorf("unavailable-until not reported")
	}
}

func TestUnavailableTTL(t *testing.T) {
	tests := []struct {
		kind UnavailableKind
		ttls []time.Duration // TTL of the 1st, 2nd, ... consecutive failure
	}{
		{UnavailableCapacity, []time.Duration{3 * time.Minute, 6 * time.Minute, 12 * time.Minute, 24 * time.Minute, 48 * time.Minute, time.Hour, time.Hour}},
		{UnavailableInterrupted, []time.Duration{10 * time.Minute, 20 * time.Minute, 40 * time.Minute, time.Hour}},
		{UnavailableQuota, []time.Duration{time.Hour, 2 * time.Hour, 4 * time.Hour, 6 * time.Hour, 6 * time.Hour}},
		{UnavailableBootFailure, []time.Duration{15 * time.Minute, 30 * time.Minute, time.Hour, time.Hour}},
	}
	for _, tt := range tests {
		t.Run(string(tt.kind), func(t *testing.T) {
			rec := state.OfferingRecord{Key: "k"}
			now := t0
			for i, want := range tt.ttls {
				rec = MarkUnavailable(rec, now, "boom", tt.kind)
				if got := rec.UnavailableUntil.Sub(now); got != want {
					t.Fatalf("failure %d: ttl %s, want %s", i+1, got, want)
				}
				if Available(rec, now) || Available(rec, rec.UnavailableUntil.Add(-time.Nanosecond)) || !Available(rec, rec.UnavailableUntil) {
					t.Fatalf("failure %d: availability window wrong", i+1)
				}
				u, ok := ParseUnavailable(rec)
				if !ok || u.Kind != tt.kind || u.Streak != i+1 || u.Message != "boom" {
					t.Fatalf("parse = %+v %v", u, ok)
				}
				// The next failure comes right after expiry.
				now = rec.UnavailableUntil.Add(time.Second)
			}
		})
	}
}

func TestUnavailableStreakRules(t *testing.T) {
	rec := MarkUnavailable(state.OfferingRecord{}, t0, "a", UnavailableCapacity)
	// Failures of launches from the same pass: no extra back-off.
	again := MarkUnavailable(rec, t0.Add(time.Second), "b", UnavailableCapacity)
	if u, _ := ParseUnavailable(again); u.Streak != 1 || !again.UnavailableUntil.Equal(rec.UnavailableUntil) {
		t.Fatalf("same-window failure changed the entry: %+v", u)
	}
	// A quota error while backed off for capacity extends to the quota TTL.
	q := MarkUnavailable(rec, t0.Add(time.Second), "quota", UnavailableQuota)
	if u, _ := ParseUnavailable(q); u.Kind != UnavailableQuota || !q.UnavailableUntil.Equal(t0.Add(time.Second+time.Hour)) {
		t.Fatalf("quota did not take over: %+v", u)
	}
	// Long after expiry the streak starts over.
	late := MarkUnavailable(rec, rec.UnavailableUntil.Add(StreakReset+time.Minute), "c", UnavailableCapacity)
	if u, _ := ParseUnavailable(late); u.Streak != 1 {
		t.Fatalf("streak = %d after reset window", u.Streak)
	}
	// A successful launch ends the streak.
	ok := RecordLaunch(MarkUnavailable(rec, rec.UnavailableUntil.Add(time.Second), "d", UnavailableCapacity), t0.Add(time.Hour))
	if _, had := ParseUnavailable(ok); had || ok.Launches != 1 || !Available(ok, t0.Add(time.Hour)) {
		t.Fatalf("RecordLaunch left %+v", ok)
	}
	if next := MarkUnavailable(ok, t0.Add(time.Hour), "e", UnavailableCapacity); next.UnavailableUntil.Sub(t0.Add(time.Hour)) != 3*time.Minute {
		t.Fatalf("streak not reset by success")
	}
	// Interruptions count toward the rate.
	i := MarkUnavailable(state.OfferingRecord{}, t0, "notice", UnavailableInterrupted)
	i = MarkUnavailable(i, t0.Add(time.Minute), "notice", UnavailableInterrupted)
	if i.Interruptions != 2 {
		t.Fatalf("interruptions = %d", i.Interruptions)
	}
	// Reasons from elsewhere still parse.
	if u, ok := ParseUnavailable(state.OfferingRecord{UnavailableReason: "something odd"}); !ok || u.Message != "something odd" || u.Streak != 1 {
		t.Fatalf("foreign reason parsed as %+v", u)
	}
}

// TestInterruptionStreakSurvivesRelaunch: a spot offering that is
// interrupted again soon after it was launched on anew is backed off
// longer each time (a flapping zone); other failures, and interruptions
// far apart, start over after a successful launch. A kept streak is no
// failure on file for price moves.
func TestInterruptionStreakSurvivesRelaunch(t *testing.T) {
	mins := func(m int) time.Duration { return time.Duration(m) * time.Minute }
	tests := []struct {
		name string
		kind UnavailableKind
		gap  time.Duration // from the relaunch (at back-off expiry) to the next failure
		ttl  time.Duration // of that failure
	}{
		{"interrupted again 10 min after the relaunch", UnavailableInterrupted, mins(10), mins(20)},
		{"interrupted again after 59 min", UnavailableInterrupted, mins(59), mins(20)},
		{"interrupted again after 2 h", UnavailableInterrupted, 2 * time.Hour, mins(10)},
		{"capacity error after a launch", UnavailableCapacity, mins(10), mins(3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := MarkUnavailable(state.OfferingRecord{Key: "k"}, t0, "first", tt.kind)
			if !HasFailure(rec) {
				t.Fatalf("fresh failure not on file")
			}
			relaunch := rec.UnavailableUntil
			rec = RecordLaunch(rec, relaunch)
			if !Available(rec, relaunch) {
				t.Fatalf("not available after a launch")
			}
			if HasFailure(rec) {
				t.Fatalf("failure on file after a successful launch: %+v", rec)
			}
			at := relaunch.Add(tt.gap)
			rec = MarkUnavailable(rec, at, "again", tt.kind)
			if got := rec.UnavailableUntil.Sub(at); got != tt.ttl {
				t.Fatalf("back-off %s, want %s", got, tt.ttl)
			}
		})
	}
}

func TestChoose(t *testing.T) {
	a1 := off("aws", "us-east-1a", "p4d", providers.Spot, 10, -1)
	a2 := off("aws", "us-east-1a", "p5", providers.Spot, 12, -1)
	b1 := off("aws", "us-east-1b", "p4d", providers.Spot, 11, -1)
	c1 := off("aws", "us-west-2c", "p4d", providers.Spot, 7, -1)
	odA := off("aws", "us-east-1a", "p4d", providers.OnDemand, 30, -1)
	capped := func(o providers.Offering, n int) providers.Offering { o.Available = n; return o }
	gone := func(o providers.Offering) map[string]state.OfferingRecord {
		return map[string]state.OfferingRecord{o.Key(): MarkUnavailable(state.OfferingRecord{Key: o.Key()}, t0, "ICE", UnavailableCapacity)}
	}
	tests := []struct {
		name       string
		market     []providers.Offering
		recs       map[string]state.OfferingRecord
		nodes      []providers.Offering
		need       int
		boundary   bool
		dec        Decision
		exclude    []string
		wantGroup  string
		wantLaunch []string
		migrate    bool
	}{
		{name: "new job: cheapest zone", market: []providers.Offering{a1, b1, c1}, need: 3,
			wantGroup: "aws/us-west-2/us-west-2c", wantLaunch: []string{c1.Key(), c1.Key(), c1.Key()}},
		{name: "new job: zone that holds the target beats a cheaper one that holds only min",
			market: []providers.Offering{capped(c1, 2), b1}, need: 3,
			wantGroup: "aws/us-east-1/us-east-1b", wantLaunch: []string{b1.Key(), b1.Key(), b1.Key()}},
		{name: "fills several types in the group by availability", market: []providers.Offering{capped(a1, 1), a2}, need: 3,
			wantGroup: "aws/us-east-1/us-east-1a", wantLaunch: []string{a1.Key(), a2.Key(), a2.Key()}},
		{name: "no group holds min: launch nothing", market: []providers.Offering{capped(a1, 1), capped(b1, 1)}, need: 3},
		{name: "stay for a small price gap", market: []providers.Offering{a1, capped(b1, 10)}, nodes: []providers.Offering{b1, b1}, need: 1,
			boundary: true, wantGroup: "aws/us-east-1/us-east-1b", wantLaunch: []string{b1.Key()}},
		{name: "running job does not move for price", market: []providers.Offering{b1, c1}, nodes: []providers.Offering{b1, b1}, need: 1,
			wantGroup: "aws/us-east-1/us-east-1b", wantLaunch: []string{b1.Key()}},
		{name: "at a boundary the job moves for ≥15%", market: []providers.Offering{b1, c1}, nodes: []providers.Offering{b1, b1}, need: 1,
			boundary: true, migrate: true, wantGroup: "aws/us-west-2/us-west-2c", wantLaunch: []string{c1.Key(), c1.Key(), c1.Key()}},
		{name: "no price move to a group with a failure on file", market: []providers.Offering{b1, c1},
			recs:  map[string]state.OfferingRecord{c1.Key(): {Key: c1.Key(), UnavailableReason: "capacity#1: ICE", UnavailableUntil: t0.Add(-time.Minute)}},
			nodes: []providers.Offering{b1, b1}, need: 1, boundary: true, wantGroup: "aws/us-east-1/us-east-1b", wantLaunch: []string{b1.Key()}},
		{name: "zone cannot hold min: whole job moves", market: []providers.Offering{a1, a2, b1}, recs: merge(gone(a1), gone(a2)),
			nodes: []providers.Offering{a1}, need: 2, migrate: true,
			wantGroup: "aws/us-east-1/us-east-1b", wantLaunch: []string{b1.Key(), b1.Key(), b1.Key()}},
		{name: "excluded offering is not used", market: []providers.Offering{a1, a2}, nodes: []providers.Offering{a1, a1}, need: 1,
			exclude: []string{a1.Key()}, wantGroup: "aws/us-east-1/us-east-1a", wantLaunch: []string{a2.Key()}},
		{name: "on-demand only up to the limit, spot first", market: []providers.Offering{capped(a1, 1), odA}, need: 3,
			dec: Decision{Spot: true, OnDemand: true, OnDemandLimit: 1}, wantGroup: "aws/us-east-1/us-east-1a", wantLaunch: []string{a1.Key(), odA.Key()}},
		{name: "spot only ignores on-demand", market: []providers.Offering{capped(a1, 0), odA}, need: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fleet(2, 3)
			dec := tt.dec
			if !dec.Spot && !dec.OnDemand {
				dec = SpotOnly("test")
			}
			ex := map[string]bool{}
			for _, k := range tt.exclude {
				ex[k] = true
			}
			c := Choose(ChooseInput{Fleet: f, Offerings: tt.market, Records: tt.recs, Now: t0, Nodes: tt.nodes,
				Need: tt.need, Target: 3, Capacity: dec, Exclude: ex, AtBoundary: tt.boundary})
			if tt.wantGroup != "" && c.Group != tt.wantGroup {
				t.Fatalf("group = %q, want %q (%s)", c.Group, tt.wantGroup, c.Reason)
			}
			if strings.Join(keys(c.Launch), " ") != strings.Join(tt.wantLaunch, " ") {
				t.Fatalf("launch = %v, want %v (%s)", keys(c.Launch), tt.wantLaunch, c.Reason)
			}
			if c.Migrate != tt.migrate {
				t.Fatalf("migrate = %v (%s)", c.Migrate, c.Reason)
			}
		})
	}
}

func merge(ms ...map[string]state.OfferingRecord) map[string]state.OfferingRecord {
	out := map[string]state.OfferingRecord{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func TestChooseColocation(t *testing.T) {
	a := off("aws", "us-east-1a", "p4d", providers.Spot, 10, 1)
	b := off("aws", "us-east-1b", "p4d", providers.Spot, 10.5, 1)
	g := off("gcp", "us-central1a", "a3", providers.Spot, 11, 1)
	market := []providers.Offering{a, b, g}
	for _, tt := range []struct {
		colocate spec.Colocate
		want     string
		n        int
	}{
		{spec.ColocateZone, "", 0},                // no zone holds 2
		{spec.ColocateRegion, "aws/us-east-1", 2}, // the region does
		{spec.ColocateNone, "*", 3},
	} {
		f := fleet(2, 3)
		f.Placement.Colocate = tt.colocate
		c := Choose(ChooseInput{Fleet: f, Offerings: market, Now: t0, Need: 3, Target: 3, Capacity: SpotOnly("")})
		if c.Group != tt.want || len(c.Launch) != tt.n {
			t.Errorf("%s: group %q launch %d, want %q %d (%s)", tt.colocate, c.Group, len(c.Launch), tt.want, tt.n, c.Reason)
		}
	}
}

func TestDecideCapacity(t *testing.T) {
	f := fleet(2, 4)
	d, st := DecideCapacity(FallbackInput{Fleet: f, Now: t0, Live: 0})
	if d.OnDemand || st.BelowMinSince != t0 {
		t.Fatalf("first pass below min: %+v %+v", d, st)
	}
	d, st = DecideCapacity(FallbackInput{Fleet: f, State: st, Now: t0.Add(9 * time.Minute), Live: 1})
	if d.OnDemand || st.BelowMinSince != t0 {
		t.Fatalf("before D: %+v", d)
	}
	d, st = DecideCapacity(FallbackInput{Fleet: f, State: st, Now: t0.Add(10 * time.Minute), Live: 1})
	if !d.OnDemand || !d.Spot || d.OnDemandLimit != 1 || d.KeepOnDemand {
		t.Fatalf("after D: %+v", d)
	}
	if d2, _ := DecideCapacity(FallbackInput{Fleet: f, State: st, Now: t0.Add(10 * time.Minute), Live: 1, SpotViable: true}); d2.OnDemand {
		t.Fatalf("spot viable but on-demand allowed: %+v", d2)
	}
	_, st = DecideCapacity(FallbackInput{Fleet: f, State: st, Now: t0.Add(11 * time.Minute), Live: 2})
	if !st.BelowMinSince.IsZero() {
		t.Fatalf("state not reset at min")
	}

	never := fleet(2, 4)
	never.Placement.Fallback = spec.FallbackNever
	if d, _ := DecideCapacity(FallbackInput{Fleet: never, State: FallbackState{BelowMinSince: t0}, Now: t0.Add(time.Hour)}); d.OnDemand {
		t.Fatalf("never fell back: %+v", d)
	}
	od := fleet(2, 4)
	od.Node.Spot = false
	if d, _ := DecideCapacity(FallbackInput{Fleet: od, Now: t0}); d.Spot || !d.OnDemand || !d.KeepOnDemand || d.OnDemandLimit >= 0 {
		t.Fatalf("on-demand fleet: %+v", d)
	}

	dl := fleet(2, 4)
	dl.Placement.Fallback = spec.FallbackDeadline
	deadline := t0.Add(50 * time.Hour)
	dl.Deadline, dl.Work = &deadline, 50*time.Hour
	start := t0.Add(-50 * time.Hour) // halfway through the schedule: ep = 25h, 50h left
	for _, tt := range []struct {
		name           string
		done           time.Duration
		spot, odLive   bool
		wantOD, onlyOD bool
	}{
		{"ahead, no spot: wait", 30 * time.Hour, false, false, false, false},
		{"behind, no spot: on-demand", 20 * time.Hour, false, false, true, false},
		{"behind, spot available: spot", 20 * time.Hour, true, false, false, false},
		{"on on-demand, just caught up: hysteresis keeps it", 25 * time.Hour, true, true, true, false},
		{"on on-demand, well ahead: back to spot", 30 * time.Hour, true, true, false, false},
		{"safety net: 50h of work in 50h", 0, true, false, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			odn := 0
			if tt.odLive {
				odn = 2
			}
			d, _ := DecideCapacity(FallbackInput{Fleet: dl, Now: t0, Live: 2, OnDemandLive: odn, SpotViable: tt.spot,
				Progress: Progress{Start: start, Done: tt.done}, Changeover: 12 * time.Minute, Policy: UniformProgress{}})
			if d.OnDemand != tt.wantOD || (d.OnDemand && d.Spot == tt.onlyOD) {
				t.Fatalf("decision %+v", d)
			}
			if tt.wantOD && !d.KeepOnDemand {
				t.Fatalf("deadline on-demand must not be swapped away: %+v", d)
			}
		})
	}
}

// TestDecideCapacitySpotAdmission: deadline fleets whose policy admits
// spot (SpotAdmission) carry its threshold in the decision; other
// policies and fallback modes admit every offering.
func TestDecideCapacitySpotAdmission(t *testing.T) {
	dl := fleet(1, 1)
	dl.Placement.Fallback = spec.FallbackDeadline
	deadline := t0.Add(52 * time.Hour)
	dl.Deadline, dl.Work = &deadline, 48*time.Hour
	after := fleet(1, 1)
	d := 12 * time.Minute
	volatile := SlackValue(4*time.Hour-2*d-d/4, 48*time.Hour, d, 0.5)
	tests := []struct {
		name   string
		fleet  *spec.Fleet
		policy DeadlinePolicy
		odLive int
		want   time.Duration
	}{
		{"slack reserve, idle", dl, nil, 0, time.Duration(volatile * float64(d))},
		{"slack reserve, on on-demand", dl, SlackReserve{}, 1, time.Duration(volatile * float64(2*d))},
		{"uniform progress", dl, UniformProgress{}, 0, 0},
		{"after fallback", after, nil, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := FallbackInput{Fleet: tt.fleet, Now: t0, Live: tt.odLive, OnDemandLive: tt.odLive, ChangeRate: 0.5,
				Changeover: d, Policy: tt.policy, Progress: Progress{Start: t0}}
			got := MinSpotRun(in)
			dec, _ := DecideCapacity(in)
			if got != tt.want || dec.MinSpotRun != tt.want {
				t.Fatalf("MinSpotRun %s, decision %s, want %s", got, dec.MinSpotRun, tt.want)
			}
		})
	}
}
