package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/controller"
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

	alerts  []reconcile.Alert
	notices map[string]interruption.Notice // by Notice.Key()
	// market is the providers' offerings, cached (fleet/controller).
	market      controller.Market
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
	rt = &fleetRuntime{notices: map[string]interruption.Notice{}, runSeconds: map[string]float64{}}
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
	d.scanStrays(ctx, fleets)
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
// executes it, persisting every node change before acting on it. Only the
// leader runs it (reconcileLoop); it sequences the pass around the fleet's
// runtime memory, and fleet/controller does the cloud-facing steps.
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

	d.seedSpotHistory(ctx, rt, now)
	in := reconcile.Input{Fleet: fl, Destroying: f.Destroying || f.Completed, Finished: f.Completed && !f.Destroying, Name: f.Name, Generation: f.Generation, DaemonID: d.daemonID,
		Incarnation: f.Incarnation, LegacyUntagged: f.LegacyUntagged, NewNodeID: reconcile.NodeIDs(f.Name, f.Incarnation, nodes, state.RandomID),
		Nodes: nodes, ObservedOK: map[string]bool{}, Records: records, Now: now, StartedAt: d.started,
		LastScaleUp: rt.LastScaleUp, LastScaleDown: rt.LastScaleDown, Fallback: rt.Fallback,
		Joined: map[string]bool{}, InRound: map[string]bool{}, Params: d.params}
	in.Move = d.moveCost(fl)
	// Observe every provider the fleet uses or its nodes still live on.
	d.ctrl.Observe(ctx, f, &rt.market, &in)

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
	// notices.
	d.ctrl.NoticeInterrupted(ctx, f, &in)
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
		d.ctrl.ReleaseNetwork(ctx, f, in) // placement groups: docs/placement.md, Networking
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
	// Only this incarnation's instances hold the destroy up: another
	// daemon's fleet of the same name, or a leftover of an earlier
	// incarnation, is not ours to wait for (or to delete).
	who := in.Identity()
	for _, inst := range in.Instances {
		if inst.State != providers.StateTerminated && who.Of(inst) == reconcile.Ours {
			return nil
		}
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
		f, err := tx.Fleet(name)
		if err != nil {
			return err
		}
		if err := recordDestroyed(tx, f, d.now()); err != nil {
			return err
		}
		if err := tx.DeleteFleet(name); err != nil {
			return err
		}
		_ = tx.SetMeta(runtimeKey(name), nil)
		_ = tx.SetMeta(spendForgottenKey(name), nil)
		_, err = tx.AppendEvent(state.Event{Fleet: name, Incarnation: f.Incarnation, Type: "fleet.destroyed",
			Message: fmt.Sprintf("fleet %s destroyed (incarnation %s; its events and logs stay under that id)", name, f.Incarnation)})
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
	d.agentAPI.ForgetCheckpoints(name)
	return nil
}

// execute performs a plan (fleet/controller), recording the pass's
// decisions between its other actions and its launches.
func (d *Daemon) execute(ctx context.Context, f state.Fleet, fl *spec.Fleet, rt *fleetRuntime, in reconcile.Input, plan reconcile.Plan) error {
	now := in.Now
	launches, alerts, err := d.ctrl.Perform(ctx, f, in, plan)
	if err != nil {
		return err
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
	return d.ctrl.Launch(ctx, f, fl, in, plan, launches)
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
		if in.AgentURL, in.AgentSHA256, err = d.agents.AgentDownload(d.URL(), fleetName, n.ID, n.Offering.Arch, nodeStores(fl)); err != nil {
			return "", err
		}
	}
	return bootstrap.Render(in)
}
