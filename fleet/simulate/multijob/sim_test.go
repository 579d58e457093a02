package multijob

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func smallConfig(t *testing.T) Config {
	t.Helper()
	jobs, err := LoadWorkload(filepath.Join("testdata", "small.csv"))
	if err != nil {
		t.Fatal(err)
	}
	return Config{Apps: loadBundled(t), Jobs: jobs, Nodes: 2, PerNode: 4}
}

// TestSmallWorkloadEndToEnd runs every policy on a four-job workload on
// 2x4 GPUs twice: the runs agree (deterministic), every job finishes,
// and the per-job outcomes match the golden file.
func TestSmallWorkloadEndToEnd(t *testing.T) {
	cfg := smallConfig(t)
	var all []Result
	for _, p := range Policies {
		a, err := Run(cfg, p)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Run(cfg, p)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two runs differ:\n%+v\n%+v", p, a, b)
		}
		if a.Unfinished != 0 {
			t.Fatalf("%s: %d jobs unfinished", p, a.Unfinished)
		}
		for _, j := range a.Jobs {
			if j.Start < j.Arrival || j.End <= j.Start {
				t.Fatalf("%s: job %s arrives %s, starts %s, ends %s", p, j.Name, j.Arrival, j.Start, j.End)
			}
		}
		all = append(all, a)
	}
	got, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "small.golden.json")
	if *update {
		if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(append(got, '\n')) != string(want) {
		t.Fatalf("results differ from %s (go test -update to accept):\n%s", golden, got)
	}
}

// TestFIFORunsRequestsInOrder: on 2x4 GPUs the first two jobs ask for
// all 8, so the second starts at the first decision after the first
// ends.
func TestFIFORunsRequestsInOrder(t *testing.T) {
	res, err := Run(smallConfig(t), "fifo")
	if err != nil {
		t.Fatal(err)
	}
	a, b := res.Jobs[0], res.Jobs[1]
	if a.Start != 0 || b.Start < a.End || b.Start >= a.End+time.Minute {
		t.Fatalf("fifo: a runs %s-%s, b starts %s: want b at the first decision after a ends", a.Start, a.End, b.Start)
	}
}

// TestAllocatorBeatsFixedRequests is the case for elasticity: jobs that
// each ask for the whole pool at a large batch scale sublinearly, so
// sharing the pool (the allocator) finishes them sooner on average than
// running each at its request in turn. Adapting the batch to the GPUs
// does better still.
func TestAllocatorBeatsFixedRequests(t *testing.T) {
	cfg := smallConfig(t)
	avg := averages(t, cfg, Policies...)
	if !(avg["fleetd"] < avg["fifo"]) {
		t.Errorf("fleetd's average JCT %s, fifo's %s: want the allocator ahead", avg["fleetd"], avg["fifo"])
	}
	if !(avg["fleetd-adaptive"] < avg["fleetd"]) {
		t.Errorf("fleetd-adaptive's average JCT %s, fleetd's %s: want adaptive batch sizes ahead", avg["fleetd-adaptive"], avg["fleetd"])
	}
}

func TestRunErrors(t *testing.T) {
	cfg := smallConfig(t)
	if _, err := Run(cfg, "nope"); err == nil {
		t.Error("unknown policy ran")
	}
	bad := cfg
	bad.Jobs = append([]Job{{Name: "x", App: "gpt5", Replicas: 1, Batch: 1}}, cfg.Jobs...)
	if _, err := Run(bad, "fifo"); err == nil {
		t.Error("a job of an unknown application ran")
	}
	bad = cfg
	bad.Nodes = 0
	if _, err := Run(bad, "fifo"); err == nil {
		t.Error("an empty pool ran")
	}
}

func TestLoadWorkload(t *testing.T) {
	jobs, err := LoadWorkload(filepath.Join(bundled, "workloads", "workload-1.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 160 || jobs[0] != (Job{Name: "cifar10-0", Arrival: 107 * time.Second, App: "cifar10", Replicas: 6, Batch: 2048}) {
		t.Fatalf("%d jobs, first %+v", len(jobs), jobs[0])
	}
	dir := t.TempDir()
	for _, tc := range []struct{ name, body string }{
		{"header", "name,time,app\nx,0,cifar10\n"},
		{"duplicate", "name,time,application,num_replicas,batch_size\nx,0,cifar10,1,128\nx,1,cifar10,1,128\n"},
		{"replicas", "name,time,application,num_replicas,batch_size\nx,0,cifar10,0.5,128\n"},
		{"time", "name,time,application,num_replicas,batch_size\nx,-1,cifar10,1,128\n"},
		{"empty", "name,time,application,num_replicas,batch_size\n"},
	} {
		p := filepath.Join(dir, tc.name+".csv")
		if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadWorkload(p); err == nil {
			t.Errorf("%s: loaded", tc.name)
		}
	}
	if n := WorkloadNumber("a/workload-3.csv"); n != 3 {
		t.Errorf("WorkloadNumber: %d", n)
	}
}

// TestTiresiasTwoQueues: a job past the threshold of attained service
// yields its GPUs to a newer job still in the first queue, and a job
// that does not fit is skipped for one behind it that does.
func TestTiresiasTwoQueues(t *testing.T) {
	old := &jobState{Job: Job{Name: "old", Replicas: 6}, gpus: 6, service: TiresiasThreshold}
	young := &jobState{Job: Job{Name: "young", Replicas: 4}}
	big := &jobState{Job: Job{Name: "big", Replicas: 8}}
	small := &jobState{Job: Job{Name: "small", Replicas: 2}}
	tiresias{pool: 8, threshold: TiresiasThreshold}.decide(0, []*jobState{old, young, big, small})
	got := map[string]int{}
	for _, j := range []*jobState{old, young, big, small} {
		got[j.Name] = j.gpus
	}
	want := map[string]int{"old": 0, "young": 4, "big": 0, "small": 2}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestAllocatorGivesGPUsToTheJobThatScales pins the allocator's rule on
// two hand-made applications (testdata/apps): linear scales with every
// GPU, flat gains nothing past 2. Arriving together on 8 GPUs, the
// linear job gets the GPUs the flat one cannot use, and both end sooner
// on average than at their requests of 4 each.
func TestAllocatorGivesGPUsToTheJobThatScales(t *testing.T) {
	apps, err := LoadApps(filepath.Join("testdata", "apps"))
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := LoadWorkload(filepath.Join("testdata", "linflat.csv"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Apps: apps, Jobs: jobs, Nodes: 1, PerNode: 8, Changeover: time.Minute}
	var live []*jobState
	for _, j := range jobs {
		live = append(live, &jobState{Job: j, app: apps[j.App], batch: j.Batch, target: apps[j.App].Target(), maxBatch: j.Batch, batchMemo: map[[2]int]float64{}})
	}
	(&fleetd{cfg: cfg, pool: 8}).decide(0, live)
	flat, linear := live[0].gpus, live[1].gpus
	if flat < 1 || flat > 2 || flat+linear != 8 {
		t.Fatalf("flat gets %d GPUs, linear %d: want flat 1-2 and linear the rest of 8", flat, linear)
	}
	avg := averages(t, cfg, "fifo", "fleetd")
	if !(avg["fleetd"] < avg["fifo"]) {
		t.Fatalf("average JCT: fleetd %s, fifo %s", avg["fleetd"], avg["fifo"])
	}
}

// averages runs the policies and returns their average JCTs.
func averages(t *testing.T, cfg Config, policies ...string) map[string]time.Duration {
	t.Helper()
	avg := map[string]time.Duration{}
	for _, p := range policies {
		r, err := Run(cfg, p)
		if err != nil {
			t.Fatal(err)
		}
		avg[p] = r.AvgJCT
	}
	return avg
}

// TestOptimusFavoursRemainingWork: two linear jobs, one with nine times
// the other's remaining work: each gets a GPU, and the oracle gives the
// longer one most of the rest (a GPU saves it the most time).
func TestOptimusFavoursRemainingWork(t *testing.T) {
	apps, err := LoadApps(filepath.Join("testdata", "apps"))
	if err != nil {
		t.Fatal(err)
	}
	a := apps["linear"]
	long := &jobState{Job: Job{Name: "long", Batch: 64}, app: a, target: a.Target()}
	short := &jobState{Job: Job{Name: "short", Batch: 64}, app: a, target: a.Target(), progress: a.Target() * 8 / 9}
	optimus{pool: 8, perNode: 8}.decide(0, []*jobState{short, long})
	if short.gpus < 1 || long.gpus <= short.gpus || short.gpus+long.gpus != 8 {
		t.Fatalf("short job %d GPUs, long %d: want both running, the long one on more, 8 in all", short.gpus, long.gpus)
	}
}

// TestNodePlacement pins the two ways GPUs are taken from the fixed
// pool's nodes: the gang baselines take the emptiest node first (the
// published simulator's Tiresias), which splits a later 4-GPU job over
// two nodes; fleetd's best fit keeps every job on one node.
func TestNodePlacement(t *testing.T) {
	for _, c := range []struct {
		policy string
		spans  []int // nodes each job spans
	}{
		{"tiresias", []int{1, 1, 1, 2}},
		{"fleetd-adaptive", []int{1, 1, 1, 1}},
	} {
		t.Run(c.policy, func(t *testing.T) {
			p := &nodePool{free: []int{4, 4, 4}, per: 4}
			var jobs []*jobState
			for _, g := range []int{1, 1, 4, 4} {
				j := &jobState{gpus: g}
				jobs = append(jobs, j)
				p.place(c.policy, []*jobState{j}, []int{0})
			}
			for i, j := range jobs {
				held := 0
				for _, g := range j.on {
					held += g
				}
				if held != j.gpus || len(j.on) != c.spans[i] {
					t.Errorf("job %d (%d GPUs): on %v; want its GPUs on %d node(s)", i, j.gpus, j.on, c.spans[i])
				}
			}
			if free := p.free[0] + p.free[1] + p.free[2]; free != 2 {
				t.Errorf("free GPUs %v; want 2 in all", p.free)
			}
			for _, j := range jobs {
				j.gpus = 0
				p.place(c.policy, []*jobState{j}, []int{len(j.on)})
			}
			if p.free[0] != 4 || p.free[1] != 4 || p.free[2] != 4 {
				t.Errorf("after every job left: free %v; want 4 on every node", p.free)
			}
		})
	}
}

// TestDefragment: two nodes each hold a 2-GPU job and have 2 free; a
// 4-GPU job arriving would be split over both. fleetd's placement moves
// one 2-GPU job next to the other (it restarts: swapped) so the new job
// takes one whole node; the gang baselines split it.
func TestDefragment(t *testing.T) {
	for _, c := range []struct {
		policy    string
		span      int
		swapped   int
		wantSpans []int // of the two small jobs afterwards
	}{
		{"tiresias", 2, 0, []int{1, 1}},
		{"fleetd", 1, 1, []int{1, 1}},
	} {
		t.Run(c.policy, func(t *testing.T) {
			p := &nodePool{free: []int{2, 2}, per: 4}
			a := &jobState{gpus: 2, on: map[int]int{0: 2}}
			b := &jobState{gpus: 2, on: map[int]int{1: 2}}
			big := &jobState{gpus: 4}
			live := []*jobState{a, b, big}
			p.place(c.policy, live, []int{2, 2, 0})
			if len(big.on) != c.span || big.on[0]+big.on[1] != 4 {
				t.Fatalf("the 4-GPU job on %v; want %d node(s)", big.on, c.span)
			}
			swapped := 0
			for i, j := range []*jobState{a, b} {
				if j.swapped {
					swapped++
				}
				if len(j.on) != c.wantSpans[i] {
					t.Errorf("small job %d on %v", i, j.on)
				}
			}
			if swapped != c.swapped || p.free[0] != 0 || p.free[1] != 0 {
				t.Errorf("%d jobs moved, free %v; want %d moved and the pool full", swapped, p.free, c.swapped)
			}
		})
	}
	// Nothing can be freed: the job is split (no job is moved for nothing).
	p := &nodePool{free: []int{3, 3}, per: 4}
	a := &jobState{gpus: 2, on: map[int]int{0: 1, 1: 1}} // spans two nodes: not movable
	big := &jobState{gpus: 4}
	p.place("fleetd", []*jobState{a, big}, []int{2, 0})
	if a.swapped || len(big.on) != 2 {
		t.Errorf("moved %v, big on %v; want no move and the job split", a.swapped, big.on)
	}
}
