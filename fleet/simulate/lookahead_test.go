package simulate

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestLookaheadPlanner pins the lookahead planner to the optimum at both
// ends: knowing the whole window it pays exactly the optimum's cost,
// re-planning as it goes; knowing less it never pays less, and it always
// finishes in time (on-demand is always there).
func TestLookaheadPlanner(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 3))
	var op optimizer
	feasible, dearer := 0, 0
	for i := range 60 {
		m, job, start := randomCase(t, rng)
		offs := m.Offers
		opt, err := op.solve(offs, start, job, 1, 3)
		if err != nil {
			t.Fatal(err)
		}
		if !opt.Feasible {
			continue
		}
		feasible++
		for _, tc := range []struct {
			horizon, every time.Duration
		}{{job.Deadline, 0}, {job.Deadline + time.Hour, 30 * time.Minute}} {
			got, undone, err := op.lookahead(offs, start, job, 1, 3, tc.horizon, tc.every)
			if err != nil {
				t.Fatal(err)
			}
			if undone > 0 || math.Abs(got.Cost-opt.Cost) > 1e-9 {
				t.Errorf("case %d, lookahead %v every %v: cost %v (%v undone), optimum %v", i, tc.horizon, tc.every, got.Cost, undone, opt.Cost)
			}
		}
		for _, h := range []time.Duration{0, 10 * time.Minute, time.Hour} {
			got, undone, err := op.lookahead(offs, start, job, 1, 3, h, 0)
			if err != nil {
				t.Fatal(err)
			}
			if undone > 0 {
				t.Errorf("case %d, lookahead %v: %v of work undone at the deadline", i, h, undone)
			}
			if got.Cost < opt.Cost-1e-9 {
				t.Errorf("case %d, lookahead %v: cost %v below the optimum %v", i, h, got.Cost, opt.Cost)
			}
			if got.Cost > opt.Cost+1e-9 {
				dearer++
			}
		}
	}
	if feasible < 40 || dearer == 0 {
		t.Errorf("%d feasible cases, %d dearer plans: the check covers too little", feasible, dearer)
	}
}

// TestLookaheadOnTrace runs the planner through `fleetd sim`'s driver on
// the bundled trace: knowing the whole window it matches the optimum
// window by window; knowing two hours it finishes every job in time and
// pays at least the optimum.
func TestLookaheadOnTrace(t *testing.T) {
	s := v100Setup(t, nil, 52)
	s.Windows, s.Seed = 6, 2
	pols, err := SelectPolicies([]string{"optimum", "lookahead-60h", "lookahead-2h"})
	if err != nil {
		t.Fatal(err)
	}
	s.Policies = pols
	res := runSetup(t, s)
	for i := 0; i+2 < len(res); i += 3 {
		opt, full, two := res[i], res[i+1], res[i+2]
		if full.Missed || full.Done != s.Job.Work || math.Abs(full.Cost-opt.Cost) > 1e-9 {
			t.Errorf("window %d: lookahead-60h $%.4f (missed %v), optimum $%.4f", opt.Window, full.Cost, full.Missed, opt.Cost)
		}
		if two.Missed || two.Cost < opt.Cost-1e-9 {
			t.Errorf("window %d: lookahead-2h $%.4f (missed %v), optimum $%.4f", opt.Window, two.Cost, two.Missed, opt.Cost)
		}
	}
}

func TestLookaheadPolicyNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		want time.Duration
		err  bool
	}{
		{"lookahead-2h", 2 * time.Hour, false},
		{"lookahead-0s", 0, false},
		{"lookahead-90m", 90 * time.Minute, false},
		{"lookahead-", 0, true},
		{"lookahead-2x", 0, true},
		{"lookahead--1h", 0, true},
	} {
		pols, err := SelectPolicies([]string{tc.name})
		if (err != nil) != tc.err {
			t.Errorf("%s: error %v, want error %v", tc.name, err, tc.err)
			continue
		}
		if err == nil && (len(pols) != 1 || !pols[0].Planner || pols[0].Lookahead != tc.want || pols[0].Name != tc.name) {
			t.Errorf("%s: %+v", tc.name, pols)
		}
	}
}
