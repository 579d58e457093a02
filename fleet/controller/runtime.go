package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	"sync"

	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
)

// SavedRuntime is the part of a fleet's runtime that survives a restart,
// persisted in meta under RuntimeKey (see save for when).
type SavedRuntime struct {
	Fallback      placement.FallbackState `json:"fallback"`
	LastScaleUp   time.Time               `json:"last_scale_up,omitzero"`
	LastScaleDown time.Time               `json:"last_scale_down,omitzero"`
	// Progress is the training work done (in time at max_nodes), measured
	// from the rendezvous: the deadline policy needs it.
	Progress placement.Progress `json:"progress"`
	// Training is what the workers' progress reports measured: throughput
	// per round and size, the latest report, a chart series (scale.go).
	Training *autoscale.Tracker `json:"training,omitempty"`
	// Scale is the autoscaler's decision state.
	Scale autoscale.State `json:"scale,omitzero"`
	// Alloc is what the allocator remembers of the fleet (allocate.go).
	Alloc SavedAllocation `json:"alloc,omitzero"`
}

// RuntimeKey is the meta key of a fleet's SavedRuntime.
func RuntimeKey(fleet string) string { return "runtime/" + fleet }

// Runtime is a fleet's memory between passes. The pass owns it (under the
// fleet's pass lock); the fields under mu are also read by View and
// written by notices.
type Runtime struct {
	SavedRuntime

	// What was last persisted, when, and its decisions part (everything
	// but the accumulating Progress.Done); see save.
	saved, savedDecisions []byte
	savedAt               time.Time
	// runSeconds are instance-seconds per offering key observed since
	// the offering records were last written.
	runSeconds map[string]float64
	// market is the providers' offerings, cached (observe.go).
	market      Market
	lastPass    time.Time
	plan        reconcile.Plan
	silentSince map[string]time.Time // running nodes missing from the rendezvous

	mu      sync.Mutex
	alerts  []reconcile.Alert
	notices map[string]interruption.Notice // by Notice.Key()
	// scale is the API's copy of the training progress and the size
	// decision (scale.go).
	scale *ScaleView
	// alloc is the fleet's allocation of the last decision; nil when
	// none applies (allocate.go).
	alloc *allocator.Allocation
	// hold caps its launches while GPUs allotted to it still run on
	// draining nodes (drainhold.go); nil: none.
	hold *drainHold
}

// flushEvery bounds how often a pass writes what only accumulates: the
// progress measure and the run-seconds accounting of the offering records.
// A crash loses at most this much of either (the run-seconds only weigh
// interruption rates over hours); decisions (fallback state, scale times)
// and everything else are written in the pass that makes them.
const flushEvery = 30 * time.Second

// entry returns a fleet's slot, creating it.
func (c *Controller) entry(name string) *entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.fleets[name]
	if !ok {
		e = &entry{}
		c.fleets[name] = e
	}
	return e
}

// runtime returns a fleet's runtime, loading its saved part from the
// store the first time.
func (c *Controller) runtime(name string) *Runtime {
	e := c.entry(name)
	c.mu.Lock()
	rt := e.rt
	c.mu.Unlock()
	if rt != nil {
		return rt
	}
	// Read without c.mu: the store may be slow (etcd), and API readers
	// must not wait on it.
	rt = &Runtime{notices: map[string]interruption.Notice{}, runSeconds: map[string]float64{}}
	_ = c.store.View(context.Background(), func(tx state.Tx) error {
		b, err := tx.Meta(RuntimeKey(name))
		if err == nil && len(b) > 0 && json.Unmarshal(b, &rt.SavedRuntime) == nil {
			rt.saved, rt.savedDecisions = b, rt.decisions()
		}
		return nil
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.rt != nil {
		return e.rt // another goroutine loaded it meanwhile
	}
	e.rt = rt
	return rt
}

// loaded returns a fleet's runtime if it is in memory.
func (c *Controller) loaded(name string) (*Runtime, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.fleets[name]; ok && e.rt != nil {
		return e.rt, true
	}
	return nil, false
}

// Runtime returns a fleet's runtime, loaded from the store if needed.
// Only the pass may change it; tests and tools read it.
func (c *Controller) Runtime(name string) *Runtime { return c.runtime(name) }

// Reset forgets every runtime, so each is loaded from the store again: a
// new leader term starts from what the previous leader saved.
func (c *Controller) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.fleets {
		e.rt = nil
	}
	// The ledger too: the next term reads what the last one saved.
	c.pool.mu.Lock()
	c.pool.ledger, c.pool.decision = nil, nil
	c.pool.mu.Unlock()
}

// forget drops a fleet's runtime (its fleet was destroyed).
func (c *Controller) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.fleets[name]; ok {
		e.rt = nil
	}
}

// decisions is the saved runtime without what accumulates every pass.
func (rt *Runtime) decisions() []byte {
	s := rt.SavedRuntime
	s.Progress.Done = 0
	s.Training = nil
	b, _ := json.Marshal(s)
	return b
}

// save persists a fleet's runtime and its run-seconds accounting in one
// transaction: at once when a decision changed (or force), otherwise at
// most every flushEvery, and never when nothing changed. A pass that
// changes nothing writes nothing.
func (c *Controller) save(ctx context.Context, name string, rt *Runtime, now time.Time, force bool) {
	b, err := json.Marshal(rt.SavedRuntime)
	if err != nil {
		c.log.Error("encode fleet runtime", "fleet", name, "err", err)
		return
	}
	dec := rt.decisions()
	changed := !bytes.Equal(b, rt.saved)
	decided := !bytes.Equal(dec, rt.savedDecisions)
	due := force || now.Sub(rt.savedAt) >= flushEvery
	if !decided && (!due || (!changed && len(rt.runSeconds) == 0)) {
		return
	}
	err = c.store.Update(ctx, func(tx state.Tx) error {
		if changed {
			if err := tx.SetMeta(RuntimeKey(name), b); err != nil {
				return err
			}
		}
		for k, s := range rt.runSeconds {
			r, err := tx.Offering(k)
			if err != nil {
				return err
			}
			r.RunSeconds += s
			if err := tx.PutOffering(r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("save fleet runtime; retried next pass", "fleet", name, "err", err)
		}
		return
	}
	rt.saved, rt.savedDecisions, rt.savedAt = b, dec, now
	clear(rt.runSeconds)
}

// Flush writes every fleet's pending runtime and accounting, for a clean
// shutdown (or the end of a leader term) to lose none of it.
func (c *Controller) Flush(ctx context.Context) {
	c.mu.Lock()
	names := make([]string, 0, len(c.fleets))
	for name, e := range c.fleets {
		if e.rt != nil {
			names = append(names, name)
		}
	}
	c.mu.Unlock()
	for _, name := range names {
		e := c.entry(name)
		e.pass.Lock()
		if rt, ok := c.loaded(name); ok {
			c.save(ctx, name, rt, c.now(), true)
		}
		e.pass.Unlock()
	}
	c.pool.saveLedger(ctx, c.now(), true)
}

// View is what the API and metrics read of a fleet's runtime: copies,
// safe to use without any lock.
type View struct {
	Alerts []reconcile.Alert
	// Scale is nil before the fleet's first pass with a live spec.
	Scale *ScaleView
	// Plan is the last pass's plan.
	Plan reconcile.Plan
	// Notices are the notices in force (their nodes still live).
	Notices int
	// Allocation is the allocator's last decision for the fleet, with
	// its reason; nil without projects or budgets.
	Allocation *allocator.Allocation
	// Waiting says which of its allotted nodes wait for draining nodes
	// to free their GPUs; "" when none waits.
	Waiting string
}

// View returns a fleet's view; false when the fleet has no runtime in
// memory (no pass yet on this server).
func (c *Controller) View(name string) (View, bool) {
	rt, ok := c.loaded(name)
	if !ok {
		return View{}, false
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return View{Alerts: append([]reconcile.Alert(nil), rt.alerts...), Scale: rt.scale, Plan: rt.plan, Notices: len(rt.notices), Allocation: rt.alloc, Waiting: rt.hold.why()}, true
}
