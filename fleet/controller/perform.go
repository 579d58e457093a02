package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/spend"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/rendezvous"
)

// Perform persists a plan's node changes, then performs its actions in
// order, all but the launches and alerts, which it returns: the caller
// records the pass's decisions, then calls Launch. Launches run
// concurrently after the other actions: each persists its own records, and
// a slow cloud call must not hold up a replacement elsewhere.
func (c *Controller) Perform(ctx context.Context, f state.Fleet, in reconcile.Input, plan reconcile.Plan) (launches []reconcile.Launch, alerts []reconcile.Alert, err error) {
	now := in.Now
	// Every node change of the plan is persisted first, in one durable
	// transaction (one fsync, however many nodes an interruption storm
	// touches); only then does anything act on them. A plan without any
	// (most passes) costs no transaction: bbolt would fsync even an empty one.
	changes := slices.ContainsFunc(plan.Actions, func(a reconcile.Action) bool {
		switch a.(type) {
		case reconcile.Transition, reconcile.Adopt:
			return true
		}
		return false
	})
	var prevNodes map[string]state.NodeState // built for the first Adopt
	if err := c.updateIf(ctx, changes, func(tx state.Tx) error {
		for _, a := range plan.Actions {
			switch a := a.(type) {
			case reconcile.Transition:
				if err := tx.PutNode(a.Node); err != nil {
					return fmt.Errorf("persist %s: %w", a.Node.ID, err)
				}
				if _, err := tx.AppendEvent(transitionEvent(a.Node, a.From, a.Reason)); err != nil {
					return err
				}
			case reconcile.Adopt:
				if err := tx.PutNode(a.Node); err != nil {
					return fmt.Errorf("persist %s: %w", a.Node.ID, err)
				}
				if prevNodes == nil {
					prevNodes = make(map[string]state.NodeState, len(in.Nodes))
					for _, n := range in.Nodes {
						prevNodes[n.ID] = n.State
					}
				}
				if from := prevNodes[a.Node.ID]; from != a.Node.State {
					if _, err := tx.AppendEvent(transitionEvent(a.Node, from, a.Reason)); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	for _, a := range plan.Actions {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		switch a := a.(type) {
		case reconcile.Transition, reconcile.Adopt:
			// Persisted above.
		case reconcile.Launch:
			launches = append(launches, a)
		case reconcile.Terminate:
			p, cfg, err := c.provider(ctx, f, a.Provider)
			if err != nil {
				c.log.Warn("terminate", "node", a.NodeID, "err", err)
				continue
			}
			tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			err = p.Delete(tctx, cfg, a.InstanceID)
			cancel()
			c.countCall(a.Provider, "delete", "", cfg, err)
			if err != nil {
				c.log.Warn("terminate failed; retried next pass", "node", a.NodeID, "instance", a.InstanceID, "err", err)
			}
		case reconcile.DeleteOrphan:
			p, cfg, err := c.provider(ctx, f, a.Instance.Offering.Provider)
			if err != nil {
				continue
			}
			err = p.Delete(ctx, cfg, a.Instance.ID)
			c.countCall(a.Instance.Offering.Provider, "delete", a.Instance.Offering.Region, cfg, err)
			c.appendEvent(ctx, state.Event{Fleet: f.Name, Type: "orphan.deleted", Message: a.String(), Data: map[string]string{"instance": a.Instance.ID}})
		case reconcile.MarkUnavailable:
			if err := c.markUnavailable(ctx, a, now); err != nil {
				return nil, nil, err
			}
		case reconcile.Alert:
			alerts = append(alerts, a)
		case reconcile.Drain:
			if err := c.exclude(ctx, f.Name, a.NodeID, a.Reason); err != nil && !errors.Is(err, rendezvous.ErrUnknownFleet) {
				c.log.Warn("rendezvous exclude", "node", a.NodeID, "err", err)
			}
		case reconcile.ForgetNode:
			if err := c.store.Update(ctx, func(tx state.Tx) error {
				// Its spend moves to the fleet's persisted total, so
				// fleetd_spend_usd_total does not drop with the record.
				if n, err := tx.Node(f.Name, a.NodeID); err == nil {
					if err := spend.AddForgotten(tx, n, now); err != nil {
						return err
					}
				}
				if err := tx.DeleteNode(f.Name, a.NodeID); err != nil && !errors.Is(err, state.ErrNotFound) {
					return err
				}
				_, err := tx.AppendEvent(state.Event{Fleet: f.Name, Node: a.NodeID, Type: "node.forgotten", Message: a.Reason})
				return err
			}); err != nil {
				return nil, nil, err
			}
		}
	}
	return launches, alerts, nil
}

// Launch runs a plan's launches (from Perform) after the caller recorded
// the pass's decisions: their records first, in one durable transaction,
// then the provider calls, at most 16 at a time.
func (c *Controller) Launch(ctx context.Context, f state.Fleet, fl *spec.Fleet, in reconcile.Input, plan reconcile.Plan, launches []reconcile.Launch) error {
	now := in.Now
	// A launch while some node has ended or is draining replaces it: only
	// those count as replacement-requested → joined recoveries.
	replacing := false
	for _, n := range in.Nodes {
		switch n.State {
		case state.NodeDraining, state.NodeTerminating, state.NodeTerminated, state.NodeFailed:
			replacing = true
		}
	}
	for _, a := range plan.Actions {
		if t, ok := a.(reconcile.Transition); ok && (t.To == state.NodeDraining || t.To == state.NodeFailed || t.To == state.NodeTerminated) {
			replacing = true
		}
	}
	if len(launches) == 0 {
		return nil
	}
	// Every launch's new record (requested) and launch decision
	// (provisioning) in one durable transaction, before any Create: a
	// storm's hundreds of launches must not each wait for an fsync.
	if err := c.store.Update(ctx, func(tx state.Tx) error {
		for _, l := range launches {
			if err := launchStartTx(tx, l, now); err != nil {
				return fmt.Errorf("launch %s: %w", l.Node.ID, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	outcomes := c.groupCommitter(ctx)
	defer close(outcomes)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16) // bounds concurrent provider calls
	for _, l := range launches {
		wg.Add(1)
		sem <- struct{}{}
		go func(l reconcile.Launch) {
			defer wg.Done()
			if err := c.launch(ctx, f, fl, l, now, replacing, sem, outcomes); err != nil && ctx.Err() == nil {
				c.log.Error("launch", "node", l.Node.ID, "err", err)
			}
		}(l)
	}
	wg.Wait()
	return nil
}

// groupedUpdate is a transaction body waiting to be committed with others.
type groupedUpdate struct {
	fn   func(state.Tx) error
	done chan error
}

// groupCommitter commits the bodies sent on the returned channel until it is
// closed: whatever queued up during one commit goes into the next, as one
// durable transaction. If that transaction fails, each body is retried on
// its own so that one bad body does not fail the others.
func (c *Controller) groupCommitter(ctx context.Context) chan<- groupedUpdate {
	in := make(chan groupedUpdate)
	go func() {
		for first := range in {
			batch := []groupedUpdate{first}
		drain:
			for len(batch) < 256 {
				select {
				case g, ok := <-in:
					if !ok {
						break drain
					}
					batch = append(batch, g)
				default:
					break drain
				}
			}
			err := c.store.Update(ctx, func(tx state.Tx) error {
				for _, g := range batch {
					if err := g.fn(tx); err != nil {
						return err
					}
				}
				return nil
			})
			for _, g := range batch {
				if err != nil && len(batch) > 1 {
					g.done <- c.store.Update(ctx, g.fn)
				} else {
					g.done <- err
				}
			}
		}
	}()
	return in
}

// launchStartTx stores a launch's new record and its provisioning state.
func launchStartTx(tx state.Tx, l reconcile.Launch, now time.Time) error {
	n := l.Node
	prov := reconcile.StartLaunch(n, now)
	if !l.Relaunch {
		if err := tx.PutNode(n); err != nil {
			return err
		}
		if _, err := tx.AppendEvent(transitionEvent(n, "", l.Reason)); err != nil {
			return err
		}
	}
	if err := tx.PutNode(prov); err != nil {
		return err
	}
	_, err := tx.AppendEvent(transitionEvent(prov, n.State, prov.Reason))
	return err
}

// exclude drains a node from its fleet's rendezvous (none between terms).
func (c *Controller) exclude(ctx context.Context, fleet, node, reason string) error {
	if rz := c.rz(); rz != nil {
		return rz.Exclude(ctx, fleet, node, reason)
	}
	return nil
}

func (c *Controller) markUnavailable(ctx context.Context, a reconcile.MarkUnavailable, now time.Time) error {
	return c.store.Update(ctx, func(tx state.Tx) error { return markUnavailableTx(tx, a, now) })
}

// markUnavailableTx applies a MarkUnavailable to its offering record, with
// its event.
func markUnavailableTx(tx state.Tx, a reconcile.MarkUnavailable, now time.Time) error {
	rec, err := tx.Offering(a.Key)
	if err != nil {
		return err
	}
	rec = placement.MarkUnavailable(rec, now, a.Reason, a.Kind)
	if err := tx.PutOffering(rec); err != nil {
		return err
	}
	_, err = tx.AppendEvent(state.Event{Type: "offering.unavailable", Message: a.String(),
		Data: map[string]string{"offering": a.Key, "kind": string(a.Kind), "until": rec.UnavailableUntil.UTC().Format(time.RFC3339)}})
	return err
}

// updateIf is update when cond holds, and nothing otherwise.
func (c *Controller) updateIf(ctx context.Context, cond bool, fn func(state.Tx) error) error {
	if !cond {
		return nil
	}
	return c.store.Update(ctx, fn)
}

// transitionEvent is the event of a node state change.
func transitionEvent(n state.Node, from state.NodeState, reason string) state.Event {
	return state.Event{Fleet: n.Fleet, Node: n.ID, Type: "node.transition",
		Message: fmt.Sprintf("%s → %s: %s", from, n.State, reason),
		Data:    map[string]string{"from": string(from), "to": string(n.State), "offering": n.Offering.Key()}}
}

// putLaunchOutcomeTx is putNodeTx for a launch's outcome. A launch the
// market refused (capacity, quota: the offering is marked unavailable) says
// so in its event, so the boot-failure alert, which is about images and
// setup, does not count it; those conditions have alerts of their own.
func putLaunchOutcomeTx(tx state.Tx, res reconcile.LaunchResult, from state.NodeState) error {
	if err := tx.PutNode(res.Node); err != nil {
		return err
	}
	if from == res.Node.State {
		return nil
	}
	ev := transitionEvent(res.Node, from, res.Node.Reason)
	if res.Mark != nil {
		ev.Data["unavailable"] = string(res.Mark.Kind)
	}
	_, err := tx.AppendEvent(ev)
	return err
}

// putNodeTx stores a node with its transition event.
func putNodeTx(tx state.Tx, n state.Node, from state.NodeState, reason string) error {
	if err := tx.PutNode(n); err != nil {
		return err
	}
	if from != n.State {
		_, err := tx.AppendEvent(transitionEvent(n, from, reason))
		return err
	}
	return nil
}

// launch executes one Launch action whose start Launch has persisted:
// render user-data, call Create, free its slot in sem, and have outcomes
// commit the result.
func (c *Controller) launch(ctx context.Context, f state.Fleet, fl *spec.Fleet, l reconcile.Launch, now time.Time, replacing bool,
	sem <-chan struct{}, outcomes chan<- groupedUpdate) error {
	n := l.Node
	prov := reconcile.StartLaunch(n, now)
	freed := false
	free := func() {
		if !freed {
			freed = true
			<-sem
		}
	}
	defer free()
	if !l.Relaunch && replacing {
		c.opts.Recorder.LaunchRequested(f.Name, n.ID, now)
	}
	p, cfg, err := c.provider(ctx, f, l.Offering.Provider)
	var created []providers.Instance
	if err == nil {
		var ud string
		ud, err = c.opts.Boot.UserData(f.Name, fl, prov)
		if err == nil {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			who := reconcile.FleetIdentity(f, c.opts.DaemonID)
			created, err = p.Create(lctx, cfg, providers.LaunchRequest{
				Offering: l.Offering, Count: 1, UserData: ud, IdempotencyToken: who.Token(n.ID), Tags: who.Tags(n.ID),
				Network: l.Network,
			})
			cancel()
			if err == nil {
				// Never record an instance this incarnation does not own,
				// even if the provider answered the token with one.
				if err = who.CheckLaunched(n.ID, created); err != nil {
					created = nil
				}
			}
		}
		c.countCall(l.Offering.Provider, "create", l.Offering.Region, cfg, err)
	}
	free() // the provider call is done: the next launch may start
	after := c.now()
	res := reconcile.AfterLaunch(prov, created, err, after)
	// The outcome, its offering mark and the launch record in one durable
	// transaction, shared with the outcomes of concurrent launches (a
	// storm launches hundreds, and every commit waits for the one before).
	done := make(chan error, 1)
	outcomes <- groupedUpdate{done: done, fn: func(tx state.Tx) error {
		if err := putLaunchOutcomeTx(tx, res, prov.State); err != nil {
			return err
		}
		if res.Mark != nil {
			if err := markUnavailableTx(tx, *res.Mark, after); err != nil {
				return err
			}
		}
		if !res.Succeeded {
			return nil
		}
		rec, err := tx.Offering(l.Offering.Key())
		if err != nil {
			return err
		}
		return tx.PutOffering(placement.RecordLaunch(rec, after))
	}}
	if perr := <-done; perr != nil {
		return perr
	}
	if err != nil {
		return fmt.Errorf("create %s on %s: %w", n.ID, l.Offering.Key(), err)
	}
	return nil
}
