package autoscale

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/rendezvous"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// history builds a tracker with one 60-second observation per (nodes,
// rate) pair, in rounds 1, 2, …
func history(pairs ...[2]float64) *Tracker {
	tr := &Tracker{}
	for i, p := range pairs {
		tr.History = append(tr.History, Observation{Round: i + 1, Nodes: int(p[0]), WorldSize: int(p[0]), SamplesPerSec: p[1], Seconds: 60,
			At: t0.Add(time.Duration(i) * time.Minute)})
	}
	if len(pairs) > 0 {
		last := pairs[len(pairs)-1]
		tr.Latest = &Latest{Round: len(pairs), Nodes: int(last[0]), SamplesPerSec: last[1], At: t0}
	}
	return tr
}

func TestDecide(t *testing.T) {
	prices := []float64{0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.35}
	settled := State{Target: 4, ChangedAt: t0.Add(-time.Hour), ChangedRound: 0}
	cases := []struct {
		name        string
		in          Input
		want        int
		reason      string
		explain     []string // substrings
		wantChanged bool
	}{
		{name: "desired_nodes pins the size",
			in:   Input{Min: 2, Max: 4, Desired: 3, Tracker: history([2]float64{4, 400})},
			want: 3, reason: "pinned", explain: []string{"desired_nodes pins 3 nodes"}},
		{name: "scale = max aims at max_nodes",
			in:   Input{Min: 2, Max: 4, Policy: Max, Tracker: history([2]float64{2, 400})},
			want: 4, reason: "max", explain: []string{`placement.scale = "max": 4 nodes`}},
		{name: "min = max leaves nothing to choose",
			in:   Input{Min: 3, Max: 3, Tracker: history([2]float64{3, 400})},
			want: 3, reason: "fixed"},
		{name: "before any report: max_nodes",
			in:   Input{Min: 2, Max: 4},
			want: 4, reason: "starting", explain: []string{"until the workers' progress reports"}},
		{name: "no reports after minutes of training: max_nodes by round timing",
			in:   Input{Now: t0, Min: 2, Max: 4, Round: Round{Number: 3, Closed: true, Nodes: 4, ClosedAt: t0.Add(-10 * time.Minute)}},
			want: 4, reason: "no-reports", explain: []string{"reported no progress in 10m0s", "round timing", "FLEETD_PROGRESS"}},
		{name: "only max measured: try half, it may cost less per sample",
			in:   Input{Now: t0, Min: 2, Max: 4, State: settled, Tracker: history([2]float64{4, 400})},
			want: 2, reason: "exploring", explain: []string{"trying 2 nodes", "may cost up to 50% less per sample"}, wantChanged: true},
		{name: "throughput flat beyond 2 nodes: settle at 2",
			in:   Input{Now: t0, Min: 2, Max: 4, State: settled, Prices: prices, Tracker: history([2]float64{4, 400}, [2]float64{2, 400})},
			want: 2, reason: "goodput", explain: []string{"2 nodes: 400 samples/s at $0.70/h; 4 would add no throughput for 100% more cost"}, wantChanged: true},
		{name: "linear scaling: max_nodes",
			in:   Input{Now: t0, Min: 2, Max: 4, State: settled, Prices: prices, Tracker: history([2]float64{4, 400}, [2]float64{2, 200})},
			want: 4, reason: "goodput", explain: []string{"4 nodes: 400 samples/s at $1.40/h (max_nodes); 2 would cost the same per sample and lose 50% throughput"}},
		{name: "the issue's example: 8 adds 6% for 33% more cost",
			in: Input{Now: t0, Min: 2, Max: 8, State: State{Target: 8, ChangedAt: t0.Add(-time.Hour)}, Prices: prices,
				Tracker: history([2]float64{8, 4346}, [2]float64{4, 3000}, [2]float64{6, 4100})},
			want: 6, reason: "goodput", explain: []string{"6 nodes: 4.1k samples/s at $2.10/h; 8 would add 6% throughput for 33% more cost"}, wantChanged: true},
		{name: "sub-linear but within tolerance: the fastest",
			in:   Input{Now: t0, Min: 2, Max: 4, State: settled, Prices: prices, Tracker: history([2]float64{4, 380}, [2]float64{2, 200})},
			want: 4, reason: "goodput"},
		{name: "a new size is measured before it is judged",
			in: Input{Now: t0, Min: 2, Max: 4, State: State{Target: 2, ChangedAt: t0.Add(-time.Minute), ChangedRound: 1},
				Tracker: history([2]float64{4, 400})},
			want: 2, reason: "measuring", explain: []string{"measuring 2 nodes (0s of 1m0s measured)"}},
		{name: "changes wait for min_interval",
			in: Input{Now: t0, Min: 2, Max: 4, State: State{Target: 4, ChangedAt: t0.Add(-time.Minute)}, Prices: prices,
				Tracker: history([2]float64{4, 400}, [2]float64{2, 400})},
			want: 4, reason: "holding", explain: []string{"4 nodes until 12:02:00Z (min_interval), then 2"}},
		{name: "hysteresis: not worth a restart",
			in: Input{Now: t0, Min: 2, Max: 4, State: State{Target: 2, ChangedAt: t0.Add(-time.Hour)}, Prices: prices,
				Tracker: history([2]float64{4, 412}, [2]float64{2, 400}, [2]float64{3, 405})},
			want: 2, reason: "goodput"},
		{name: "one size known, larger untried: linear optimism explores up, doubling at most",
			in:   Input{Now: t0, Min: 1, Max: 16, State: State{Target: 2, ChangedAt: t0.Add(-time.Hour)}, Prices: prices, Tracker: history([2]float64{2, 100})},
			want: 4, reason: "exploring", explain: []string{"trying 4 nodes", "may add up to"}, wantChanged: true},
		{name: "one size known at max: halve at most",
			in:   Input{Now: t0, Min: 1, Max: 16, State: State{Target: 16, ChangedAt: t0.Add(-time.Hour)}, Prices: prices, Tracker: history([2]float64{16, 800})},
			want: 8, reason: "exploring", wantChanged: true},
		{name: "interruptions make a big gang less useful",
			in: Input{Now: t0, Min: 2, Max: 8, State: State{Target: 8, ChangedAt: t0.Add(-time.Hour)}, Prices: prices,
				Rate: 4.0 / 3, Changeover: 10 * time.Minute, // 1.33 per node-hour, 10 minutes each: useful 1/(1+0.222n)
				Tracker: history([2]float64{8, 800}, [2]float64{4, 400}, [2]float64{2, 200})},
			want: 4, reason: "goodput", wantChanged: true},
		{name: "deadline: the cheapest size that finishes in time",
			in: Input{Now: t0, Min: 2, Max: 4, State: settled, Prices: prices, Deadline: t0.Add(8*time.Hour + 30*time.Minute), WorkLeft: 400 * 3600 * 6,
				Changeover: 10 * time.Minute, Tracker: history([2]float64{4, 400}, [2]float64{2, 300}, [2]float64{3, 360})},
			want: 3, reason: "deadline", explain: []string{"3 nodes: the cheapest size that finishes by 2026-03-01 20:30Z", "2 would need 8h0m0s"}, wantChanged: true},
		{name: "deadline no size makes: the fastest",
			in: Input{Now: t0, Min: 2, Max: 4, State: State{Target: 2, ChangedAt: t0.Add(-time.Hour)}, Prices: prices, Deadline: t0.Add(time.Hour), WorkLeft: 400 * 3600 * 6,
				Tracker: history([2]float64{4, 400}, [2]float64{2, 300})},
			want: 4, reason: "deadline-late", explain: []string{"no size finishes by"}, wantChanged: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.in.Now.IsZero() {
				c.in.Now = t0
			}
			d := Decide(c.in)
			if d.Target != c.want || d.Reason != c.reason {
				t.Errorf("Decide = %d (%s), want %d (%s): %s\noptions %+v", d.Target, d.Reason, c.want, c.reason, d.Explain, d.Options)
			}
			for _, sub := range c.explain {
				if !strings.Contains(d.Explain, sub) {
					t.Errorf("explanation %q lacks %q", d.Explain, sub)
				}
			}
			if d.Changed != c.wantChanged {
				t.Errorf("Changed = %v, want %v", d.Changed, c.wantChanged)
			}
			if d.Target < max(c.in.Min, 1) || d.Target > c.in.Max {
				t.Errorf("target %d outside [%d, %d]", d.Target, c.in.Min, c.in.Max)
			}
			if d.State.Target != d.Target {
				t.Errorf("state keeps %d, decided %d", d.State.Target, d.Target)
			}
		})
	}
}

// TestDecideConverges runs the decision against jobs whose throughput
// follows a curve, measuring whatever size it picks, until it stops
// changing: a job that stops scaling at 2 nodes settles at 2, one that
// scales settles at max_nodes.
func TestDecideConverges(t *testing.T) {
	flat2 := func(n int) float64 { return 100 * float64(min(n, 2)) }
	linear := func(n int) float64 { return 100 * float64(n) }
	// The model's own form, y = A + B(N−1): the marginal efficiency of
	// n → n+1 is (1−k)/(1+kn) with k = B/A.
	bends := func(k float64) func(int) float64 {
		return func(n int) float64 { return 100 * float64(n) / (1 + k*float64(n-1)) }
	}
	cases := []struct {
		name     string
		min, max int
		curve    func(int) float64
		// The settled size is in [want, upTo]: hysteresis may keep a size
		// whose step's marginal efficiency is within 0.05 of the threshold.
		want, upTo int
		maxSteps   int
	}{
		{"flat beyond 2, min 2 max 4", 2, 4, flat2, 2, 2, 3},
		{"linear, min 2 max 4", 2, 4, linear, 4, 4, 3},
		{"linear, min 1 max 16", 1, 16, linear, 16, 16, 6},
		{"bends early (k = 0.5), min 1 max 16", 1, 16, bends(0.5), 1, 1, 6},
		// k = 0.09: the step n → n+1 passes 0.5 up to n = 9 (0.503), 0.55 up to 7.
		{"bends at 10 (k = 0.09), min 1 max 16", 1, 16, bends(0.09), 8, 10, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := &Tracker{}
			st := State{}
			now := t0
			round := 0
			changes := 0
			var d Decision
			for step := 0; step < 40; step++ {
				d = Decide(Input{Now: now, Min: c.min, Max: c.max, State: st, Tracker: tr, Round: Round{Number: round, Closed: true, Nodes: st.Target}})
				if d.Changed {
					changes++
				}
				st = d.State
				// The fleet runs the target for a while: a new round, measured.
				round++
				now = now.Add(5 * time.Minute)
				tr.Observe(now, Round{Number: round, Closed: true, Nodes: d.Target, WorldSize: d.Target}, &Report{ReceivedAt: now,
					Progress: progressAt(round, d.Target, c.curve(d.Target))})
			}
			t.Logf("settled at %d after %d changes: %s", d.Target, changes, d.Explain)
			if d.Target < c.want || d.Target > c.upTo {
				t.Errorf("settled at %d (%s: %s), want %d..%d", d.Target, d.Reason, d.Explain, c.want, c.upTo)
			}
			if changes > c.maxSteps {
				t.Errorf("%d size changes, want at most %d", changes, c.maxSteps)
			}
		})
	}
}

func progressAt(round, nodes int, rate float64) rendezvous.Progress {
	return rendezvous.Progress{Round: round, Nodes: nodes, WorldSize: nodes, Step: int64(round * 100), Samples: float64(round) * 1e5,
		SamplesPerSec: rate, StepsPerSec: rate / 64, RateSeconds: 120, Reports: 50}
}

func TestFit(t *testing.T) {
	// y = 0.01 + 0.002·(N−1): X(1)=100, X(2)=166.7, X(4)=250.
	pts := []Point{{1, 100, 60}, {2, 2 / 0.012, 60}, {4, 4 / 0.016, 60}}
	m, ok := Fit(pts)
	if !ok || m.Fixed {
		t.Fatalf("fit: %+v %v", m, ok)
	}
	if math.Abs(m.A-0.01) > 1e-9 || math.Abs(m.B-0.002) > 1e-9 {
		t.Errorf("A, B = %g, %g; want 0.01, 0.002", m.A, m.B)
	}
	if x, _ := m.Throughput(8); math.Abs(x-8/0.024) > 1e-6 {
		t.Errorf("X(8) = %g, want %g", x, 8/0.024)
	}
	if e := m.Efficiency(4); math.Abs(e-0.625) > 1e-9 {
		t.Errorf("efficiency at 4 = %g, want 0.625", e)
	}
	lo, hi, _ := m.Bounds(8, 2)
	if x, _ := m.Throughput(8); !(lo < x && x < hi) {
		t.Errorf("bounds %g..%g do not hold the prediction %g", lo, hi, x)
	}
	// One size: fixed, predicts only there.
	m1, _ := Fit([]Point{{4, 400, 30}, {4, 380, 30}})
	if !m1.Fixed {
		t.Fatal("one size should give a fixed model")
	}
	if _, ok := m1.Throughput(2); ok {
		t.Error("a fixed model predicted another size")
	}
	if x, ok := m1.Throughput(4); !ok || math.Abs(x-4/((4.0/400+4.0/380)/2)) > 1e-9 {
		t.Errorf("X(4) = %g", x)
	}
	// Superlinear noise clamps to linear.
	m2, _ := Fit([]Point{{1, 100, 60}, {2, 210, 60}})
	if m2.B != 0 {
		t.Errorf("B = %g, want 0 (clamped)", m2.B)
	}
	if _, ok := Fit([]Point{{0, 1, 1}, {2, -1, 1}, {2, 5, 0}}); ok {
		t.Error("fitted unusable points")
	}
}

func TestTracker(t *testing.T) {
	tr := &Tracker{}
	now := t0
	cur := Round{Number: 3, Closed: true, Nodes: 2, WorldSize: 4, InstanceType: "p3.2xlarge"}
	rep := func(round int, step, first int64, rate, secs float64, reports int, age time.Duration) *Report {
		return &Report{ReceivedAt: now, Progress: rendezvous.Progress{Round: round, Nodes: 2, WorldSize: 4, Step: step, FirstStep: first, Samples: float64(step) * 64,
			SamplesPerSec: rate, StepsPerSec: rate / 64, RateSeconds: secs, Reports: reports, AgeMS: age.Milliseconds(), FirstAgeMS: (5 * time.Second).Milliseconds(), TotalSteps: 1000}}
	}
	if s := tr.Observe(now, cur, rep(3, 100, 100, 0, 0, 1, 0)); s == nil || s.HadPrev || s.Round != 3 || !s.At.Equal(now.Add(-5*time.Second)) {
		t.Fatalf("first report: start %+v", s)
	}
	if len(tr.History) != 0 {
		t.Fatalf("a single report made an observation: %+v", tr.History)
	}
	now = now.Add(10 * time.Second)
	if s := tr.Observe(now, cur, rep(3, 150, 100, 640, 8, 10, time.Second)); s != nil {
		t.Fatalf("same round reported a start: %+v", s)
	}
	if len(tr.History) != 1 || tr.History[0].SamplesPerSec != 640 || tr.History[0].InstanceType != "p3.2xlarge" || tr.History[0].Nodes != 2 {
		t.Fatalf("history %+v", tr.History)
	}
	eta, ok := tr.ETA()
	if want := now.Add(-time.Second).Add(85 * time.Second); !ok || !eta.Equal(want) {
		t.Errorf("ETA %v, want %v", eta, want)
	}
	// The next round resumes at 140: 10 steps lost.
	now = now.Add(10 * time.Second)
	cur.Number = 4
	s := tr.Observe(now, cur, rep(4, 141, 140, 0, 0, 1, 0))
	if s == nil || !s.HadPrev || s.PrevStep != 150 || s.LostSteps != 10 {
		t.Fatalf("round start %+v", s)
	}
	if got := tr.MeasuredAfter(3); got != 0 {
		t.Errorf("measured after round 3: %g", got)
	}
	if got := tr.MeasuredAfter(2); got != 8 {
		t.Errorf("measured after round 2: %g", got)
	}
	if len(tr.Series) < 2 {
		t.Errorf("series %+v", tr.Series)
	}
}
