package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/rendezvous"
)

// savedRuntime is the part of a fleet's runtime that survives a restart,
// persisted in meta under runtimeKey (see saveRuntime for when).
type savedRuntime struct {
	Fallback      placement.FallbackState `json:"fallback"`
	LastScaleUp   time.Time               `json:"last_scale_up,omitzero"`
	LastScaleDown time.Time               `json:"last_scale_down,omitzero"`
	// Progress is the training work done (in time at max_nodes), measured
	// from the rendezvous: the deadline policy needs it.
	Progress placement.Progress `json:"progress"`
	// Training is what the workers' progress reports measured: throughput
	// per round and size, the latest report, a chart series (autoscaler.go).
	Training *autoscale.Tracker `json:"training,omitempty"`
	// Scale is the autoscaler's decision state.
	Scale autoscale.State `json:"scale,omitzero"`
}

// fleetRuntime is the controller's per-fleet memory between passes.
type fleetRuntime struct {
	savedRuntime

	// What was last persisted, when, and its decisions part (everything
	// but the accumulating Progress.Done); see saveRuntime.
	saved, savedDecisions []byte
	savedAt               time.Time
	// runSeconds are instance-seconds per offering key observed since
	// the offering records were last written.
	runSeconds map[string]float64

	alerts      []reconcile.Alert
	notices     map[string]interruption.Notice // by Notice.Key()
	offerings   map[string][]providers.Offering
	offeringsAt map[string]time.Time
	lastPass    time.Time
	plan        reconcile.Plan
	silentSince map[string]time.Time // running nodes missing from the rendezvous
	// view is the API's copy of the training progress and the size
	// decision (autoscaler.go); read under rtMu.
	view *scaleView
}

func runtimeKey(fleet string) string { return "runtime/" + fleet }

// runtimeFlushEvery bounds how often a pass writes what only accumulates:
// the progress measure and the run-seconds accounting of the offering
// records. A crash loses at most this much of either (the run-seconds only
// weigh interruption rates over hours); decisions (fallback state, scale
// times) and everything else are written in the pass that makes them.
const runtimeFlushEvery = 30 * time.Second

// offeringsTTL bounds how stale the market view may be; capacity errors
// reach placement through the unavailable cache at once anyway.
const offeringsTTL = 30 * time.Second

func (d *Daemon) runtime(name string) *fleetRuntime {
	d.rtMu.Lock()
	rt, ok := d.runtimes[name]
	d.rtMu.Unlock()
	if ok {
		return rt
	}
	// Read the saved runtime without rtMu: API readers take rtMu inside
	// their store transactions, so holding it across one inverts the
	// lock order.
	rt = &fleetRuntime{notices: map[string]interruption.Notice{}, offerings: map[string][]providers.Offering{}, offeringsAt: map[string]time.Time{},
		runSeconds: map[string]float64{}}
	_ = d.store.View(context.Background(), func(tx state.Tx) error {
		b, err := tx.Meta(runtimeKey(name))
		if err == nil && len(b) > 0 && json.Unmarshal(b, &rt.savedRuntime) == nil {
			rt.saved, rt.savedDecisions = b, rt.decisions()
		}
		return nil
	})
	d.rtMu.Lock()
	defer d.rtMu.Unlock()
	if first, ok := d.runtimes[name]; ok {
		return first // another goroutine loaded it meanwhile
	}
	d.runtimes[name] = rt
	return rt
}

// HandleNotice takes an interruption notice from any source. Notices are
// idempotent by node+kind; the first one excludes the node from the next
// rendezvous round at once (survivors restart before it dies) and wakes the
// reconciler, which drains it and launches its replacement.
func (d *Daemon) HandleNotice(ctx context.Context, fleetName string, n interruption.Notice) error {
	if err := n.Validate(); err != nil {
		return err
	}
	var node state.Node
	err := d.store.View(ctx, func(tx state.Tx) error {
		var err error
		node, err = tx.Node(fleetName, n.Node)
		return err
	})
	if err != nil {
		return fmt.Errorf("notice for %s/%s: %w", fleetName, n.Node, err)
	}
	if n.Instance == "" {
		n.Instance = node.InstanceID
	}
	rt := d.runtime(fleetName)
	d.rtMu.Lock()
	_, dup := rt.notices[n.Key()]
	if !dup {
		rt.notices[n.Key()] = n
	}
	d.rtMu.Unlock()
	if dup {
		return nil
	}
	if n.Kind.Terminal() {
		d.noteNotice(fleetName, d.now())
	}
	msg := fmt.Sprintf("%s notice for %s from %s", n.Kind, n.Node, n.Source)
	if !n.Deadline.IsZero() {
		msg += fmt.Sprintf(", deadline in %s", n.Deadline.Sub(d.now()).Round(time.Second))
	}
	// Batched: a storm's concurrent notices share one transaction and one
	// fsync instead of queueing behind each other's.
	if _, err := d.store.AppendEvents(ctx, []state.Event{{Fleet: fleetName, Node: n.Node, Type: "notice", Message: msg,
		Data: map[string]string{"kind": string(n.Kind), "source": n.Source}}}); err != nil {
		d.log.Error("append event", "type", "notice", "err", err)
	} else {
		d.notifyEvents()
	}
	if n.Kind.Terminal() && d.rz() != nil {
		// The deadline travels with the round change: every node's workers
		// bound their checkpoint by it (docs/agent.md, "Checkpoint on notice").
		if err := d.rz().ExcludeUntil(ctx, fleetName, n.Node, string(n.Kind)+" notice", n.Deadline); err != nil && !errors.Is(err, rendezvous.ErrUnknownFleet) {
			d.log.Warn("rendezvous exclude", "fleet", fleetName, "node", n.Node, "err", err)
		}
	}
	d.kick()
	return nil
}

// heartbeatLoss turns a long agent silence into a "lost" notice. The
// rendezvous already dropped the node after dead_after (the survivors went
// on without it); the node is replaced only when its agent stays silent far
// longer (3 × dead_after): a short partition must not cost a node, a hung
// or unreachable VM must not hold a slot forever.
func (d *Daemon) heartbeatLoss(ctx context.Context, fleetName string, fl *spec.Fleet, nodes []state.Node, member map[string]bool, now time.Time) {
	limit := 3 * fl.Rendezvous.DeadAfter
	rt := d.runtime(fleetName)
	d.rtMu.Lock()
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
	d.rtMu.Unlock()
	for _, id := range lost {
		_ = d.HandleNotice(ctx, fleetName, interruption.Notice{Node: id, Kind: interruption.Lost, Source: "heartbeat",
			Detail: fmt.Sprintf("agent silent and out of the rendezvous for over %s", limit)})
	}
}

// reconcileAll runs one pass over every fleet.
func (d *Daemon) reconcileAll(ctx context.Context) {
	var fleets []state.Fleet
	if err := d.store.View(ctx, func(tx state.Tx) error {
		var err error
		fleets, err = tx.Fleets()
		return err
	}); err != nil {
		d.log.Error("reconcile: list fleets", "err", err)
		return
	}
	var wg sync.WaitGroup
	for _, f := range fleets {
		wg.Add(1)
		go func(f state.Fleet) {
			defer wg.Done()
			start := time.Now()
			if err := d.reconcileFleet(ctx, f); err != nil && ctx.Err() == nil {
				d.log.Error("reconcile", "fleet", f.Name, "err", err)
			}
			d.observeReconcile(f.Name, time.Since(start))
		}(f)
	}
	wg.Wait()
}

// providerFor returns the fleet's provider and its config.
func (d *Daemon) providerFor(ctx context.Context, f state.Fleet, name string) (providers.Provider, providers.Config, error) {
	if d.opts.Providers == nil {
		return nil, providers.Config{}, errors.New("no providers configured")
	}
	fl, err := d.fleetSpec(f)
	if err != nil {
		return nil, providers.Config{}, err
	}
	pb, ok := fl.Provider(name)
	if !ok {
		return nil, providers.Config{}, fmt.Errorf("fleet %s has no provider %q block", f.Name, name)
	}
	p, err := d.opts.Providers.Get(ctx, name)
	if err != nil {
		return nil, providers.Config{}, fmt.Errorf("provider %s: %w", name, err)
	}
	return p, providers.Config{Fleet: f.Name, Raw: pb.Config}, nil
}

func rendezvousConfig(fl *spec.Fleet) rendezvous.Config {
	return rendezvous.Config{MinNodes: fl.MinNodes, MaxNodes: fl.MaxNodes, LastCall: fl.Rendezvous.LastCall,
		Heartbeat: fl.Rendezvous.Heartbeat, DeadAfter: fl.Rendezvous.DeadAfter, MasterPort: fl.Training.MasterPort}
}

// reconcileFleet observes one fleet, asks the reconciler for a plan and
// executes it, persisting every node change before acting on it.
func (d *Daemon) reconcileFleet(ctx context.Context, f state.Fleet) error {
	d.fleetLock(f.Name).Lock()
	defer d.fleetLock(f.Name).Unlock()
	fl, err := d.fleetSpec(f)
	if err != nil {
		return err
	}
	now := d.now()
	rt := d.runtime(f.Name)
	if d.rz() != nil && !f.Destroying && !f.Completed {
		if err := d.rz().Configure(ctx, f.Name, rendezvousConfig(fl)); err != nil {
			d.log.Warn("rendezvous configure", "fleet", f.Name, "err", err)
		}
	}

	var nodes []state.Node
	records := map[string]state.OfferingRecord{}
	err = d.store.View(ctx, func(tx state.Tx) error {
		var err error
		if nodes, err = tx.Nodes(f.Name); err != nil {
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

	// Observe every provider the fleet uses or its nodes still live on.
	provNames := map[string]bool{}
	for _, p := range fl.Providers {
		provNames[p.Name] = true
	}
	for _, n := range nodes {
		if n.Offering.Provider != "" {
			provNames[n.Offering.Provider] = true
		}
	}
	d.seedSpotHistory(ctx, rt, now)
	in := reconcile.Input{Fleet: fl, Destroying: f.Destroying || f.Completed, Finished: f.Completed && !f.Destroying, Name: f.Name, Generation: f.Generation, DaemonID: d.daemonID,
		Nodes: nodes, ObservedOK: map[string]bool{}, Records: records, Now: now, StartedAt: d.started,
		LastScaleUp: rt.LastScaleUp, LastScaleDown: rt.LastScaleDown, Fallback: rt.Fallback,
		Joined: map[string]bool{}, InRound: map[string]bool{}, Params: d.params}
	in.Move = d.moveCost(fl)
	names := make([]string, 0, len(provNames))
	for n := range provNames {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		p, cfg, err := d.providerFor(ctx, f, name)
		if err != nil {
			d.log.Warn("provider unavailable", "fleet", f.Name, "provider", name, "err", err)
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		insts, err := p.List(lctx, cfg, map[string]string{providers.TagFleet: f.Name})
		cancel()
		d.countProviderCallIn(name, "list", callRegion(err, "", cfg), err)
		if err != nil {
			d.log.Warn("provider list failed", "fleet", f.Name, "provider", name, "err", err)
		} else {
			in.ObservedOK[name] = true
			if in.Instances == nil {
				in.Instances = insts // the common single provider: no copy
			} else {
				in.Instances = append(in.Instances, insts...)
			}
		}
		if f.Destroying || f.Completed {
			continue
		}
		offs := rt.offerings[name]
		if now.Sub(rt.offeringsAt[name]) > offeringsTTL || offs == nil {
			octx, cancel := context.WithTimeout(ctx, 30*time.Second)
			o, err := p.Offerings(octx, cfg)
			cancel()
			d.countProviderCallIn(name, "offerings", callRegion(err, "", cfg), err)
			if err != nil {
				d.log.Warn("provider offerings failed", "fleet", f.Name, "provider", name, "err", err)
			} else {
				offs = o
				rt.offerings[name], rt.offeringsAt[name] = o, now
				d.noteOfferings(o)
				d.notePrices(f.Name, name, fl, o)
			}
		}
		// Offerings whose architecture has no agent binary are not
		// placement's to pick (plan refuses a fleet left with none).
		offs, _ = d.servableOfferings(offs)
		in.Offerings = append(in.Offerings, offs...)
	}

	// Membership as the rendezvous sees it; heartbeat silence is a notice.
	var rst *rendezvous.Status
	if d.rz() != nil {
		if st, err := d.rz().Status(f.Name); err == nil {
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
			if !f.Completed && !f.Destroying {
				d.heartbeatLoss(ctx, f.Name, fl, nodes, member, now)
			}
		}
	}
	// Nodes recorded joined or running need not be in in.Joined: the
	// reconciler only asks it about booting nodes.

	// Instances the provider itself reports as interrupted or gone become
	// notices. The index of nodes by instance is built only when some
	// instance reports one: most passes have none.
	var byInstance map[string]state.Node
	for _, inst := range in.Instances {
		if inst.Interruption == nil || f.Completed || f.Destroying {
			// A finished job's agents exit on their own: not an interruption.
			continue
		}
		if byInstance == nil {
			byInstance = make(map[string]state.Node, len(nodes))
			for _, n := range nodes {
				if n.InstanceID != "" {
					byInstance[n.InstanceID] = n
				}
			}
		}
		n, ok := byInstance[inst.ID]
		if !ok {
			continue
		}
		kind, err := interruption.ParseKind(inst.Interruption.Kind)
		if err != nil {
			continue
		}
		if n.State == state.NodeTerminating || n.State == state.NodeTerminated || n.State == state.NodeFailed {
			continue
		}
		_ = d.HandleNotice(ctx, f.Name, interruption.Notice{Node: n.ID, Instance: inst.ID, Kind: kind, Deadline: inst.Interruption.Deadline, Source: "provider/" + inst.Offering.Provider})
	}
	d.rtMu.Lock()
	if len(rt.notices) > 0 {
		// A notice lives while its node does.
		alive := make(map[string]bool, len(nodes))
		for _, nd := range nodes {
			alive[nd.ID] = nd.State != state.NodeTerminated && nd.State != state.NodeFailed
		}
		for key, n := range rt.notices {
			if !alive[n.Node] {
				delete(rt.notices, key)
				continue
			}
			in.Notices = append(in.Notices, n)
		}
	}
	d.rtMu.Unlock()
	sort.Slice(in.Notices, func(i, j int) bool { return in.Notices[i].Key() < in.Notices[j].Key() })

	// Work advances while a round is closed, at (world nodes / max_nodes).
	if rt.Progress.Start.IsZero() {
		rt.Progress.Start = f.CreatedAt
	}
	if !rt.lastPass.IsZero() && rst != nil && fl.MaxNodes > 0 {
		if st := rst; st.State == rendezvous.RoundClosed && st.Nodes >= fl.MinNodes {
			rt.Progress.Done += time.Duration(float64(now.Sub(rt.lastPass)) * progressRate(rt, st.Round, st.Nodes, fl.MaxNodes))
		}
	}
	in.Progress = rt.Progress
	if !f.Destroying && !f.Completed {
		d.autoscale(ctx, f, fl, rt, nodes, rst, &in)
	}
	// Account instance-hours per offering for the interruption rates;
	// saveRuntime writes them to the offering records.
	if !rt.lastPass.IsZero() {
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
	// Progress and run-seconds are counted up to now whatever happens to
	// this pass's plan, so the next pass must not count them again.
	rt.lastPass = now
	plan := reconcile.Reconcile(in)
	rt.plan = plan
	if err := d.execute(ctx, f, fl, rt, in, plan); err != nil {
		return err
	}
	if f.Destroying {
		return d.finishDestroy(ctx, f.Name, in)
	}
	return nil
}

// progressRate is how fast work (time at max_nodes) advances in a closed
// round of nodes: the measured throughput over max_nodes' when the
// workers report progress and the autoscaler knows both, else nodes over
// max_nodes (every node counted alike: round timing).
func progressRate(rt *fleetRuntime, round, nodes, maxNodes int) float64 {
	lin := float64(nodes) / float64(maxNodes)
	tr := rt.Training
	if tr == nil || tr.Latest == nil || tr.Latest.Round != round || tr.Latest.SamplesPerSec <= 0 || rt.view == nil {
		return lin
	}
	for _, o := range rt.view.decision.Options {
		if o.Nodes == maxNodes && o.SamplesPerSec > 0 {
			return min(tr.Latest.SamplesPerSec/o.SamplesPerSec, 2)
		}
	}
	return lin
}

// decisions is the saved runtime without what accumulates every pass.
func (rt *fleetRuntime) decisions() []byte {
	c := rt.savedRuntime
	c.Progress.Done = 0
	c.Training = nil
	b, _ := json.Marshal(c)
	return b
}

// saveRuntime persists a fleet's runtime and its run-seconds accounting in
// one transaction: at once when a decision changed (or force), otherwise
// at most every runtimeFlushEvery, and never when nothing changed. A pass
// that changes nothing writes nothing.
func (d *Daemon) saveRuntime(ctx context.Context, name string, rt *fleetRuntime, now time.Time, force bool) {
	b, err := json.Marshal(rt.savedRuntime)
	if err != nil {
		d.log.Error("encode fleet runtime", "fleet", name, "err", err)
		return
	}
	dec := rt.decisions()
	changed := !bytes.Equal(b, rt.saved)
	decided := !bytes.Equal(dec, rt.savedDecisions)
	due := force || now.Sub(rt.savedAt) >= runtimeFlushEvery
	if !decided && (!due || (!changed && len(rt.runSeconds) == 0)) {
		return
	}
	err = d.store.Update(ctx, func(tx state.Tx) error {
		if changed {
			if err := tx.SetMeta(runtimeKey(name), b); err != nil {
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
			d.log.Warn("save fleet runtime; retried next pass", "fleet", name, "err", err)
		}
		return
	}
	rt.saved, rt.savedDecisions, rt.savedAt = b, dec, now
	clear(rt.runSeconds)
}

// flushRuntimes writes every fleet's pending runtime and accounting, for a
// clean shutdown to lose none of it.
func (d *Daemon) flushRuntimes(ctx context.Context) {
	d.rtMu.Lock()
	names := make([]string, 0, len(d.runtimes))
	for name := range d.runtimes {
		names = append(names, name)
	}
	d.rtMu.Unlock()
	for _, name := range names {
		lock := d.fleetLock(name)
		lock.Lock()
		d.rtMu.Lock()
		rt, ok := d.runtimes[name]
		d.rtMu.Unlock()
		if ok {
			d.saveRuntime(ctx, name, rt, d.now(), true)
		}
		lock.Unlock()
	}
}

// finishDestroy forgets a destroyed fleet once nothing of it is left.
func (d *Daemon) finishDestroy(ctx context.Context, name string, in reconcile.Input) error {
	for _, inst := range in.Instances {
		if inst.State != providers.StateTerminated {
			return nil
		}
	}
	for p := range in.ObservedOK {
		_ = p
	}
	var nodes []state.Node
	err := d.update(ctx, func(tx state.Tx) error {
		var err error
		if nodes, err = tx.Nodes(name); err != nil {
			return err
		}
		for _, n := range nodes {
			if n.State != state.NodeTerminated && n.State != state.NodeFailed {
				return nil
			}
		}
		if err := tx.DeleteFleet(name); err != nil {
			return err
		}
		_ = tx.SetMeta(runtimeKey(name), nil)
		_ = tx.SetMeta(spendForgottenKey(name), nil)
		_, err = tx.AppendEvent(state.Event{Fleet: name, Type: "fleet.destroyed", Message: fmt.Sprintf("fleet %s destroyed", name)})
		return err
	})
	if err != nil {
		return err
	}
	if d.rz() != nil {
		_ = d.rz().Remove(ctx, name)
	}
	d.rtMu.Lock()
	delete(d.runtimes, name)
	d.rtMu.Unlock()
	d.forgetCheckpoints(name)
	return nil
}

// updateIf is update when cond holds, and nothing otherwise.
func (d *Daemon) updateIf(ctx context.Context, cond bool, fn func(state.Tx) error) error {
	if !cond {
		return nil
	}
	return d.update(ctx, fn)
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

// execute performs a plan's actions in order. Launches run concurrently
// after the other actions: each persists its own records, and a slow cloud
// call must not hold up a replacement elsewhere.
func (d *Daemon) execute(ctx context.Context, f state.Fleet, fl *spec.Fleet, rt *fleetRuntime, in reconcile.Input, plan reconcile.Plan) error {
	now := in.Now
	var launches []reconcile.Launch
	var alerts []reconcile.Alert
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
	if err := d.updateIf(ctx, changes, func(tx state.Tx) error {
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
		return err
	}
	for _, a := range plan.Actions {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch a := a.(type) {
		case reconcile.Transition:
			d.onTransition(ctx, f.Name, a)
		case reconcile.Adopt:
		case reconcile.Launch:
			launches = append(launches, a)
		case reconcile.Terminate:
			p, cfg, err := d.providerFor(ctx, f, a.Provider)
			if err != nil {
				d.log.Warn("terminate", "node", a.NodeID, "err", err)
				continue
			}
			tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			err = p.Delete(tctx, cfg, a.InstanceID)
			cancel()
			d.countProviderCallIn(a.Provider, "delete", callRegion(err, "", cfg), err)
			if err != nil {
				d.log.Warn("terminate failed; retried next pass", "node", a.NodeID, "instance", a.InstanceID, "err", err)
			}
		case reconcile.DeleteOrphan:
			p, cfg, err := d.providerFor(ctx, f, a.Instance.Offering.Provider)
			if err != nil {
				continue
			}
			err = p.Delete(ctx, cfg, a.Instance.ID)
			d.countProviderCallIn(a.Instance.Offering.Provider, "delete", callRegion(err, a.Instance.Offering.Region, cfg), err)
			d.appendEvent(ctx, state.Event{Fleet: f.Name, Type: "orphan.deleted", Message: a.String(), Data: map[string]string{"instance": a.Instance.ID}})
		case reconcile.MarkUnavailable:
			if err := d.markUnavailable(ctx, a, now); err != nil {
				return err
			}
		case reconcile.Alert:
			alerts = append(alerts, a)
		case reconcile.Drain:
			if d.rz() != nil {
				if err := d.rz().Exclude(ctx, f.Name, a.NodeID, a.Reason); err != nil && !errors.Is(err, rendezvous.ErrUnknownFleet) {
					d.log.Warn("rendezvous exclude", "node", a.NodeID, "err", err)
				}
			}
		case reconcile.ForgetNode:
			if err := d.update(ctx, func(tx state.Tx) error {
				// Its spend moves to the fleet's persisted total, so
				// fleetd_spend_usd_total does not drop with the record.
				if n, err := tx.Node(f.Name, a.NodeID); err == nil {
					if err := addSpendForgotten(tx, n, now); err != nil {
						return err
					}
				}
				if err := tx.DeleteNode(f.Name, a.NodeID); err != nil && !errors.Is(err, state.ErrNotFound) {
					return err
				}
				_, err := tx.AppendEvent(state.Event{Fleet: f.Name, Node: a.NodeID, Type: "node.forgotten", Message: a.Reason})
				return err
			}); err != nil {
				return err
			}
		}
	}
	d.setAlerts(ctx, f.Name, rt, alerts)
	if plan.ScaledUp {
		rt.LastScaleUp = now
	}
	if plan.ScaledDown {
		rt.LastScaleDown = now
	}
	d.noteSpotHistory(ctx, rt.Fallback.Spot, plan.Fallback.Spot, now)
	rt.Fallback = plan.Fallback
	d.saveRuntime(ctx, f.Name, rt, now, f.Destroying)

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
	if err := d.update(ctx, func(tx state.Tx) error {
		for _, l := range launches {
			if err := launchStartTx(tx, l, now); err != nil {
				return fmt.Errorf("launch %s: %w", l.Node.ID, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	outcomes := d.groupCommitter(ctx)
	defer close(outcomes)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16) // bounds concurrent provider calls
	for _, l := range launches {
		wg.Add(1)
		sem <- struct{}{}
		go func(l reconcile.Launch) {
			defer wg.Done()
			if err := d.launch(ctx, f, fl, l, now, replacing, sem, outcomes); err != nil && ctx.Err() == nil {
				d.log.Error("launch", "node", l.Node.ID, "err", err)
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
func (d *Daemon) groupCommitter(ctx context.Context) chan<- groupedUpdate {
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
			err := d.update(ctx, func(tx state.Tx) error {
				for _, g := range batch {
					if err := g.fn(tx); err != nil {
						return err
					}
				}
				return nil
			})
			for _, g := range batch {
				if err != nil && len(batch) > 1 {
					g.done <- d.update(ctx, g.fn)
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

// onTransition hooks side effects of node state changes.
func (d *Daemon) onTransition(ctx context.Context, fleetName string, a reconcile.Transition) {
	if a.To == state.NodeRunning {
		d.noteRunning(fleetName, a.Node)
	}
}

func (d *Daemon) markUnavailable(ctx context.Context, a reconcile.MarkUnavailable, now time.Time) error {
	return d.update(ctx, func(tx state.Tx) error { return markUnavailableTx(tx, a, now) })
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

// setAlerts replaces a fleet's alerts, logging the new ones as events.
func (d *Daemon) setAlerts(ctx context.Context, fleetName string, rt *fleetRuntime, alerts []reconcile.Alert) {
	old := map[string]bool{}
	for _, a := range rt.alerts {
		old[a.Kind+"/"+a.Subject] = true
	}
	for _, a := range alerts {
		if !old[a.Kind+"/"+a.Subject] {
			d.appendEvent(ctx, state.Event{Fleet: fleetName, Type: "alert", Message: a.Message, Data: map[string]string{"kind": a.Kind, "subject": a.Subject}})
		}
	}
	d.rtMu.Lock()
	rt.alerts = alerts
	d.rtMu.Unlock()
}

// launch executes one Launch action whose start execute has persisted:
// render user-data, call Create, free its slot in sem, and have outcomes
// commit the result.
func (d *Daemon) launch(ctx context.Context, f state.Fleet, fl *spec.Fleet, l reconcile.Launch, now time.Time, replacing bool,
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
		d.noteLaunchRequested(f.Name, n.ID, now)
	}
	p, cfg, err := d.providerFor(ctx, f, l.Offering.Provider)
	var created []providers.Instance
	if err == nil {
		var ud string
		ud, err = d.userData(f.Name, fl, prov)
		if err == nil {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			created, err = p.Create(lctx, cfg, providers.LaunchRequest{
				Offering: l.Offering, Count: 1, UserData: ud, IdempotencyToken: n.ID,
				Tags: map[string]string{providers.TagFleet: f.Name, providers.TagNodeID: n.ID, providers.TagDaemonID: d.daemonID},
			})
			cancel()
		}
		d.countProviderCallIn(l.Offering.Provider, "create", callRegion(err, l.Offering.Region, cfg), err)
	}
	free() // the provider call is done: the next launch may start
	after := d.now()
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

// metadataKind is the metadata service an agent watches on a provider.
func metadataKind(provider string) string {
	switch provider {
	case "aws", "local":
		return "aws-imds"
	case "gcp":
		return "gce"
	}
	return "none"
}

// userData renders a node's #cloud-config document.
func (d *Daemon) userData(fleetName string, fl *spec.Fleet, n state.Node) (string, error) {
	in := bootstrap.Input{
		Agent: bootstrap.AgentConfig{Fleet: fleetName, NodeID: n.ID, DaemonURL: d.URL(), DaemonURLs: d.otherServers(), Token: d.NodeToken(fleetName, n.ID),
			Metadata: bootstrap.MetadataConfig{Kind: metadataKind(n.Offering.Provider)}},
		Setup: fl.Training.Setup,
	}
	if d.ca != nil {
		in.Agent.CAFingerprint = "sha256:" + d.ca.Fingerprint
		in.CACertPEM = d.ca.CertPEM
	}
	// Real VMs download the agent built for their architecture from the
	// daemon; local nodes run this very binary already.
	if downloadsAgent(n.Offering.Provider) {
		var err error
		if in.AgentURL, in.AgentSHA256, err = d.agents.AgentDownload(d.URL(), fleetName, n.ID, n.Offering.Arch); err != nil {
			return "", err
		}
	}
	return bootstrap.Render(in)
}
