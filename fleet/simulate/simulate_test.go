package simulate

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers/sim"
)

// TestSkippingIsExact: the driver skips reconcile passes that provably
// plan nothing; running a pass at every event and check gives the same
// runs.
func TestSkippingIsExact(t *testing.T) {
	for _, tc := range []struct {
		zones    []string
		deadline int
		warm     bool
	}{{nil, 60, false}, {[]string{"us-east-1c", "us-east-2b", "us-west-2a"}, 52, false}, {nil, 52, true}} {
		s := v100Setup(t, tc.zones, tc.deadline)
		s.Windows, s.Seed, s.Warm = 10, 3, tc.warm
		if tc.warm {
			s.Windows = 4 // the warm history is the only difference
		}
		pols, err := SelectPolicies([]string{"fleetd", "up", "greedy", "up-1z", "greedy-1z", "on-demand"})
		if err != nil {
			t.Fatal(err)
		}
		s.Policies = pols
		fast, err := s.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		s.Exhaustive = true
		slow, err := s.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		passes := [2]int{}
		for i := range fast {
			f, e := fast[i], slow[i]
			passes[0] += f.Passes
			passes[1] += e.Passes
			f.Passes, e.Passes = 0, 0
			if f != e {
				t.Errorf("%d zones %dh warm %v window %d %s: skipping %+v\nexhaustive %+v", len(s.market.Offers), tc.deadline, tc.warm, f.Window, f.Policy, f, e)
			}
		}
		t.Logf("%d zones %dh: %d passes skipping, %d exhaustive", len(s.market.Offers), tc.deadline, passes[0], passes[1])
	}
}

func runSetup(t *testing.T, s *Setup) []Result {
	t.Helper()
	res, err := s.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// allPolicies is every policy `fleetd sim` knows (a lookahead planner
// standing for every lookahead) and the rigid-gang DP.
func allPolicies(t *testing.T) []Policy {
	t.Helper()
	pols, err := SelectPolicies([]string{"optimum", "fleetd", "up", "greedy", "up-1z", "greedy-1z", "on-demand", "goodput", "fleetd-foresight", "lookahead-2h", "gang-dp"})
	if err != nil {
		t.Fatal(err)
	}
	return pols
}

// TestOptimumIsLowerBound: on the real trace, in every setting — one-node
// jobs in 9 and 3 zones with loose and tight deadlines, warm history, a
// checkpoint; elastic 8-node fleets with linear, near-linear, comm-bound
// and knee-shaped jobs; a rigid 4-node gang — the optimum is never above
// any policy's run on any window, and no policy misses a deadline. The
// rigid-gang DP (the optimum's figure before the fluid bound) is beaten
// by elastic and goodput runs: the check can fail, and did.
func TestOptimumIsLowerBound(t *testing.T) {
	three := []string{"us-east-1c", "us-east-2b", "us-west-2a"}
	knee, _ := ShapeByName("knee-4")
	near, _ := ShapeByName("near-linear")
	comm, _ := ShapeByName("comm-bound")
	gang := func(minN, maxN int, sh Shape) func(*testing.T) *Setup {
		return func(t *testing.T) *Setup {
			s := gangSetup(t, sh, 3)
			s.Fleet.MinNodes, s.Fleet.MaxNodes = minN, maxN
			return s
		}
	}
	for _, tc := range []struct {
		name    string
		setup   func(*testing.T) *Setup
		windows int
		// gangBeaten: some run costs less than the rigid-gang DP.
		gangBeaten bool
		// misses, when set, says why runs of this setting may miss the
		// deadline; a late run is held to the fluid bound with its own
		// completion time as the deadline.
		misses string
	}{
		{"1 node, 9 zones, 60h", func(t *testing.T) *Setup { return v100Setup(t, nil, 60) }, 8, false, ""},
		{"1 node, 9 zones, 52h", func(t *testing.T) *Setup { return v100Setup(t, nil, 52) }, 8, false, ""},
		{"1 node, 3 zones, 52h", func(t *testing.T) *Setup { return v100Setup(t, three, 52) }, 8, false, ""},
		{"1 node, warm history", func(t *testing.T) *Setup { s := v100Setup(t, nil, 52); s.Warm = true; return s }, 4, false, ""},
		{"1 node, 200 GB checkpoint", func(t *testing.T) *Setup {
			b := v100Block(nil)
			b["checkpoint_gb"], b["checkpoint_region"] = 200, "us-west-2"
			s := &Setup{Trace: loadV100(t), Fleet: testFleet(t, b), Seed: 1, Job: Job{Work: 48 * time.Hour, Deadline: 60 * time.Hour}}
			if err := s.Prepare(); err != nil {
				t.Fatal(err)
			}
			return s
		}, 4, false, "the baselines' safety net counts changeovers, not the 17 min restore of 200 GB"},
		{"elastic 1-8 nodes, linear", gang(1, 8, Shape{}), 3, false, ""},
		{"elastic 1-8 nodes, near-linear", gang(1, 8, near), 3, false, ""},
		{"elastic 1-8 nodes, comm-bound", gang(1, 8, comm), 3, true, ""},
		{"elastic 1-8 nodes, knee-4", gang(1, 8, knee), 3, true, ""},
		{"rigid 4-node gang, linear", gang(4, 4, Shape{}), 3, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.setup(t)
			s.Windows, s.Seed, s.Policies = tc.windows, 11, allPolicies(t)
			res := runSetup(t, s)
			opt, dp := map[int]float64{}, map[int]float64{}
			for _, r := range res {
				if r.Infeasible {
					t.Fatalf("%s: window %d infeasible", r.Policy, r.Window)
				}
				switch r.Policy {
				case "optimum":
					opt[r.Window] = r.Cost
				case "gang-dp":
					dp[r.Window] = r.Cost
				}
			}
			beaten := 0
			for _, r := range res {
				if r.Policy == "gang-dp" {
					continue
				}
				if r.Missed {
					if tc.misses == "" || r.Done != s.Job.Work {
						t.Errorf("%s missed the deadline in window %d (%s, done %s in %s)", r.Policy, r.Window, r.Start.Format(time.RFC3339), r.Done, r.Elapsed)
						continue
					}
					late := s.Job
					late.Deadline = r.Elapsed
					if b := fluidBound(s.market.Offers, r.Start, late, s.Fleet.MinNodes, s.Fleet.MaxNodes, s.Shape); r.Cost < b.Cost-1e-9 {
						t.Errorf("window %d: %s, done late in %s, costs %.4f, below the fluid bound %.4f for that time", r.Window, r.Policy, r.Elapsed, r.Cost, b.Cost)
					}
					continue
				}
				if r.Cost < opt[r.Window]-1e-9 {
					t.Errorf("window %d: %s costs %.4f, below the optimum %.4f", r.Window, r.Policy, r.Cost, opt[r.Window])
				}
				if r.Policy != "optimum" && r.Cost < dp[r.Window]-1e-9 {
					beaten++
					t.Logf("window %d: %s costs %.2f, below the rigid-gang DP's %.2f (optimum %.2f)", r.Window, r.Policy, r.Cost, dp[r.Window], opt[r.Window])
				}
			}
			if tc.gangBeaten && beaten == 0 {
				t.Errorf("no run beat the rigid-gang DP: the setting no longer shows why the optimum needs the fluid bound")
			}
			if s.Fleet.MaxNodes == 1 && beaten > 0 {
				t.Errorf("%d runs beat the DP of a one-node job, which is a lower bound there", beaten)
			}
		})
	}
}

// TestUniformProgressBeatsGreedy reproduces Can't Be Late's finding in one
// zone (job fraction 0.8): Uniform Progress costs less than greedy on
// average and runs more hours on spot.
func TestUniformProgressBeatsGreedy(t *testing.T) {
	s := v100Setup(t, nil, 60)
	s.Windows, s.Seed = 90, 5
	pols, err := SelectPolicies([]string{"up-1z", "greedy-1z"})
	if err != nil {
		t.Fatal(err)
	}
	s.Policies = pols
	sum := Summarize(pols, len(s.market.Offers), runSetup(t, s))
	up, greedy := sum[0], sum[1]
	t.Logf("UP: $%.2f, %.1f h spot, %.1f h on-demand; greedy: $%.2f, %.1f h spot, %.1f h on-demand", up.MeanCost, up.SpotHours, up.OnDemandHours, greedy.MeanCost, greedy.SpotHours, greedy.OnDemandHours)
	if up.MeanCost >= greedy.MeanCost {
		t.Errorf("UP mean cost %.2f ≥ greedy %.2f", up.MeanCost, greedy.MeanCost)
	}
	if up.SpotHours <= greedy.SpotHours {
		t.Errorf("UP spot hours %.1f ≤ greedy %.1f", up.SpotHours, greedy.SpotHours)
	}
	if up.Misses+greedy.Misses > 0 {
		t.Errorf("misses: UP %d, greedy %d", up.Misses, greedy.Misses)
	}
}

// TestAlwaysAvailableSpot: when spot never goes away, every spot policy
// (the lookahead planner, the goodput policy and the optimum too) pays
// the all-spot price plus one changeover, and on-demand the on-demand
// price plus one changeover.
func TestAlwaysAvailableSpot(t *testing.T) {
	dir := t.TempDir()
	manifest := `{"tick": "10m", "start": "2024-03-01T00:00:00Z", "defaults": {"spot_price": 1.25, "on_demand_price": 3.5, "gpu_type": "V100"}}`
	if err := os.WriteFile(filepath.Join(dir, sim.ManifestFile), []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, z := range []string{"r1-a", "r1-b"} {
		rows := "availability\n" + strings.Repeat("1\n", 24*6*10)
		if err := os.WriteFile(filepath.Join(dir, z+"_gpu.csv"), []byte(rows), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := sim.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := &Setup{Trace: tr, Fleet: testFleet(t, map[string]any{"trace": dir}), Seed: 2, Windows: 4,
		Policies: append(DefaultPolicies(), LookaheadPolicy("lookahead-1h", time.Hour), GoodputPolicy()),
		Job:      Job{Work: 48 * time.Hour, Deadline: 60 * time.Hour, Changeover: 12 * time.Minute, LaunchLatency: 2 * time.Minute}}
	if err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	hours := (s.Job.Work + s.Job.Changeover).Hours()
	for _, r := range runSetup(t, s) {
		want := hours * 1.25
		if r.Policy == "on-demand" {
			want = hours * 3.5
		}
		if math.Abs(r.Cost-want) > 1e-6 || r.Missed {
			t.Errorf("%s window %d: $%.6f (missed %v), want $%.6f", r.Policy, r.Window, r.Cost, r.Missed, want)
		}
		if r.Policy != "optimum" && (r.Restarts != 1 || r.Preemptions != 0 || r.Migrations != 0) {
			t.Errorf("%s: %d restarts, %d preemptions, %d migrations; want 1, 0, 0", r.Policy, r.Restarts, r.Preemptions, r.Migrations)
		}
	}
}
