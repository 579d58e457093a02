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

// TestOptimumIsLowerBound: on the real trace, the optimum is never above
// any policy on any window, and no policy misses a deadline.
func TestOptimumIsLowerBound(t *testing.T) {
	three := []string{"us-east-1c", "us-east-2b", "us-west-2a"}
	for _, tc := range []struct {
		zones    []string
		deadline int
	}{{nil, 60}, {nil, 52}, {three, 52}} {
		s := v100Setup(t, tc.zones, tc.deadline)
		s.Windows, s.Seed = 15, 11
		res := runSetup(t, s)
		opt := map[int]float64{}
		for _, r := range res {
			if r.Policy == "optimum" {
				if r.Infeasible {
					t.Fatalf("window %d infeasible", r.Window)
				}
				opt[r.Window] = r.Cost
			}
		}
		for _, r := range res {
			if r.Missed {
				t.Errorf("%d zones %dh: %s missed the deadline in window %d (%s, done %s in %s)", len(s.market.Offers), tc.deadline, r.Policy, r.Window, r.Start.Format(time.RFC3339), r.Done, r.Elapsed)
			}
			if r.Cost < opt[r.Window]-1e-9 {
				t.Errorf("%d zones %dh window %d: %s costs %.4f, below the optimum %.4f", len(s.market.Offers), tc.deadline, r.Window, r.Policy, r.Cost, opt[r.Window])
			}
		}
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
// (and the optimum) pays the all-spot price plus one changeover, and
// on-demand the on-demand price plus one changeover.
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
		Job: Job{Work: 48 * time.Hour, Deadline: 60 * time.Hour, Changeover: 12 * time.Minute, LaunchLatency: 2 * time.Minute}}
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
