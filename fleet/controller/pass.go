package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/spend"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/rendezvous"
)

// RendezvousConfig is the rendezvous configuration of a fleet's spec.
func RendezvousConfig(fl *spec.Fleet) rendezvous.Config {
	return rendezvous.Config{MinNodes: fl.MinNodes, MaxNodes: fl.MaxNodes, LastCall: fl.Rendezvous.LastCall,
		Heartbeat: fl.Rendezvous.Heartbeat, DeadAfter: fl.Rendezvous.DeadAfter, MasterPort: fl.Training.MasterPort}
}

// Reconcile runs one pass over fleet f: observe, decide, perform, launch
// (see the package comment), persisting every node change before acting
// on it. Passes of one fleet never overlap.
func (c *Controller) Reconcile(ctx context.Context, f state.Fleet) error {
	e := c.entry(f.Name)
	e.pass.Lock()
	defer e.pass.Unlock()
	fl, err := c.opts.Specs.Spec(f)
	if err != nil {
		return err
	}
	now := c.now()
	rt := c.runtime(f.Name)
	rz := c.rz()
	live := !f.Destroying && !f.Completed
	if rz != nil && live {
		if err := rz.Configure(ctx, f.Name, RendezvousConfig(fl)); err != nil {
			c.log.Warn("rendezvous configure", "fleet", f.Name, "err", err)
		}
	}

	// 1. Observe: the records, the providers, the rendezvous, notices.
	// The pass only reads the records (reconcile copies what it changes),
	// so it takes the store's shared copy of them.
	var nodes []state.Node
	records := map[string]state.OfferingRecord{}
	err = c.store.View(ctx, func(tx state.Tx) error {
		var err error
		if nodes, err = tx.SharedNodes(f.Name); err != nil {
			return err
		}
		recs, err := tx.Offerings()
		for _, r := range recs {
			records[r.Key] = r
		}
		return err
	})
	if err != nil {
		return err
	}
	c.seedSpotHistory(ctx, rt, now)
	in := reconcile.Input{Fleet: fl, Destroying: f.Destroying || f.Completed, Finished: f.Completed && !f.Destroying, Name: f.Name, Generation: f.Generation, DaemonID: c.opts.DaemonID,
		Incarnation: f.Incarnation, LegacyUntagged: f.LegacyUntagged, NewNodeID: reconcile.NodeIDs(f.Name, f.Incarnation, nodes, state.RandomID),
		Nodes: nodes, ObservedOK: map[string]bool{}, Records: records, Now: now, StartedAt: c.opts.StartedAt,
		LastScaleUp: rt.LastScaleUp, LastScaleDown: rt.LastScaleDown, Fallback: rt.Fallback,
		Joined: map[string]bool{}, InRound: map[string]bool{}, Params: c.opts.Params}
	in.Move = c.opts.MoveCost(fl)
	c.observe(ctx, f, &rt.market, &in)
	// f was read before the listing. A job that finished meanwhile has its
	// agents power their VMs off, and a destroy that began meanwhile ends
	// nodes: judged by the old record, those would be losses, replaced by
	// new launches. If the record moved on, the next pass decides.
	if moved, err := fleetMoved(ctx, c.store, f); err != nil || moved {
		if moved {
			c.Kick()
		}
		return err
	}

	// Membership as the rendezvous sees it; heartbeat silence is a notice.
	// Nodes recorded joined or running need not be in in.Joined: the
	// reconciler only asks it about booting nodes.
	var rst *rendezvous.Status
	if rz != nil {
		if st, err := rz.Status(f.Name); err == nil {
			rst = &st
			member := make(map[string]bool, len(st.Members))
			in.Joined = make(map[string]bool, len(st.Members))
			for _, m := range st.Members {
				member[m.NodeID] = true
				in.Joined[m.NodeID] = true
				if m.GroupRank != nil && st.State == rendezvous.RoundClosed {
					in.InRound[m.NodeID] = true
				}
			}
			if live {
				c.heartbeatLoss(ctx, f.Name, fl, rt, nodes, member, now)
			}
		}
	}
	// Instances the provider itself reports as interrupted or gone become
	// notices; the notices in force go into the input.
	c.noticeInterrupted(ctx, f, &in)
	in.Notices = rt.liveNotices(nodes)

	// 2. Decide. Work advances while a round is closed, at (world nodes /
	// max_nodes) or the measured throughput's share of max_nodes'.
	if rt.Progress.Start.IsZero() {
		rt.Progress.Start = f.CreatedAt
	}
	if !rt.lastPass.IsZero() && rst != nil && fl.MaxNodes > 0 {
		if st := rst; st.State == rendezvous.RoundClosed && st.Nodes >= fl.MinNodes {
			rt.Progress.Done += time.Duration(float64(now.Sub(rt.lastPass)) * progressRate(rt, st.Round, st.Nodes, fl.MaxNodes))
		}
	}
	in.Progress = rt.Progress
	if live {
		c.autoscale(ctx, f, fl, rt, nodes, rst, &in)
		capAllocation(rt, &in)
	}
	rt.countRunSeconds(nodes, now)
	// Progress and run-seconds are counted up to now whatever happens to
	// this pass's plan, so the next pass must not count them again.
	rt.lastPass = now
	plan := reconcile.Reconcile(in)
	rt.mu.Lock()
	rt.plan = plan
	rt.mu.Unlock()

	// 3. Perform, record the decisions, 4. launch.
	launches, alerts, err := c.Perform(ctx, f, in, plan)
	if err != nil {
		return err
	}
	c.setAlerts(ctx, f.Name, rt, alerts)
	if plan.ScaledUp {
		rt.LastScaleUp = now
	}
	if plan.ScaledDown {
		rt.LastScaleDown = now
	}
	c.noteSpotHistory(ctx, rt.Fallback.Spot, plan.Fallback.Spot, now)
	rt.Fallback = plan.Fallback
	c.save(ctx, f.Name, rt, now, f.Destroying)
	if err := c.Launch(ctx, f, fl, in, plan, launches); err != nil {
		return err
	}
	if f.Destroying {
		c.ReleaseNetwork(ctx, f, in) // placement groups: docs/placement.md, Networking
		return c.finishDestroy(ctx, f.Name, in)
	}
	return nil
}

// fleetMoved reports whether f's record has changed in what a pass decides
// by (finished, destroying, its spec, its incarnation) or is gone.
func fleetMoved(ctx context.Context, st Store, f state.Fleet) (bool, error) {
	cur, err := state.Read(ctx, st, func(tx state.Tx) (state.Fleet, error) { return tx.Fleet(f.Name) })
	switch {
	case errors.Is(err, state.ErrNotFound):
		return true, nil
	case err != nil:
		return false, err
	}
	return cur.Completed != f.Completed || cur.Destroying != f.Destroying ||
		cur.Generation != f.Generation || cur.Incarnation != f.Incarnation, nil
}

// liveNotices drops the notices whose nodes ended (a notice lives while
// its node does) and returns the others, sorted.
func (rt *Runtime) liveNotices(nodes []state.Node) []interruption.Notice {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if len(rt.notices) == 0 {
		return nil
	}
	alive := make(map[string]bool, len(nodes))
	for _, nd := range nodes {
		alive[nd.ID] = nd.State != state.NodeTerminated && nd.State != state.NodeFailed
	}
	var out []interruption.Notice
	for key, n := range rt.notices {
		if !alive[n.Node] {
			delete(rt.notices, key)
			continue
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// countRunSeconds accounts instance-seconds per offering since the last
// pass, for the interruption rates; save writes them to the offering
// records.
func (rt *Runtime) countRunSeconds(nodes []state.Node, now time.Time) {
	if rt.lastPass.IsZero() {
		return
	}
	dt := now.Sub(rt.lastPass).Seconds()
	var key string
	var prev providers.Offering
	for _, n := range nodes {
		if n.State == state.NodeRunning || n.State == state.NodeJoined {
			if key == "" || n.Offering != prev { // nodes share a few offerings: one key per run of them
				key, prev = n.Offering.Key(), n.Offering
			}
			rt.runSeconds[key] += dt
		}
	}
}

// heartbeatLoss turns a long agent silence into a "lost" notice. The
// rendezvous already dropped the node after dead_after (the survivors went
// on without it); the node is replaced only when its agent stays silent far
// longer (3 × dead_after): a short partition must not cost a node, a hung
// or unreachable VM must not hold a slot forever.
func (c *Controller) heartbeatLoss(ctx context.Context, fleetName string, fl *spec.Fleet, rt *Runtime, nodes []state.Node, member map[string]bool, now time.Time) {
	limit := 3 * fl.Rendezvous.DeadAfter
	if rt.silentSince == nil {
		rt.silentSince = map[string]time.Time{}
	}
	var lost []string
	for _, n := range nodes {
		if n.State != state.NodeRunning || member[n.ID] {
			delete(rt.silentSince, n.ID)
			continue
		}
		since, ok := rt.silentSince[n.ID]
		if !ok {
			rt.silentSince[n.ID] = now
			continue
		}
		if now.Sub(since) >= limit {
			lost = append(lost, n.ID)
		}
	}
	for _, id := range lost {
		_ = c.HandleNotice(ctx, fleetName, interruption.Notice{Node: id, Kind: interruption.Lost, Source: "heartbeat",
			Detail: fmt.Sprintf("agent silent and out of the rendezvous for over %s", limit)})
	}
}

// progressRate is how fast work (time at max_nodes) advances in a closed
// round of nodes: the measured throughput over max_nodes' when the
// workers report progress and the autoscaler knows both, else nodes over
// max_nodes (every node counted alike: round timing).
func progressRate(rt *Runtime, round, nodes, maxNodes int) float64 {
	lin := float64(nodes) / float64(maxNodes)
	tr := rt.Training
	rt.mu.Lock()
	v := rt.scale
	rt.mu.Unlock()
	if tr == nil || tr.Latest == nil || tr.Latest.Round != round || tr.Latest.SamplesPerSec <= 0 || v == nil {
		return lin
	}
	for _, o := range v.Decision.Options {
		if o.Nodes == maxNodes && o.SamplesPerSec > 0 {
			return min(tr.Latest.SamplesPerSec/o.SamplesPerSec, 2)
		}
	}
	return lin
}

// setAlerts replaces a fleet's alerts, logging the new ones as events.
func (c *Controller) setAlerts(ctx context.Context, fleetName string, rt *Runtime, alerts []reconcile.Alert) {
	rt.mu.Lock()
	old := map[string]bool{}
	for _, a := range rt.alerts {
		old[a.Kind+"/"+a.Subject] = true
	}
	rt.alerts = alerts
	rt.mu.Unlock()
	for _, a := range alerts {
		if !old[a.Kind+"/"+a.Subject] {
			c.appendEvent(ctx, state.Event{Fleet: fleetName, Type: "alert", Message: a.Message, Data: map[string]string{"kind": a.Kind, "subject": a.Subject}})
		}
	}
}

// finishDestroy forgets a destroyed fleet once nothing of it is left.
func (c *Controller) finishDestroy(ctx context.Context, name string, in reconcile.Input) error {
	// Only this incarnation's instances hold the destroy up: another
	// daemon's fleet of the same name, or a leftover of an earlier
	// incarnation, is not ours to wait for (or to delete).
	who := in.Identity()
	for _, inst := range in.Instances {
		if inst.State != providers.StateTerminated && who.Of(inst) == reconcile.Ours {
			return nil
		}
	}
	forgotten := false
	err := c.store.Update(ctx, func(tx state.Tx) error {
		nodes, err := tx.Nodes(name)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.State != state.NodeTerminated && n.State != state.NodeFailed {
				return nil
			}
		}
		f, err := tx.Fleet(name)
		if err != nil {
			return err
		}
		if err := spend.RecordDestroyed(tx, f, c.now()); err != nil {
			return err
		}
		if err := tx.DeleteFleet(name); err != nil {
			return err
		}
		_ = tx.SetMeta(RuntimeKey(name), nil)
		_ = spend.ForgetFleet(tx, name)
		forgotten = true
		_, err = tx.AppendEvent(state.Event{Fleet: name, Incarnation: f.Incarnation, Type: "fleet.destroyed",
			Message: fmt.Sprintf("fleet %s destroyed (incarnation %s; its events and logs stay under that id)", name, f.Incarnation)})
		return err
	})
	if err != nil || !forgotten {
		return err
	}
	if rz := c.rz(); rz != nil {
		_ = rz.Remove(ctx, name)
	}
	c.forget(name)
	if c.opts.Destroyed != nil {
		c.opts.Destroyed(name)
	}
	return nil
}
