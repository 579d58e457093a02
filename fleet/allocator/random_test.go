package allocator

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/budget"
)

// TestRandomInputsKeepTheRules decides on many random inputs — budgets in
// every state, paused fleets, unknown projects, capacity and autoscaler
// limits, missing curves — and checks the rules that hold whatever the
// input: targets within bounds, the pool and the ceilings respected by
// growth, drains that never take rank 0 from a running fleet, a reason
// for everything, queue positions in order.
func TestRandomInputsKeepTheRules(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	states := []budget.State{"", budget.OK, budget.Warn, budget.Capped, budget.Exhausted}
	for iter := range 500 {
		in := Input{Now: t0, PoolGPUs: r.IntN(24)}
		for i := range 1 + r.IntN(4) {
			q := r.IntN(8)
			p := Project{Name: fmt.Sprintf("p%d", i), QuotaGPUs: q, MaxGPUs: q + r.IntN(8), Priority: r.IntN(20)}
			if r.IntN(3) == 0 {
				p.Budget = Budget{State: states[r.IntN(len(states))], PerHour: float64(r.IntN(30)), OnExhausted: []budget.Action{budget.Pause, budget.Stop}[r.IntN(2)]}
			}
			in.Projects = append(in.Projects, p)
		}
		if r.IntN(2) == 0 {
			in.Projects = append(in.Projects, Project{Name: "default", Unlimited: true})
		}
		for i := range r.IntN(10) {
			mn := 1 + r.IntN(3)
			mx := mn + r.IntN(5)
			proj := "gone"
			if k := r.IntN(len(in.Projects) + 1); k < len(in.Projects) {
				proj = in.Projects[k].Name
			}
			f := Fleet{Name: fmt.Sprintf("f%d", i), Project: proj, GPUsPerNode: r.IntN(3), MinNodes: mn, MaxNodes: mx,
				Arrival: t0.Add(-time.Duration(r.IntN(120)) * time.Minute), Priority: r.IntN(10), PricePerNodeHour: float64(r.IntN(5))}
			if r.IntN(2) == 0 {
				f.Running = true
				f.Current = r.IntN(mx + 2)
				f.Nodes = nodeList(f.Name, f.Current)
				f.LastChange = t0.Add(-time.Duration(r.IntN(20)) * time.Minute)
			} else {
				f.Paused = r.IntN(8) == 0
			}
			if r.IntN(3) > 0 {
				f.Curve = sublinear(r.Float64(), mx+2)
			}
			if r.IntN(4) == 0 {
				f.Want = r.IntN(mx + 1)
			}
			if r.IntN(4) == 0 {
				f.CapacityNodes = r.IntN(mx + 1)
			}
			if r.IntN(5) == 0 {
				f.Budget = Budget{State: states[r.IntN(len(states))], PerHour: float64(r.IntN(10))}
			}
			f.Change = Change{InProcess: r.IntN(2) == 0, CheckpointGB: float64(r.IntN(100))}
			in.Fleets = append(in.Fleets, f)
		}
		d := Decide(in)
		where := fmt.Sprintf("input %d", iter)
		if len(d.Fleets) != len(in.Fleets) {
			t.Fatalf("%s: %d allocations for %d fleets", where, len(d.Fleets), len(in.Fleets))
		}
		pool := 0
		for i, a := range d.Fleets {
			f := in.Fleets[i]
			if a.Reason == "" || a.Kind == "" {
				t.Fatalf("%s: %s without a reason: %+v", where, f.Name, a)
			}
			switch a.Action {
			case Run:
				if a.To < max(f.MinNodes, 1) && a.Kind != "no-project" {
					t.Fatalf("%s: %s runs %d below min %d: %s", where, f.Name, a.To, f.MinNodes, a.Reason)
				}
				if a.To > max(f.MaxNodes, f.Current) {
					t.Fatalf("%s: %s runs %d above max %d: %s", where, f.Name, a.To, f.MaxNodes, a.Reason)
				}
				capped := f.Budget.State == budget.Capped
				for _, p := range in.Projects {
					capped = capped || p.Name == f.Project && p.Budget.State == budget.Capped
				}
				if capped && a.To > max(f.Current, f.MinNodes) || capped && !f.Running {
					t.Fatalf("%s: %s grows or starts under a capped budget: %s", where, f.Name, a.Reason)
				}
				if f.Current > a.To && len(a.Remove) != f.Current-a.To {
					t.Fatalf("%s: %s drains %v for %d→%d", where, f.Name, a.Remove, f.Current, a.To)
				}
				for _, id := range a.Remove {
					if id == f.Name+"-0" {
						t.Fatalf("%s: %s drains its rank 0: %s", where, f.Name, a.Reason)
					}
				}
				if a.Kind != "unlimited" {
					pool += a.To * f.GPUsPerNode
				}
			case Pause, Stop, Paused:
				if a.To != 0 || len(a.Remove) != f.Current {
					t.Fatalf("%s: %s %s keeps nodes: %+v", where, f.Name, a.Action, a)
				}
			case Queue:
				if a.To != 0 || f.Running && a.Kind != "no-project" {
					t.Fatalf("%s: %s queued: %+v", where, f.Name, a)
				}
			}
		}
		// Minimums of running fleets are never taken, so only they may
		// stand over the pool.
		mins := 0
		for i, a := range d.Fleets {
			if f := in.Fleets[i]; a.Action == Run && f.Running && a.Kind != "unlimited" {
				mins += max(f.MinNodes, 1, min(f.Current, a.To)) * f.GPUsPerNode
			}
		}
		if d.UsedGPUs > max(d.PoolGPUs, mins) {
			t.Fatalf("%s: %d GPUs used, pool %d (running minimums %d)\n%+v\n%+v\n%s", where, d.UsedGPUs, d.PoolGPUs, mins, in.Projects, d.Projects, reasons(d))
		}
		for _, u := range d.Projects {
			runMins := 0
			for i, a := range d.Fleets {
				if f := in.Fleets[i]; f.Project == u.Name && f.Running && a.Action == Run {
					runMins += max(f.MinNodes, 1) * f.GPUsPerNode
				}
			}
			if u.UsedGPUs > max(u.MaxGPUs, u.QuotaGPUs, runMins) {
				t.Fatalf("%s: project %s uses %d GPUs, max %d (running minimums %d)\n%s", where, u.Name, u.UsedGPUs, u.MaxGPUs, runMins, reasons(d))
			}
		}
		for i, e := range d.Queue {
			if e.Position != i+1 || e.Reason == "" {
				t.Fatalf("%s: queue entry %d: %+v", where, i, e)
			}
		}
	}
}
