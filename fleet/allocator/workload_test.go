package allocator

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// job is a fleet of a hand-made workload: it arrives, needs work
// (samples) and scales by its curve.
type job struct {
	f     Fleet
	work  float64
	done  float64
	ended time.Time
}

// sublinear scales with efficiency eff per extra node.
func sublinear(eff float64, max int) table {
	t := table{}
	for n := 1; n <= max; n++ {
		t[n] = 100 * (1 + eff*float64(n-1))
	}
	return t
}

// TestWorkloadInVirtualTime drives the allocator the way a simulator
// does — one pass a minute of virtual time, the fleets' progress by their
// curves — and checks its invariants on every pass: the pool and each
// project's ceiling hold, a running fleet never drops below min_nodes,
// a project with demand gets its quota, rank 0 is never drained, and
// every job finishes.
func TestWorkloadInVirtualTime(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	projects := []Project{{Name: "a", QuotaGPUs: 8, MaxGPUs: 16, Priority: 5}, {Name: "b", QuotaGPUs: 8, MaxGPUs: 12}, {Name: "c", QuotaGPUs: 4, MaxGPUs: 8}}
	var jobs []*job
	for i := range 24 {
		p := projects[r.IntN(len(projects))].Name
		g := []int{1, 2}[r.IntN(2)]
		mn := 1 + r.IntN(2)
		mx := mn + r.IntN(4)
		f := Fleet{Name: fmt.Sprintf("j%02d", i), Project: p, GPUsPerNode: g, MinNodes: mn, MaxNodes: mx,
			Arrival: t0.Add(time.Duration(r.IntN(180)) * time.Minute), Curve: sublinear(0.3+0.7*r.Float64(), mx)}
		f.Change.InProcess = r.IntN(2) == 0
		jobs = append(jobs, &job{f: f, work: 100 * 60 * float64(30+r.IntN(120))})
	}
	pool := 20
	now := t0
	passes, changes := 0, 0
	for ; passes < 24*60; passes++ {
		var in Input
		in.Now, in.PoolGPUs, in.Projects = now, pool, projects
		var live []*job
		for _, j := range jobs {
			if j.ended.IsZero() && !j.f.Arrival.After(now) {
				live = append(live, j)
				in.Fleets = append(in.Fleets, j.f)
			}
		}
		if len(live) == 0 && now.After(t0.Add(180*time.Minute)) {
			break
		}
		d := Decide(in)
		used := map[string]int{}
		demand := map[string]int{}
		total := 0
		for i, j := range live {
			a := d.Fleets[i]
			if a.Fleet != j.f.Name {
				t.Fatalf("decision order: %s for %s", a.Fleet, j.f.Name)
			}
			if a.Reason == "" || a.Kind == "" {
				t.Fatalf("%s: %s has no reason: %+v", now, a.Fleet, a)
			}
			switch a.Action {
			case Run:
				if a.To < j.f.MinNodes {
					t.Fatalf("%s: %s runs %d < min %d", now, a.Fleet, a.To, j.f.MinNodes)
				}
				for _, id := range a.Remove {
					for _, n := range j.f.Nodes {
						if n.ID == id && n.Rank0 {
							t.Fatalf("%s: drains rank 0 of %s", now, a.Fleet)
						}
					}
				}
				used[j.f.Project] += a.To * j.f.GPUsPerNode
				demand[j.f.Project] += j.f.MaxNodes * j.f.GPUsPerNode
				total += a.To * j.f.GPUsPerNode
				if a.To != j.f.Current && j.f.Running {
					changes++
					j.f.LastChange = now
				}
				// Nodes: rank 0 first, then numbered; drains as told.
				gone := map[string]bool{}
				for _, id := range a.Remove {
					gone[id] = true
				}
				var keep []Node
				for _, n := range j.f.Nodes {
					if !gone[n.ID] {
						keep = append(keep, n)
					}
				}
				for k := 0; len(keep) < a.To; k++ {
					keep = append(keep, Node{ID: fmt.Sprintf("%s-%d-%d", j.f.Name, passes, k), Rank0: len(keep) == 0, Since: now})
				}
				j.f.Nodes, j.f.Current, j.f.Running = keep, a.To, true
				x, _ := j.f.Curve.Throughput(a.To)
				j.done += x * 60
				if j.done >= j.work {
					j.ended = now
				}
			case Queue:
			default:
				t.Fatalf("%s: unexpected %s for %s", now, a.Action, a.Fleet)
			}
		}
		if total > pool {
			t.Fatalf("%s: %d GPUs allocated, pool %d", now, total, pool)
		}
		for _, p := range projects {
			if used[p.Name] > p.MaxGPUs {
				t.Fatalf("%s: project %s holds %d > max %d", now, p.Name, used[p.Name], p.MaxGPUs)
			}
			// The guarantee: a project whose running fleets want its quota
			// has it (up to 1 node's GPUs of rounding).
			if want := min(p.QuotaGPUs, demand[p.Name]); used[p.Name] < want-1 {
				t.Fatalf("%s: project %s holds %d of the %d its quota guarantees:\n%v", now, p.Name, used[p.Name], want, reasons(d))
			}
		}
		now = now.Add(time.Minute)
	}
	var unfinished []string
	for _, j := range jobs {
		if j.ended.IsZero() {
			unfinished = append(unfinished, j.f.Name)
		}
	}
	if len(unfinished) > 0 {
		t.Errorf("after %d passes, unfinished: %v", passes, unfinished)
	}
	t.Logf("%d jobs in %d virtual minutes, %d resizes", len(jobs), passes, changes)
}

func reasons(d Decision) string {
	var out []string
	for _, a := range d.Fleets {
		out = append(out, a.Reason)
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}

// BenchmarkDecide is one pass at the scale of Pollux's workloads: 64
// GPUs, 160 fleets of which 40 run.
func BenchmarkDecide(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	in := Input{Now: t0, PoolGPUs: 64}
	for i := range 4 {
		in.Projects = append(in.Projects, Project{Name: fmt.Sprintf("p%d", i), QuotaGPUs: 16, MaxGPUs: 64})
	}
	for i := range 160 {
		mx := 1 + r.IntN(16)
		f := Fleet{Name: fmt.Sprintf("f%03d", i), Project: fmt.Sprintf("p%d", i%4), GPUsPerNode: 1, MinNodes: 1, MaxNodes: mx,
			Arrival: t0.Add(-time.Duration(i) * time.Minute), Curve: sublinear(0.2+0.8*r.Float64(), mx)}
		if i < 40 {
			f.Running, f.Current = true, 1
		}
		in.Fleets = append(in.Fleets, f)
	}
	b.ReportAllocs()
	for b.Loop() {
		Decide(in)
	}
}
