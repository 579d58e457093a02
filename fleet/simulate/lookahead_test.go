package simulate

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestLookaheadPlanner runs the lookahead planner on random markets
// through the simulated market: whatever it knows ahead, it finishes
// every job in time (its tables are pessimistic and on-demand is always
// there) and pays at least the optimum's lower bound; knowing the whole
// window it pays less, over all cases, than knowing nothing ahead.
func TestLookaheadPlanner(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 3))
	var op optimizer
	feasible := 0
	sum := map[time.Duration]float64{}
	for i := range 60 {
		m, job, start := randomCase(t, rng)
		job.Deadline += job.Changeover // room for the pessimistic grid's rounding
		opt, err := op.solve(m.Offers, start, job, 1, 3)
		if err != nil {
			t.Fatal(err)
		}
		if !opt.Feasible {
			continue
		}
		if f := fluidBound(m.Offers, start, job, 1, 1, Shape{}); f.Cost > opt.Cost {
			opt = f
		}
		feasible++
		for _, h := range []time.Duration{job.Deadline, time.Hour, 10 * time.Minute, 0} {
			got, err := op.lookahead(m, start, job, 1, 3, "la", h, h/8)
			if err != nil {
				t.Fatal(err)
			}
			if got.Missed || got.Done != job.Work {
				t.Errorf("case %d, lookahead %v: missed (done %v of %v in %v, deadline %v)", i, h, got.Done, job.Work, got.Elapsed, job.Deadline)
			}
			if got.Cost < opt.Cost-1e-9 {
				t.Errorf("case %d, lookahead %v: cost %v below the optimum's bound %v", i, h, got.Cost, opt.Cost)
			}
			if got.Restarts == 0 || got.SpotHours+got.OnDemandHours < job.Work.Hours() {
				t.Errorf("case %d, lookahead %v: %d restarts, %.2f h billed for %.2f h of work", i, h, got.Restarts, got.SpotHours+got.OnDemandHours, job.Work.Hours())
			}
			if h == job.Deadline {
				sum[-1] += got.Cost
			} else if h == 0 {
				sum[0] += got.Cost
			}
		}
	}
	if feasible < 40 {
		t.Errorf("%d feasible cases: the check covers too little", feasible)
	}
	if sum[-1] >= sum[0] {
		t.Errorf("knowing the whole window costs $%.2f over all cases, knowing nothing ahead $%.2f", sum[-1], sum[0])
	}
}

// TestLookaheadOnTrace runs the planner through `fleetd sim`'s driver on
// the bundled trace: it finishes every job in time and pays at least the
// optimum's bound, and seeing further ahead pays less over the windows.
func TestLookaheadOnTrace(t *testing.T) {
	s := v100Setup(t, nil, 52)
	s.Windows, s.Seed = 6, 2
	pols, err := SelectPolicies([]string{"optimum", "lookahead-60h", "lookahead-0s"})
	if err != nil {
		t.Fatal(err)
	}
	s.Policies = pols
	res := runSetup(t, s)
	var full, none float64
	for i := 0; i+2 < len(res); i += 3 {
		opt := res[i]
		for _, r := range res[i+1 : i+3] {
			if r.Missed || r.Done != s.Job.Work || r.Cost < opt.Cost-1e-9 {
				t.Errorf("window %d: %s $%.4f (missed %v), optimum $%.4f", opt.Window, r.Policy, r.Cost, r.Missed, opt.Cost)
			}
		}
		full += res[i+1].Cost
		none += res[i+2].Cost
	}
	if full >= none {
		t.Errorf("lookahead-60h $%.2f over the windows, lookahead-0s $%.2f", full, none)
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
