package placement

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// Hand-made market histories for the zone-choice tests, as seen at t0.
func flakyRuns(key string) SpotSeen { // 12 runs ended in 24 h; up 30 min: expected run ≈ 2.7 h
	return SpotSeen{Key: key, Up: true, Since: t0.Add(-30 * time.Minute), Ends: 12, UpSeconds: 24 * 3600}
}
func fairRuns(key string) SpotSeen { // 2 runs ended in 16 h; up 2 h: expected run 9 h
	return SpotSeen{Key: key, Up: true, Since: t0.Add(-2 * time.Hour), Ends: 2, UpSeconds: 16 * 3600}
}
func stableRuns(key string) SpotSeen { // up for 3 days: expected run 44 h
	return SpotSeen{Key: key, Up: true, Since: t0.Add(-72 * time.Hour)}
}

// TestZoneChoiceByExpectedCost pins the zone-choice rule: when several
// zones have spot, they are ranked by price plus the expected cost of
// interruptions there, from each zone's observed up-runs and the slack an
// interruption costs. A cheap zone preempted every few hours loses to a
// slightly dearer one that stays up for days; a cheap zone that is only
// somewhat less stable wins while slack is to spare (a short job), and
// loses when the slack is worth something (a long job with the same
// slack).
func TestZoneChoiceByExpectedCost(t *testing.T) {
	cheap := off("aws", "us-east-1a", "p4d", providers.Spot, 8.00, 1) // $1.00/GPU-h
	dear := off("aws", "us-east-1b", "p4d", providers.Spot, 8.32, 1)  // $1.04/GPU-h
	d := DefaultInterruptionCost
	// The slack value of a long and a short job with the same 3 h of
	// slack in a market whose runs end 0.3 times an hour.
	worth := func(work time.Duration) float64 {
		return SlackReserve{}.SlackWorth(DeadlineInput{Now: t0, Start: t0, Deadline: t0.Add(work + 3*time.Hour),
			Work: work, Changeover: d, ChangeRate: 0.3})
	}
	long, short := worth(48*time.Hour), worth(3*time.Hour)
	if short > 1e-6 || long < 1 {
		t.Fatalf("slack value: short job %g (want ≈ 0), long job %g (want > 1)", short, long)
	}
	outlook := func(cheapSeen SpotSeen, lambda float64) Outlook {
		return Outlook{Spot: []SpotSeen{cheapSeen, stableRuns(dear.Key())}, Lead: DefaultNoticeLead, SlackValue: lambda, OnDemandPerGPU: 3.06}
	}
	tests := []struct {
		name  string
		model Model
		out   Outlook
		want  string
	}{
		{"no market history: the cheaper", Model{}, Outlook{}, cheap.Zone},
		{"flaky cheap vs stable dear", Model{}, outlook(flakyRuns(cheap.Key()), 0), dear.Zone},
		{"price only (the baselines): the cheaper", Model{PriceOnly: true}, outlook(flakyRuns(cheap.Key()), 0), cheap.Zone},
		{"fairly stable cheap, short job: the cheaper", Model{}, outlook(fairRuns(cheap.Key()), short), cheap.Zone},
		{"fairly stable cheap, long job: the stabler", Model{}, outlook(fairRuns(cheap.Key()), long), dear.Zone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch := Choose(ChooseInput{Fleet: fleet(1, 1), Offerings: []providers.Offering{cheap, dear}, Now: t0, Model: tt.model,
				Need: 1, Capacity: SpotOnly("test"), Outlook: tt.out})
			if len(ch.Launch) != 1 || ch.Launch[0].Zone != tt.want {
				t.Fatalf("launch %v, want %s; candidates %+v", keys(ch.Launch), tt.want, ch.Candidates)
			}
		})
	}

	// The figures: score = p + (1/expected run)·(p·(c + lead) + λ·c·(od − p)).
	out := outlook(fairRuns(cheap.Key()), long)
	out.Now = t0
	c := DefaultModel().EvaluateIn(cheap, state.OfferingRecord{}, "", out)
	er := 8 + 1.0 // m = (16 h + 8 h)/3, plus half the 2 h age
	want := 1 + (1/er)*(1*(d.Hours()+DefaultNoticeLead.Hours())+long*d.Hours()*(3.06-1))
	if math.Abs(c.ExpectedRun-er) > 1e-9 || math.Abs(c.Rate-1/er) > 1e-12 || math.Abs(c.Score-want) > 1e-9 || math.Abs(c.InterruptionCost-(want-1)) > 1e-9 {
		t.Fatalf("figures %+v, want expected run %g h, rate %g, score %g", c, er, 1/er, want)
	}
	if e := Explain(c); !strings.Contains(e, "expected up-run 9.0 h") || !strings.Contains(e, "per useful GPU-hour") {
		t.Fatalf("Explain = %q", e)
	}
}

// TestOverpriced: while the slack allows waiting, spot dearer than the
// market's best (up, or gone less than MarketPriorHours ago) by more than
// the premium is not started; capacity gone for long does not set the
// bar, and the fleet's own nodes are never excluded.
func TestOverpriced(t *testing.T) {
	f := fleet(1, 1)
	best := off("aws", "us-east-1a", "p4d", providers.Spot, 8.0, 0)   // gone 1 h ago
	near := off("aws", "us-east-1b", "p4d", providers.Spot, 8.3, 1)   // +3.75 %
	far := off("aws", "us-east-1c", "p4d", providers.Spot, 9.0, 1)    // +12.5 %
	lost := off("aws", "us-east-1d", "p4d", providers.Spot, 6.0, 0)   // gone 20 h ago
	od := off("aws", "us-east-1a", "p4d", providers.OnDemand, 30, -1) // never
	seen := []SpotSeen{
		{Key: best.Key(), Since: t0.Add(-time.Hour), Ends: 1, UpSeconds: 30 * 3600},
		{Key: near.Key(), Up: true, Since: t0.Add(-31 * time.Hour), Ends: 1, UpSeconds: 30 * 3600},
		{Key: far.Key(), Up: true, Since: t0.Add(-31 * time.Hour), Ends: 1, UpSeconds: 30 * 3600},
		{Key: lost.Key(), Since: t0.Add(-20 * time.Hour), Ends: 1, UpSeconds: 30 * 3600},
	}
	offs := []providers.Offering{best, near, far, lost, od}
	out := Outlook{Now: t0, Spot: seen}
	tests := []struct {
		name    string
		premium float64
		keep    map[string]bool
		want    []string
	}{
		{"5 %", 0.05, nil, []string{far.Key()}},
		{"own node kept", 0.05, map[string]bool{far.Key(): true}, nil},
		{"20 %", 0.20, nil, nil},
		{"no premium asked", 0, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Overpriced(f, offs, nil, Model{}, out, tt.premium, tt.keep)
			if len(got) != len(tt.want) {
				t.Fatalf("overpriced %v, want %v", got, tt.want)
			}
			for _, k := range tt.want {
				if !got[k] {
					t.Fatalf("overpriced %v, want %v", got, tt.want)
				}
			}
		})
	}
}

// TestMaxPremium: SlackReserve waits for cheaper spot only while its slack
// is above the level at which it waits when no spot is offered, and not
// while on-demand nodes run (their alternative is on-demand, not waiting).
func TestMaxPremium(t *testing.T) {
	d := 12 * time.Minute
	at := func(left, slack time.Duration, od bool) DeadlineInput {
		return DeadlineInput{Now: t0, Deadline: t0.Add(left + slack), Work: left, Changeover: d, OnDemandActive: od}
	}
	tests := []struct {
		name string
		p    SlackReserve
		in   DeadlineInput
		want float64
	}{
		{"60 h deadline, 48 h work", SlackReserve{}, at(48*time.Hour, 12*time.Hour, false), DefaultMaxPremium},
		{"52 h deadline: slack below safety + reserve", SlackReserve{}, at(48*time.Hour, 4*time.Hour, false), 0},
		{"late in a 52 h job: the reserve shrank", SlackReserve{}, at(20*time.Hour, 3*time.Hour, false), DefaultMaxPremium},
		{"on on-demand", SlackReserve{}, at(48*time.Hour, 12*time.Hour, true), 0},
		{"custom premium", SlackReserve{Premium: 0.1}, at(48*time.Hour, 12*time.Hour, false), 0.1},
		{"premium waiting off", SlackReserve{Premium: -1}, at(48*time.Hour, 12*time.Hour, false), 0},
		{"work done", SlackReserve{}, at(0, 12*time.Hour, false), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.MaxPremium(tt.in); got != tt.want {
				t.Fatalf("MaxPremium = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestCarrySpot: a new fleet starts from what earlier fleets saw. Ended
// runs carry over and shape ExpectedRun; ChangeRate counts only what the
// fleet itself sees; the current state carries over only while fresh,
// else the fleet's first look starts it (without counting an end).
func TestCarrySpot(t *testing.T) {
	f := fleet(1, 1)
	a := off("aws", "us-east-1a", "p4d", providers.Spot, 8, 1)
	h := []SpotSeen{{Key: a.Key(), Up: true, Since: t0.Add(-4 * time.Hour), Ends: 9, UpSeconds: 22 * 3600}}
	m := (22.0 + MarketPriorHours) / 10

	fresh := CarrySpot(h, t0, t0.Add(time.Minute), 2*time.Minute)
	if s := fresh[0]; !s.Up || !s.Since.Equal(h[0].Since) || s.CarriedEnds != 9 || s.CarriedUpSeconds != 22*3600 {
		t.Fatalf("fresh carry %+v", s)
	}
	now := t0.Add(time.Minute)
	if got, want := ExpectedRun(a, fresh, state.OfferingRecord{}, now).Hours(), m+(4+1.0/60)/2; math.Abs(got-want) > 1e-9 {
		t.Fatalf("expected run from carried history %g h, want %g h", got, want)
	}
	// Only the fleet's own observations (none yet: the prior) and the
	// current run's minute count for the change rate.
	if got, want := ChangeRate(fresh, nil, now), 1/(MarketPriorHours+4+1.0/60); math.Abs(got-want) > 1e-12 {
		t.Fatalf("change rate %g, want %g", got, want)
	}

	stale := CarrySpot(h, t0, t0.Add(time.Hour), 2*time.Minute)
	if s := stale[0]; s.Up || !s.Since.IsZero() || s.Ends != 9 {
		t.Fatalf("stale carry %+v", s)
	}
	// Unknown state: the age is unknown too (a mean run, like a first look).
	if got, want := ExpectedRun(a, stale, state.OfferingRecord{}, t0.Add(time.Hour)).Hours(), m+m/2; math.Abs(got-want) > 1e-9 {
		t.Fatalf("expected run with the state unknown %g h, want %g h", got, want)
	}
	look := ObserveSpot(stale, f, []providers.Offering{a}, nil, t0.Add(time.Hour))
	if s := look[0]; !s.Up || !s.First || !s.Since.Equal(t0.Add(time.Hour)) || s.Ends != 9 || s.CarriedEnds != 9 {
		t.Fatalf("first look at carried history %+v", s)
	}
	if CarrySpot(nil, t0, t0, time.Minute) != nil {
		t.Fatal("nothing to carry")
	}
}

// TestForecastReplacesHistory: an outlook's Forecast (fleetd sim's
// foresight bound) is what ExpectedRun and the ranking read, for zones
// the market history knows and for zones it does not; without one, or
// for a key it does not know, the history and the prior decide.
func TestForecastReplacesHistory(t *testing.T) {
	cheap := off("aws", "us-east-1a", "p4d", providers.Spot, 8.00, 1) // $1.00/GPU-h
	dear := off("aws", "us-east-1b", "p4d", providers.Spot, 8.32, 1)  // $1.04/GPU-h
	ends := map[string]time.Duration{cheap.Key(): 30 * time.Minute, dear.Key(): 100 * time.Hour}
	forecast := func(key string, now time.Time) (time.Duration, bool) {
		d, ok := ends[key]
		return d, ok
	}
	m := DefaultModel()
	for _, tc := range []struct {
		name     string
		seen     []SpotSeen
		forecast RunForecast
		// wantCheap, wantDear are the expected runs; best the cheaper
		// Score.
		wantCheap, wantDear time.Duration
		best                providers.Offering
	}{
		{name: "prior only", wantCheap: 12 * time.Hour, wantDear: 12 * time.Hour, best: cheap},
		{name: "history: both stable", seen: []SpotSeen{stableRuns(cheap.Key()), stableRuns(dear.Key())},
			wantCheap: 44 * time.Hour, wantDear: 44 * time.Hour, best: cheap},
		{name: "forecast, no history", forecast: forecast, wantCheap: 30 * time.Minute, wantDear: 100 * time.Hour, best: dear},
		{name: "forecast over history", seen: []SpotSeen{stableRuns(cheap.Key()), stableRuns(dear.Key())}, forecast: forecast,
			wantCheap: 30 * time.Minute, wantDear: 100 * time.Hour, best: dear},
		{name: "forecast without the key", seen: []SpotSeen{stableRuns(cheap.Key())},
			forecast: func(string, time.Time) (time.Duration, bool) { return 0, false }, wantCheap: 44 * time.Hour, wantDear: 12 * time.Hour, best: cheap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := Outlook{Now: t0, Spot: tc.seen, Forecast: tc.forecast}
			for _, c := range []struct {
				o    providers.Offering
				want time.Duration
			}{{cheap, tc.wantCheap}, {dear, tc.wantDear}} {
				if got := out.ExpectedRun(c.o, state.OfferingRecord{}); got != c.want {
					t.Errorf("ExpectedRun(%s) = %s, want %s", c.o.Zone, got, c.want)
				}
			}
			a := m.EvaluateIn(cheap, state.OfferingRecord{}, "", out)
			b := m.EvaluateIn(dear, state.OfferingRecord{}, "", out)
			best := cheap
			if b.Score < a.Score {
				best = dear
			}
			if best.Key() != tc.best.Key() {
				t.Errorf("best %s (scores %.4f, %.4f), want %s", best.Zone, a.Score, b.Score, tc.best.Zone)
			}
			if tc.forecast != nil {
				if want := 1 / tc.wantCheap.Hours(); math.Abs(a.Rate-want) > 1e-9 {
					t.Errorf("cheap rate %.4f/h, want 1/forecast = %.4f", a.Rate, want)
				}
			}
		})
	}
}
