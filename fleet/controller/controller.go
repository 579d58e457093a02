// Package controller owns the running fleets: one Runtime per fleet (its
// memory between passes, with its own lock, loaded from and saved to the
// state store) and the reconcile pass over it, in this order:
//
//  1. observe (observe.go): the fleet's providers' instances and offerings,
//     the rendezvous membership, heartbeat silence and interruption notices;
//     a fleet whose record changed since it was read (a job that finished
//     or a destroy that began during the listing) is left to the next pass;
//  2. decide: the goodput autoscaler's size (scale.go), then the pure
//     reconciler (fleet/reconcile) turns all of it into a plan;
//  3. perform (perform.go): every node change of the plan is persisted
//     before anything acts on it, then the providers are called;
//  4. launch: the plan's launches, after the pass's decisions are saved.
//
// Before the fleets' passes, ReconcileAll runs the daemon-wide part once,
// when projects or budgets are configured: the pool (allocate.go,
// ledger.go) brings the budget ledger up to date and asks fleet/allocator
// how many nodes each fleet gets, which fleets wait and which pause; each
// pass then reconciles its fleet to that size.
//
// Notices (notice.go) enter from any goroutine; the pass of a fleet runs
// on one goroutine at a time. The controller runs only on the leader (a
// single server always leads); every write carries the leader term's
// fence through the store. It reaches the rest of the daemon only through
// the small interfaces below, so it is tested with the in-memory provider
// and an in-memory store.
//
// Lock order: a fleet's pass lock, then Controller.mu (the fleet table),
// then a Runtime's mu (what View reads). Neither mutex is held across I/O.
// The pool's mu comes after Controller.mu and is never held while taking
// a pass lock or Controller.mu.
package controller

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/projects"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/rendezvous"
)

// Store is the state store. Every committed write wakes the daemon's
// event followers (the daemon passes a store that does).
type Store interface {
	state.Store
	AppendEvents(ctx context.Context, events []state.Event) ([]state.Event, error)
}

// Providers hands out the providers a fleet names, with their config.
type Providers interface {
	Provider(ctx context.Context, f state.Fleet, name string) (providers.Provider, providers.Config, error)
}

// Specs decodes a fleet's stored spec.
type Specs interface {
	Spec(f state.Fleet) (*spec.Fleet, error)
}

// Rendezvous is what the pass asks of the rendezvous service.
type Rendezvous interface {
	Configure(ctx context.Context, fleet string, cfg rendezvous.Config) error
	Status(fleet string) (rendezvous.Status, error)
	Exclude(ctx context.Context, fleet, node, reason string) error
	ExcludeUntil(ctx context.Context, fleet, node, reason string, until time.Time) error
	Remove(ctx context.Context, fleet string) error
}

// Recorder takes what the pass measures (fleet/stats implements it).
type Recorder interface {
	// ProviderCall counts a provider call; known is the region the caller
	// knows ("" if none), cfg the call's config.
	ProviderCall(provider, op, known string, cfg providers.Config, err error)
	// OfferingsListed and Prices take a provider's fresh offerings
	// (on-demand prices; the sources and age of the prices the fleet uses).
	OfferingsListed(offs []providers.Offering)
	Prices(fleet, provider string, fl *spec.Fleet, offs []providers.Offering)
	// LaunchRequested, Notice and TrainingResumed feed the recovery
	// measurements; PassDone the pass duration.
	LaunchRequested(fleet, node string, at time.Time)
	Notice(fleet string, at time.Time)
	TrainingResumed(fleet string, start autoscale.RoundStart)
	PassDone(fleet string, dur time.Duration)
}

// Bootstrapper renders a node's #cloud-config document.
type Bootstrapper interface {
	UserData(fleet string, fl *spec.Fleet, n state.Node) (string, error)
}

// Options are a controller's handles and tuning.
type Options struct {
	Store     Store
	Providers Providers
	Specs     Specs
	// Rendezvous returns the rendezvous service, or nil between leader
	// terms (a follower runs none).
	Rendezvous func() Rendezvous
	Recorder   Recorder
	Boot       Bootstrapper
	// Servable drops the offerings whose architecture has no agent binary
	// (nil keeps them all).
	Servable func([]providers.Offering) []providers.Offering
	// MoveCost prices moving a fleet's checkpoint (nil: free).
	MoveCost func(*spec.Fleet) *placement.MoveCost
	// Destroyed is called when a destroyed fleet has been forgotten.
	Destroyed func(fleet string)
	// AfterPass runs after every pass over all fleets (the stray scan).
	AfterPass func(ctx context.Context, fleets []state.Fleet)

	DaemonID  string
	StartedAt time.Time
	Now       func() time.Time
	Logger    *slog.Logger
	// Tick is the periodic pass interval (default 2s).
	Tick      time.Duration
	Params    reconcile.Params
	Autoscale autoscale.Params
	// Projects are the daemon's projects (nil or empty: none; fleets are
	// sized on their own unless a fleet has a budget); Allocation tunes
	// the allocator (allocate.go).
	Projects *projects.Config
	// ProjectsNow, when set, is asked for the projects at each use
	// instead of Projects: an admin changes them while the daemon runs.
	ProjectsNow func() *projects.Config
	Allocation  allocator.Params
}

// Controller runs the reconcile passes of every fleet.
type Controller struct {
	opts  Options
	store Store
	log   *slog.Logger
	now   func() time.Time
	kickc chan struct{}

	mu     sync.Mutex // guards fleets (the table, not the runtimes)
	fleets map[string]*entry
	// pool is the allocation and the budget ledger (allocate.go).
	pool *pool
}

// entry is one fleet's slot: its pass lock and its runtime (nil until
// loaded; dropped by Reset when a new leader term starts).
type entry struct {
	pass sync.Mutex
	rt   *Runtime
}

// New returns a controller; Run drives it.
func New(o Options) *Controller {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Tick <= 0 {
		o.Tick = 2 * time.Second
	}
	if o.Projects == nil {
		o.Projects = &projects.Config{}
	}
	if o.ProjectsNow == nil {
		static := o.Projects
		o.ProjectsNow = func() *projects.Config { return static }
	}
	if o.Rendezvous == nil {
		o.Rendezvous = func() Rendezvous { return nil }
	}
	if o.Servable == nil {
		o.Servable = func(offs []providers.Offering) []providers.Offering { return offs }
	}
	if o.MoveCost == nil {
		o.MoveCost = func(*spec.Fleet) *placement.MoveCost { return nil }
	}
	c := &Controller{opts: o, store: o.Store, log: o.Logger, now: o.Now, kickc: make(chan struct{}, 1), fleets: map[string]*entry{}}
	c.pool = &pool{c: c}
	return c
}

// Kick asks for a pass now (after a change of desired or observed state).
func (c *Controller) Kick() {
	select {
	case c.kickc <- struct{}{}:
	default:
	}
}

// Run passes over every fleet at each tick (catches losses nobody
// announced) and kick, until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	t := time.NewTicker(c.opts.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kickc:
		case <-t.C:
		}
		c.ReconcileAll(ctx)
	}
}

// ReconcileAll runs one pass over every fleet, concurrently.
func (c *Controller) ReconcileAll(ctx context.Context) {
	fleets, err := state.Read(ctx, c.store, state.Tx.Fleets)
	if err != nil {
		c.log.Error("reconcile: list fleets", "err", err)
		return
	}
	c.pool.allocate(ctx, fleets)
	var wg sync.WaitGroup
	for _, f := range fleets {
		wg.Go(func() {
			start := time.Now()
			if err := c.Reconcile(ctx, f); err != nil && ctx.Err() == nil {
				c.log.Error("reconcile", "fleet", f.Name, "err", err)
			}
			c.opts.Recorder.PassDone(f.Name, time.Since(start))
		})
	}
	wg.Wait()
	if c.opts.AfterPass != nil {
		c.opts.AfterPass(ctx, fleets)
	}
}

// rz is the rendezvous service now; nil between terms.
func (c *Controller) rz() Rendezvous { return c.opts.Rendezvous() }

// appendEvent records one event; a failure is logged, not returned (the
// pass goes on).
func (c *Controller) appendEvent(ctx context.Context, e state.Event) {
	if _, err := c.store.AppendEvents(ctx, []state.Event{e}); err != nil && !errors.Is(err, context.Canceled) {
		c.log.Error("append event", "type", e.Type, "err", err)
	}
}

// provider is the fleet's provider name with its config.
func (c *Controller) provider(ctx context.Context, f state.Fleet, name string) (providers.Provider, providers.Config, error) {
	return c.opts.Providers.Provider(ctx, f, name)
}

// countCall counts a provider call (Recorder.ProviderCall).
func (c *Controller) countCall(provider, op, known string, cfg providers.Config, err error) {
	c.opts.Recorder.ProviderCall(provider, op, known, cfg, err)
}
