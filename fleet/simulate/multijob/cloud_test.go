package multijob

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers/sim"
)

// cloudConfig is the linear and flat applications on the hand-made
// trace: one zone whose spot (2 nodes at scale 2, $1/h) is gone from
// 2 h to 4 h.
func cloudConfig(t *testing.T, jobs []Job, budget float64) Config {
	t.Helper()
	apps, err := LoadApps(filepath.Join("testdata", "apps"))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := sim.Load(filepath.Join("testdata", "trace"))
	if err != nil {
		t.Fatal(err)
	}
	return Config{Apps: apps, Jobs: jobs, Nodes: 1, PerNode: 8,
		Cloud: &Cloud{Trace: tr, Scale: 2, BudgetPerHour: budget}}
}

// TestCloudMarket pins the market on one long job asking for 4 GPUs:
// spot supplies them (scale 4), and they are preempted when the zone's capacity
// goes; the daemon's fallback buys one on-demand node after 10 minutes
// below min_nodes, replaced by spot when it returns; every $ is a
// node-hour at its price.
func TestCloudMarket(t *testing.T) {
	jobs := []Job{{Name: "long", App: "linear", Replicas: 4, Batch: 32}} // at most 4 GPUs (8 samples per GPU)
	for _, p := range CloudPolicies {
		cfg := cloudConfig(t, jobs, 0)
		cfg.Cloud.Scale = 4
		cfg.Apps["linear"].Epochs *= 40  // runs past the 2 h outage
		cfg.Apps["linear"].MaxBatch = 32 // fleetd-adaptive too stays within 4 GPUs
		res, err := Run(cfg, p)
		if err != nil {
			t.Fatal(err)
		}
		j := res.Jobs[0]
		if !j.Done {
			t.Fatalf("%s: the job did not finish", p)
		}
		if j.End < 4*time.Hour {
			t.Fatalf("%s: the job ended at %s, before the outage ends: the test no longer covers it", p, j.End)
		}
		// Every spot node it holds when the zone goes (the autoscaler of
		// per-fleet may hold fewer than 4 then).
		if res.Preemptions < 1 || res.Preemptions > 4 || j.Preemptions != res.Preemptions {
			t.Errorf("%s: %d preemptions (job %d), want its spot nodes once", p, res.Preemptions, j.Preemptions)
		}
		// On-demand: one node from 10 min after the outage began until spot
		// returns at 4 h, when a spot node replaces it.
		if res.OnDemandHours < 1.8 || res.OnDemandHours > 1.9 {
			t.Errorf("%s: %.2f on-demand node-hours, want the fallback's node from 2h10m to 4h", p, res.OnDemandHours)
		}
		spot := res.GPUHours - res.OnDemandHours
		if want := spot*1.00 + res.OnDemandHours*DefaultOnDemandPrice; math.Abs(res.Cost-want) > 1e-6 || math.Abs(j.Cost-res.Cost) > 1e-6 {
			t.Errorf("%s: cost $%.4f (job $%.4f), want $%.4f for %.2f spot and %.2f on-demand node-hours", p, res.Cost, j.Cost, want, spot, res.OnDemandHours)
		}
		if res.CostPerJob != res.Cost {
			t.Errorf("%s: $%.2f per job of one, total $%.2f", p, res.CostPerJob, res.Cost)
		}
	}
}

// TestCloudBudget: a project's $/h cap bounds what its jobs hold, under
// every policy (the allocator's through Decide, the others at purchase).
func TestCloudBudget(t *testing.T) {
	jobs := []Job{{Name: "a", App: "linear", Replicas: 8, Batch: 64}, {Name: "b", App: "linear", Replicas: 8, Batch: 64, Arrival: time.Minute}}
	for _, p := range CloudPolicies {
		free, err := Run(cloudConfig(t, jobs, 0), p)
		if err != nil {
			t.Fatal(err)
		}
		capped, err := Run(cloudConfig(t, jobs, 1.0), p)
		if err != nil {
			t.Fatal(err)
		}
		if capped.Unfinished != 0 || capped.OnDemandHours != 0 {
			t.Fatalf("%s: %d unfinished, %.2f on-demand hours under a $1/h budget", p, capped.Unfinished, capped.OnDemandHours)
		}
		// $1/h buys one spot node: at most one node-hour per hour.
		if hours := capped.Makespan.Hours(); capped.GPUHours > hours+1.0/60+1e-9 {
			t.Errorf("%s: %.2f node-hours in %.2f h under a one-node budget", p, capped.GPUHours, hours)
		}
		if !(free.AvgJCT < capped.AvgJCT) {
			t.Errorf("%s: average JCT %s without budget, %s with: the cap binds nothing", p, free.AvgJCT, capped.AvgJCT)
		}
	}
}

// TestCloudPerFleet: per-fleet sizes each job alone by the autoscaler:
// the flat job (nothing gained past 2 GPUs) settles below its maximum,
// the linear one stays at it; the pooled policies never exceed the
// pool, per-fleet does; outside the cloud setting it is refused.
func TestCloudPerFleet(t *testing.T) {
	jobs := []Job{{Name: "flat", App: "flat", Replicas: 2, Batch: 64}, {Name: "lin", App: "linear", Replicas: 2, Batch: 64}}
	cfg := cloudConfig(t, jobs, 0)
	cfg.Cloud.Scale = 64
	cfg.Nodes, cfg.PerNode = 1, 4
	res, err := Run(cfg, "per-fleet")
	if err != nil {
		t.Fatal(err)
	}
	jct := map[string]JobResult{}
	for _, j := range res.Jobs {
		jct[j.Name] = j
	}
	// The linear job, at 8 GPUs, is faster per $ than the flat one at 8.
	if perHour := func(j JobResult) float64 { return j.Cost / j.JCT().Hours() }; !(perHour(jct["flat"]) < perHour(jct["lin"])) {
		t.Errorf("per-fleet: flat job $%.2f/h, linear $%.2f/h: the autoscaler did not shrink the flat job", perHour(jct["flat"]), perHour(jct["lin"]))
	}
	if res.GPUHours <= 0 || res.Unfinished != 0 {
		t.Fatalf("per-fleet: %+v", res)
	}
	_, err = Run(Config{Apps: cfg.Apps, Jobs: jobs, Nodes: 1, PerNode: 4}, "per-fleet")
	if err == nil || !strings.Contains(err.Error(), "cloud") {
		t.Fatalf("per-fleet on a fixed pool: %v", err)
	}
}
