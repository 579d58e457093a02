package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/fleet/projects"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/rendezvous"
)

// pool is the daemon-wide part of the pass: the budget ledger and the
// allocation decision, made once per ReconcileAll before the fleets'
// passes. mu guards its fields; it is never held while taking a fleet's
// pass lock or Controller.mu.
type pool struct {
	c  *Controller
	mu sync.Mutex
	// decision is the last allocation; nil: none.
	decision *allocator.Decision
	// ledger is the budget ledger; nil until loaded from the store (and
	// after Reset).
	ledger      *budget.Ledger
	ledgerSaved time.Time
	ledgerDirty bool
}

// SavedAllocation is what the allocator needs remembered of a fleet
// between passes (allocator.Fleet's Running, Paused, Arrival, LastChange,
// Resizes), saved with the fleet's runtime so a restart or failover keeps
// it.
type SavedAllocation struct {
	// Admitted: a decision said run; kept until the fleet pauses.
	Admitted       bool `json:"admitted,omitempty"`
	Paused         bool `json:"paused,omitempty"`
	PausedByBudget bool `json:"paused_by_budget,omitempty"`
	// Stopping: its budget ran out under on_exhausted = "stop"; it is
	// marked completed once its nodes are gone (pool.stop).
	Stopping   bool   `json:"stopping,omitempty"`
	StopReason string `json:"stop_reason,omitempty"`
	// Arrival is its place in the queue (set on resume; zero: created_at).
	Arrival    time.Time `json:"arrival,omitzero"`
	LastChange time.Time `json:"last_change,omitzero"`
	// Current is its live nodes at the last decision (LastChange).
	Current int `json:"current,omitempty"`
	// Resizes counts the changes of Current while it ran, since Arrival
	// (allocator.Fleet.Resizes).
	Resizes int `json:"resizes,omitempty"`
	// To and ChangedAt: the last allocated size and when it changed, so
	// the reconciler acts on a new allocation without its cooldowns.
	To        int       `json:"to,omitempty"`
	ChangedAt time.Time `json:"changed_at,omitzero"`
}

// allocate makes the pass's one daemon-wide decision: it feeds the
// ledger the fleets' spend, builds the allocator's input from the store,
// the runtimes and the rendezvous, decides, and hands each fleet's
// allocation to its runtime for its pass (capAllocation). Without
// projects and budgets it decides nothing and every fleet is sized as
// before.
func (p *pool) allocate(ctx context.Context, fleets []state.Fleet) {
	c := p.c
	now := c.now()
	specs := map[string]*spec.Fleet{}
	projs := c.opts.ProjectsNow() // one view for the whole pass
	any := projs.Enabled()
	for _, f := range fleets {
		if f.Destroying || f.Completed {
			continue
		}
		if fl, err := c.opts.Specs.Spec(f); err == nil {
			specs[f.Name] = fl
			any = any || fl.Budget != nil
		}
	}
	if !any {
		p.setDecision(nil)
		return
	}
	p.observeSpend(ctx, fleets, specs, now)
	in := allocator.Input{Now: now, PoolGPUs: projs.Pool(), Params: c.opts.Allocation,
		Projects: allocator.ProjectsOf(projs, func(pr projects.Project) budget.Status {
			return p.status("project", pr.Name, *pr.Budget)
		})}
	var rst rendezvous.Status
	rz := c.rz()
	occ := map[string]occupancy{}
	for _, f := range fleets {
		fl, ok := specs[f.Name]
		if !ok {
			continue
		}
		af := allocator.FromSpec(fl)
		nodes := c.storedNodes(ctx, f.Name)
		rank0 := ""
		if rz != nil {
			if st, err := rz.Status(f.Name); err == nil {
				rst = st
				for _, m := range rst.Members {
					if m.GroupRank != nil && *m.GroupRank == 0 {
						rank0 = m.NodeID
					}
				}
			}
		}
		var priced, draining int
		for _, n := range nodes {
			if n.State == state.NodeDraining || n.State == state.NodeTerminating {
				draining++ // its instance still runs (and holds its GPUs)
			}
			if !reconcile.Live(n.State) {
				continue
			}
			af.Nodes = append(af.Nodes, allocator.Node{ID: n.ID, Rank0: n.ID == rank0, OnDemand: n.Offering.CapacityType == providers.OnDemand,
				PricePerHour: n.Offering.PricePerHour, Since: n.CreatedAt})
			if n.Offering.PricePerHour > 0 {
				af.PricePerNodeHour += n.Offering.PricePerHour
				priced++
			}
		}
		if priced > 0 {
			af.PricePerNodeHour /= float64(priced)
		}
		af.Current = len(af.Nodes)
		if fl.Budget != nil {
			af.Budget = allocator.BudgetOf(p.status("fleet", f.Name, *fl.Budget))
		}
		// The runtime belongs to the fleet's pass: read it under the pass lock.
		e := c.entry(f.Name)
		e.pass.Lock()
		rt := c.runtime(f.Name)
		sa := rt.Alloc
		if fl.DesiredNodes == 0 && rt.Scale.Target > 0 {
			af.Want = rt.Scale.Target
		}
		if rt.Training != nil {
			af.Curve = allocator.CurveFromPoints(rt.Training.Points(""))
			if l := rt.Training.Latest; l != nil {
				af.Curve = allocator.GoodputCurve(af.Curve, l.NoiseScale, l.Batch, l.Nodes)
			}
		}
		e.pass.Unlock()
		af.Running, af.Paused, af.PausedByBudget = sa.Admitted, sa.Paused, sa.PausedByBudget
		af.Arrival, af.LastChange, af.Resizes = sa.Arrival, sa.LastChange, sa.Resizes
		if af.Arrival.IsZero() {
			af.Arrival = f.CreatedAt
		}
		if p, ok := projs.Get(af.Project); ok {
			af.Priority = p.Priority
		}
		in.Fleets = append(in.Fleets, af)
		occ[f.Name] = occupancy{project: af.Project, gpusPerNode: af.GPUsPerNode, live: af.Current, draining: draining,
			priority: af.Priority, arrival: af.Arrival}
	}
	// A destroying, completed or stopped fleet is out of the decision,
	// but its nodes hold their GPUs until they are gone.
	for _, f := range fleets {
		if _, ok := specs[f.Name]; ok {
			continue
		}
		fl, err := c.opts.Specs.Spec(f)
		if err != nil {
			continue
		}
		held := 0
		for _, n := range c.storedNodes(ctx, f.Name) {
			if reconcile.Live(n.State) || n.State == state.NodeDraining || n.State == state.NodeTerminating {
				held++
			}
		}
		if held > 0 {
			occ[f.Name] = occupancy{project: fl.ProjectName(), gpusPerNode: fl.Node.GPUs, draining: held}
		}
	}
	dec := allocator.Decide(in)
	p.setDecision(&dec)
	// A fleet that completed, stopped or is being destroyed has left the
	// decision: it shows no stale allocation.
	for _, f := range fleets {
		if _, ok := specs[f.Name]; !ok {
			p.forget(f.Name)
		}
	}
	holds := drainHolds(dec, in, occ)
	for _, a := range dec.Fleets {
		var h *drainHold
		if x, ok := holds[a.Fleet]; ok {
			h = &x
		}
		if why, stopping := p.admit(ctx, a, h, now); stopping && a.From == 0 {
			p.stop(ctx, a.Fleet, why, now)
		}
	}
}

// storedNodes is the fleet's nodes as the store has them (none when it
// cannot be read: the pass then decides on what it has).
func (c *Controller) storedNodes(ctx context.Context, fleet string) []state.Node {
	nodes, _ := state.Read(ctx, c.store, func(tx state.Tx) ([]state.Node, error) { return tx.Nodes(fleet) })
	return nodes
}

// stop ends a fleet whose budget is spent under on_exhausted = "stop" once
// no node of it is left: its nodes went through the normal drain path
// (their workers checkpointed), so only then is it marked completed (not
// succeeded). It leaves the pool and the queue for good; its checkpoints,
// spend and logs stay, and `fleetd destroy` and a new apply start over.
func (p *pool) stop(ctx context.Context, fleet, why string, now time.Time) {
	c := p.c
	stopped := false
	err := c.store.Update(ctx, func(tx state.Tx) error {
		f, err := tx.Fleet(fleet)
		if err != nil || f.Completed || f.Destroying {
			return err
		}
		nodes, err := tx.Nodes(fleet)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.State != state.NodeTerminated && n.State != state.NodeFailed {
				return nil // still draining
			}
		}
		f.Completed, f.Succeeded, f.CompletedAt = true, false, now
		f.CompletedDetail = "stopped: " + why
		if _, err := tx.PutFleet(f); err != nil {
			return err
		}
		stopped = true
		_, err = tx.AppendEvent(state.Event{Fleet: fleet, Type: "fleet.stopped", Message: fmt.Sprintf("fleet %s stopped: %s", fleet, why)})
		return err
	})
	if err != nil {
		c.log.Warn("stop fleet", "fleet", fleet, "err", err)
		return
	}
	if stopped {
		// Nothing is left to resume.
		e := c.entry(fleet)
		e.pass.Lock()
		rt := c.runtime(fleet)
		rt.Alloc.Paused, rt.Alloc.PausedByBudget, rt.Alloc.Stopping = false, false, false
		e.pass.Unlock()
		// Its allocation (0 nodes) stays for this ReconcileAll's passes,
		// which read the fleet before it completed; the next drops it.
		c.Kick()
	}
}

// admit records a fleet's allocation in its runtime: what the allocator
// must remember (admitted, paused, stopping) and what its pass caps its
// size by, and its hold while draining nodes hold its GPUs (nil: none).
// It reports whether the fleet is stopping, and why.
func (p *pool) admit(ctx context.Context, a allocator.Allocation, hold *drainHold, now time.Time) (string, bool) {
	c := p.c
	e := c.entry(a.Fleet)
	e.pass.Lock()
	defer e.pass.Unlock()
	rt := c.runtime(a.Fleet)
	sa := &rt.Alloc
	was := *sa
	switch a.Action {
	case allocator.Run:
		sa.Admitted, sa.Paused, sa.PausedByBudget, sa.Stopping = true, false, false, false
	case allocator.Queue:
		// A fleet paused by its budget queues again once the budget allows.
		if sa.PausedByBudget {
			sa.Paused, sa.PausedByBudget, sa.Stopping, sa.Arrival, sa.Resizes = false, false, false, now, 0
		}
		sa.Admitted = false
	case allocator.Pause, allocator.Stop:
		sa.Admitted, sa.Paused, sa.PausedByBudget = false, true, true
		// The allocator says stop once; later passes see it paused.
		if a.Action == allocator.Stop {
			sa.Stopping, sa.StopReason = true, a.Reason
		}
	case allocator.Paused:
		sa.Admitted = false
	}
	if a.From != sa.Current {
		if a.From > 0 && sa.Current > 0 {
			sa.Resizes++
		}
		sa.Current, sa.LastChange = a.From, now
	}
	to := a.To
	if a.Action != allocator.Run {
		to = 0
	}
	if to != sa.To {
		// A running fleet's new size is the decision operators ask about
		// later ("why did resnet shrink?"): the reason goes in the log.
		if a.Action == allocator.Run && was.Admitted && sa.To > 0 {
			c.appendEvent(ctx, state.Event{Fleet: a.Fleet, Type: "fleet.allocated", Message: a.Reason,
				Data: map[string]string{"from": fmt.Sprint(sa.To), "to": fmt.Sprint(to), "kind": a.Kind}})
		}
		sa.To, sa.ChangedAt = to, now
	}
	if a.Action != allocator.Run && a.Action != allocator.Queue && was.Paused != sa.Paused {
		typ, verb := "fleet.paused", "paused"
		if a.Action == allocator.Stop {
			typ, verb = "fleet.stopping", "stops once its nodes have drained"
		}
		c.appendEvent(ctx, state.Event{Fleet: a.Fleet, Type: typ, Message: fmt.Sprintf("fleet %s %s: %s", a.Fleet, verb, a.Reason),
			Data: map[string]string{"kind": a.Kind}})
	}
	if was.Paused && !sa.Paused {
		c.appendEvent(ctx, state.Event{Fleet: a.Fleet, Type: "fleet.resumed", Message: fmt.Sprintf("fleet %s queues to start again: %s", a.Fleet, a.Reason)})
	}
	rt.mu.Lock()
	al := a
	rt.alloc, rt.hold = &al, hold
	rt.mu.Unlock()
	return sa.StopReason, sa.Stopping
}

// capAllocation caps the pass's target by the fleet's allocation (never
// above what its autoscaler or spec wants: the reconciler takes the
// smaller), names the nodes to drain first, and holds a queued or paused
// fleet at zero nodes through the normal drain path.
func capAllocation(rt *Runtime, in *reconcile.Input) {
	rt.mu.Lock()
	a, hold := rt.alloc, rt.hold
	rt.mu.Unlock()
	if a == nil || a.Kind == "unlimited" || a.Kind == "no-project" {
		return
	}
	to := a.To
	if a.Action != allocator.Run {
		to = 0
	}
	reason := string(a.Action) + ": " + a.Reason
	if hold != nil && hold.Nodes < to {
		// Never below its live nodes: a hold delays launches, it drains
		// nothing.
		live := 0
		for _, n := range in.Nodes {
			if reconcile.Live(n.State) {
				live++
			}
		}
		to, reason = max(hold.Nodes, live), reason+"; "+hold.Why
	}
	in.Allot = &reconcile.Allot{Nodes: to, Drain: a.Remove, Reason: reason}
	if rt.Alloc.ChangedAt.After(in.TargetAt) {
		in.TargetAt = rt.Alloc.ChangedAt
	}
}

// forget drops a fleet's allocation from its runtime.
func (p *pool) forget(fleet string) {
	c := p.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.fleets[fleet]; e != nil && e.rt != nil {
		e.rt.mu.Lock()
		e.rt.alloc, e.rt.hold = nil, nil
		e.rt.mu.Unlock()
	}
}

// setDecision keeps the last decision for the API (nil: none made).
func (p *pool) setDecision(d *allocator.Decision) {
	p.mu.Lock()
	p.decision = d
	p.mu.Unlock()
	if d == nil {
		c := p.c
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, e := range c.fleets {
			if e.rt != nil {
				e.rt.mu.Lock()
				e.rt.alloc, e.rt.hold = nil, nil
				e.rt.mu.Unlock()
			}
		}
	}
}

// Decision is the last allocation decision; false when none was made (no
// project and no budget configured, or no pass yet).
func (c *Controller) Decision() (allocator.Decision, bool) {
	c.pool.mu.Lock()
	defer c.pool.mu.Unlock()
	if c.pool.decision == nil {
		return allocator.Decision{}, false
	}
	return *c.pool.decision, true
}

// Resume un-pauses a fleet: it queues to start again (at the back of its
// priority). A fleet whose budget is still exhausted is paused again by
// the next decision. It returns false when the fleet was not paused.
func (c *Controller) Resume(ctx context.Context, name string) (bool, error) {
	e := c.entry(name)
	e.pass.Lock()
	rt := c.runtime(name)
	sa := &rt.Alloc
	if !sa.Paused {
		e.pass.Unlock()
		return false, nil
	}
	now := c.now()
	sa.Paused, sa.PausedByBudget, sa.Stopping, sa.Admitted, sa.Arrival, sa.Resizes = false, false, false, false, now, 0
	c.save(ctx, name, rt, now, true)
	e.pass.Unlock()
	c.appendEvent(ctx, state.Event{Fleet: name, Type: "fleet.resumed", Message: fmt.Sprintf("fleet %s resumed: it queues to start again", name)})
	c.Kick()
	return true, nil
}
