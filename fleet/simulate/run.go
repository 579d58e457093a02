package simulate

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/sim"
	"github.com/fleetd/fleetd/rendezvous"
)

// daemonID tags the simulated daemon's instances.
const daemonID = "fleetd-sim"

// runner executes one policy over one window: it is the daemon's
// controller loop (fleet/controller.go) in virtual time. Each pass builds
// the same reconcile.Input the daemon builds, runs the real reconciler and
// executes its plan against the simulated market; agents join after the
// launch latency and the real rendezvous state machine forms the rounds.
// Training progresses at the fleet's rate while a round is closed, after
// the restart overhead.
type runner struct {
	fl     *spec.Fleet
	data   *placement.DataCost // the fleet's datasets (data.go); nil without
	cfg    providers.Config
	prov   *sim.Provider
	market *sim.Market
	params reconcile.Params
	job    Job
	// restart is the part of the changeover spent after the round closes.
	restart  time.Duration
	start    time.Time
	deadline time.Time
	hardEnd  time.Time
	interval time.Duration
	// exhaustive runs a pass at every event and check time (no skipping);
	// tests compare it with the default.
	exhaustive bool
	// noEgress hides the checkpoint's egress from placement (Setup.NoEgress).
	noEgress bool
	// shape is the job's throughput per node count; as the goodput
	// autoscaler (nil: the fleet aims at max_nodes). goodput.go.
	shape Shape
	as    *simAutoscale

	now time.Time
	ctx context.Context

	// The daemon's memory.
	nodes          []state.Node
	records        map[string]state.OfferingRecord
	notices        map[string]interruption.Notice
	fallback       placement.FallbackState
	lastUp         time.Time
	lastDown       time.Time
	lastPass       time.Time
	lastView       reconcile.CapacityView
	fixpoint       bool
	nodeSeq        int
	instances      []providers.Instance
	wakeTimer      time.Time
	wakeRendezvous time.Time

	// Rendezvous and agents.
	rdzv    *rendezvous.Machine
	members []string        // node ids whose agents joined and live
	joined  map[string]bool // agent registered (ever, while alive)
	gone    map[string]bool // instance ended: agent dead

	// Job progress.
	done       time.Duration
	round      int
	roundKey   string
	rate       float64
	productive time.Time // progress accrues from here while rate > 0
	finished   bool
	finishedAt time.Time

	res Result
	log io.Writer
}

func (r *runner) logf(format string, args ...any) {
	if r.log == nil {
		return
	}
	el := r.now.Sub(r.start)
	slack := r.deadline.Sub(r.now) - (r.job.Work - r.done)
	fmt.Fprintf(r.log, "%s +%6.2fh done %6.2fh slack %5.2fh  %s\n", r.res.Policy, el.Hours(), r.done.Hours(), slack.Hours(), fmt.Sprintf(format, args...))
}

func (r *runner) clock() time.Time { return r.now }

func newRunner(s *Setup, pol Policy, fl *spec.Fleet, cfg providers.Config, mkt *sim.Market, start time.Time, zone string) (*runner, error) {
	r := &runner{
		fl: fl, cfg: cfg, job: s.Job, start: start, interval: s.Interval, exhaustive: s.Exhaustive, noEgress: s.NoEgress,
		ctx: context.Background(), records: map[string]state.OfferingRecord{}, notices: map[string]interruption.Notice{},
		joined: map[string]bool{}, gone: map[string]bool{},
	}
	r.now = start
	r.data = r.dataCost()
	r.deadline = start.Add(s.Job.Deadline)
	r.hardEnd = r.deadline.Add(s.Job.Work)
	// Every (re)start restores the checkpoint before the workers train.
	r.restart = max(s.Job.Changeover-s.Job.LaunchLatency, 0) + s.Job.restoreTime()
	r.prov = sim.New(sim.Options{Now: r.clock, Trace: s.Trace, Market: mkt})
	m, err := r.prov.Market(cfg)
	if err != nil {
		return nil, err
	}
	r.market = m
	r.params = s.Params
	r.params.Model.InterruptionCost = s.Job.Changeover
	r.params.Deadline = pol.Deadline
	r.params.Model.PriceOnly = r.params.Model.PriceOnly || pol.PriceOnly
	if pol.Foresight {
		r.params.Forecast = upRunForecast(m, max(fl.MinNodes, 1))
	}
	rc := rendezvous.Config{MinNodes: fl.MinNodes, MaxNodes: fl.MaxNodes, LastCall: fl.Rendezvous.LastCall,
		Heartbeat: fl.Rendezvous.Heartbeat, DeadAfter: fl.Rendezvous.DeadAfter, MasterPort: fl.Training.MasterPort}
	if r.rdzv, err = rendezvous.NewMachine(rc, "sim", start); err != nil {
		return nil, fmt.Errorf("rendezvous: %w", err)
	}
	if s.Warm {
		r.fallback.Spot = warmHistory(fl, m, start)
	}
	r.shape, r.as = s.Shape, newSimAutoscale(pol)
	r.res = Result{Policy: pol.Name, Start: start, Zone: zone}
	r.log = s.Log
	return r, nil
}

// run simulates until the job finishes (or the hard end) and returns the
// result.
func (r *runner) run() Result {
	r.sync()
	r.pass()
	for !r.finished {
		next, force, market := r.next()
		if next.IsZero() || next.After(r.hardEnd) {
			next, force = r.hardEnd, true
		}
		r.progress(next)
		if r.finished {
			break
		}
		r.now = next
		if !next.Before(r.hardEnd) {
			break
		}
		steady := r.steady()
		switch {
		case r.sync() || force || r.exhaustive || !r.fixpoint || market && !steady:
			r.pass()
		case market:
			// Steady on spot a pass plans nothing; it would only fold the
			// market into the fleet's spot history.
			r.fallback = reconcile.ObserveSpot(r.input())
		case r.decisionChanged():
			r.pass()
		}
	}
	end := r.now
	if r.finished {
		end = r.finishedAt
	}
	r.now = end
	r.teardown()
	u := r.prov.Usage()
	r.res.Cost = u.Cost() + r.res.EgressCost + r.res.DataCost
	r.res.SpotCost, r.res.OnDemandCost = u.SpotCost, u.OnDemandCost
	r.res.SpotHours, r.res.OnDemandHours = u.SpotHours, u.OnDemandHours
	r.res.Preemptions = u.Preemptions
	r.res.Elapsed = end.Sub(r.start)
	r.res.Missed = !r.finished || r.finishedAt.After(r.deadline)
	r.res.Done = r.done
	return r.res
}

// steady: every live node runs spot in the closed round at the target,
// nothing else is going on. A pass then plans nothing (no launches, no
// migration of a running job, no swap) whatever the market does, so
// market ticks and policy checks are skipped; notices still come.
func (r *runner) steady() bool {
	target := r.target()
	live := 0
	for _, n := range r.nodes {
		switch n.State {
		case state.NodeRunning:
			if n.Offering.CapacityType != providers.Spot {
				return false
			}
			live++
		case state.NodeTerminated, state.NodeFailed:
		default:
			return false
		}
	}
	return live == target && len(r.notices) == 0
}

// next returns the next time anything can happen, whether a pass is due
// then regardless of the decision check, and whether the market changes.
func (r *runner) next() (time.Time, bool, bool) {
	var t time.Time
	force, market := false, false
	consider := func(c time.Time, f, m bool) {
		if c.IsZero() || !c.After(r.now) {
			return
		}
		switch {
		case t.IsZero() || c.Before(t):
			t, force, market = c, f, m
		case c.Equal(t):
			force, market = force || f, market || m
		}
	}
	if r.rate > 0 {
		left := r.job.Work - r.done
		from := r.now
		if r.productive.After(from) {
			from = r.productive
		}
		consider(from.Add(time.Duration(float64(left)/r.rate)+1), true, false)
	}
	consider(r.prov.NextEvent(), true, false)
	consider(r.wakeRendezvous, true, false)
	if r.as != nil {
		consider(r.as.wake(r), true, false)
	}
	// Market changes feed the fleet's spot history even when steady.
	for _, o := range r.market.Offers {
		consider(o.NextChange(r.now), false, true)
	}
	if !r.steady() || r.exhaustive {
		// Steady on spot, the reconciler's timers can only forget old
		// records or end back-offs nobody waits for.
		consider(r.wakeTimer, true, false)
		// Policy checks on the tick grid: a pass only if the capacity
		// decision changed (decisionChanged), unless the last pass
		// still changed things.
		k := r.now.Sub(r.start)/r.interval + 1
		consider(r.start.Add(k*r.interval), false, false)
	}
	return t, force, market
}

func (r *runner) offeringsNow() []providers.Offering {
	offs, err := r.prov.Offerings(r.ctx, r.cfg)
	if err != nil {
		panic(fmt.Sprintf("sim offerings: %v", err))
	}
	return offs
}

// progress advances training to t; it may finish the job before t.
func (r *runner) progress(t time.Time) {
	if r.rate <= 0 || r.finished {
		return
	}
	from := r.now
	if r.productive.After(from) {
		from = r.productive
	}
	if !t.After(from) {
		return
	}
	gain := time.Duration(float64(t.Sub(from)) * r.rate)
	r.chargeStream(min(t.Sub(from), time.Duration(float64(r.job.Work-r.done)/r.rate)).Hours())
	if r.done+gain >= r.job.Work {
		need := time.Duration(float64(r.job.Work-r.done) / r.rate)
		r.done = r.job.Work
		r.finished, r.finishedAt = true, from.Add(need)
		return
	}
	r.done += gain
}

// sync observes the provider at now: agents join when their instance
// runs, provider-reported interruptions become notices (the daemon's
// HandleNotice), dead agents leave, and the rendezvous settles. It
// reports whether anything changed.
func (r *runner) sync() bool {
	insts, err := r.prov.List(r.ctx, r.cfg, map[string]string{providers.TagFleet: r.fl.Name})
	if err != nil {
		panic(fmt.Sprintf("sim list: %v", err)) // the in-process provider only fails on a bad config, checked at setup
	}
	r.instances = insts
	changed := false
	r.heartbeat()
	alive := map[string]providers.Instance{}
	for _, in := range insts {
		alive[in.Tags[providers.TagNodeID]] = in
	}
	for _, id := range slices.Clone(r.members) {
		if _, ok := alive[id]; !ok && !r.gone[id] {
			r.gone[id] = true
			r.rdzv.Leave(r.now, id)
			r.members = slices.DeleteFunc(r.members, func(s string) bool { return s == id })
			changed = true
		}
	}
	for _, in := range insts {
		id := in.Tags[providers.TagNodeID]
		if in.Interruption != nil {
			kind, err := interruption.ParseKind(in.Interruption.Kind)
			if err == nil && r.handleNotice(interruption.Notice{Node: id, Instance: in.ID, Kind: kind, Deadline: in.Interruption.Deadline, Source: "provider/" + sim.Name}) {
				changed = true
			}
		}
		if in.State == providers.StateRunning && !r.joined[id] && r.nodeIndex(id) >= 0 {
			r.joined[id] = true
			_, _, err := r.rdzv.Join(r.now, rendezvous.JoinRequest{NodeID: id, Addr: in.Address, Zone: in.Offering.Zone, Nproc: max(r.fl.Training.NprocPerNode, 1), Session: "s-" + id})
			if err == nil {
				r.members = append(r.members, id)
			}
			changed = true
		}
	}
	if r.settle() {
		changed = true
	}
	return changed
}

func (r *runner) heartbeat() {
	for _, id := range r.members {
		_, _ = r.rdzv.Heartbeat(r.now, rendezvous.HeartbeatRequest{NodeID: id})
	}
}

// handleNotice is the daemon's HandleNotice: idempotent by node+kind;
// a terminal notice excludes the node from the rendezvous at once.
func (r *runner) handleNotice(n interruption.Notice) bool {
	if _, dup := r.notices[n.Key()]; dup {
		return false
	}
	if i := r.nodeIndex(n.Node); i < 0 || ended(r.nodes[i].State) {
		return false
	}
	r.notices[n.Key()] = n
	if n.Kind.Terminal() {
		r.heartbeat()
		r.rdzv.Exclude(r.now, n.Node, string(n.Kind)+" notice")
	}
	return true
}

// settle fires the rendezvous' last-call timers and tracks rounds: a new
// closed round restarts training (restart overhead, then the new rate).
func (r *runner) settle() bool {
	r.heartbeat()
	r.rdzv.Tick(r.now)
	round, st := r.rdzv.Round()
	waiting, standby := 0, 0
	var assigned []string
	for _, id := range r.members {
		switch r.rdzv.View(id).State {
		case rendezvous.NodeAssigned:
			assigned = append(assigned, id)
		case rendezvous.NodeWaiting:
			waiting++
		case rendezvous.NodeStandby:
			standby++
		}
	}
	// The machine arms its last call when an open round reaches
	// min_nodes, and batches standbys of a closed round for last_call:
	// both start at a change we observe, so wake up then.
	if (st == rendezvous.RoundOpen && waiting >= r.fl.MinNodes) || (st == rendezvous.RoundClosed && standby > 0) {
		if !r.wakeRendezvous.After(r.now) {
			r.wakeRendezvous = r.now.Add(r.fl.Rendezvous.LastCall)
		}
	} else {
		r.wakeRendezvous = time.Time{}
	}
	if st != rendezvous.RoundClosed {
		changed := r.rate != 0
		r.rate = 0
		return changed
	}
	if round == r.round {
		return false
	}
	r.round = round
	r.res.Restarts++
	keys := make([]string, 0, len(assigned))
	for _, id := range assigned {
		if i := r.nodeIndex(id); i >= 0 {
			keys = append(keys, r.nodes[i].Offering.Key())
		}
	}
	sort.Strings(keys)
	key := strings.Join(keys, ",")
	if r.roundKey != "" && key != r.roundKey {
		r.res.Migrations++
	}
	r.roundKey = key
	r.logf("round %d closed: %s", round, key)
	r.rate = 0
	if len(assigned) >= r.fl.MinNodes {
		r.rate = r.shape.rate(len(assigned), r.fl.MaxNodes)
	}
	r.productive = r.now.Add(r.restart)
	return true
}

func (r *runner) nodeIndex(id string) int {
	for i := range r.nodes {
		if r.nodes[i].ID == id {
			return i
		}
	}
	return -1
}

func ended(s state.NodeState) bool { return s == state.NodeTerminated || s == state.NodeFailed }

// input builds the reconciler's input the way the controller does.
func (r *runner) input() reconcile.Input {
	offs := r.offeringsNow()
	in := reconcile.Input{
		Fleet: r.fl, Name: r.fl.Name, Generation: 1, DaemonID: daemonID,
		Nodes: r.nodes, Instances: r.instances, ObservedOK: map[string]bool{sim.Name: true},
		Offerings: offs, Records: r.records, Now: r.now, StartedAt: r.start,
		LastScaleUp: r.lastUp, LastScaleDown: r.lastDown, Fallback: r.fallback,
		Joined: map[string]bool{}, InRound: map[string]bool{},
		Progress:  placement.Progress{Start: r.start, Done: r.done},
		NewNodeID: r.newNodeID, Params: r.params, Move: r.moveCost(),
	}
	if r.as != nil {
		r.as.into(&in)
	}
	for _, id := range r.members {
		switch r.rdzv.View(id).State {
		case rendezvous.NodeAssigned:
			in.Joined[id], in.InRound[id] = true, true
		case rendezvous.NodeWaiting, rendezvous.NodeStandby:
			in.Joined[id] = true
		}
	}
	for _, n := range r.nodes {
		if n.State == state.NodeJoined || n.State == state.NodeRunning {
			in.Joined[n.ID] = true
		}
	}
	for key, n := range r.notices {
		if i := r.nodeIndex(n.Node); i < 0 || ended(r.nodes[i].State) {
			delete(r.notices, key)
			continue
		}
		in.Notices = append(in.Notices, n)
	}
	sort.Slice(in.Notices, func(i, j int) bool { return in.Notices[i].Key() < in.Notices[j].Key() })
	return in
}

func (r *runner) newNodeID() string {
	r.nodeSeq++
	return r.fl.Name + "-" + strconv.Itoa(r.nodeSeq)
}

// pass runs the reconciler once and executes its plan.
func (r *runner) pass() {
	if r.as != nil {
		r.as.decide(r)
	}
	in := r.input()
	plan := reconcile.Reconcile(in)
	if r.as != nil {
		r.as.last = plan
	}
	r.res.Passes++
	if r.log != nil {
		for _, a := range plan.Actions {
			if _, ok := a.(reconcile.Alert); !ok {
				r.logf("%s", a)
			}
		}
	}
	before := slices.Clone(r.nodes)
	changed := r.execute(plan)

	// Instance-hours per offering feed the learned interruption rates,
	// as the daemon accounts them between passes.
	if !r.lastPass.IsZero() {
		dt := r.now.Sub(r.lastPass).Seconds()
		for _, n := range before {
			if n.State == state.NodeRunning || n.State == state.NodeJoined {
				rec := r.record(n.Offering.Key())
				rec.RunSeconds += dt
				r.records[rec.Key] = rec
			}
		}
	}
	r.lastPass = r.now
	r.fixpoint = !changed
	// What this pass decided on, for decisionChanged: at a fixpoint the
	// pass's input is the state now.
	r.lastView = plan.View
	r.wakeTimer = r.timers()
	if r.settle() {
		r.fixpoint = false
	}
}

func (r *runner) record(key string) state.OfferingRecord {
	rec, ok := r.records[key]
	if !ok {
		rec.Key = key
	}
	return rec
}

// execute performs a plan in the controller's order: every action but
// launches, then the launches. It reports whether anything changed.
func (r *runner) execute(plan reconcile.Plan) bool {
	changed := plan.ScaledUp || plan.ScaledDown || !plan.Fallback.Equal(r.fallback)
	var launches []reconcile.Launch
	for _, a := range plan.Actions {
		switch a := a.(type) {
		case reconcile.Transition:
			r.putNode(a.Node)
			changed = true
		case reconcile.Adopt:
			r.putNode(a.Node)
			changed = true
		case reconcile.Launch:
			launches = append(launches, a)
			changed = true
		case reconcile.Terminate:
			_ = r.prov.Delete(r.ctx, r.cfg, a.InstanceID)
			changed = true
		case reconcile.DeleteOrphan:
			_ = r.prov.Delete(r.ctx, r.cfg, a.Instance.ID)
			changed = true
		case reconcile.MarkUnavailable:
			r.records[a.Key] = placement.MarkUnavailable(r.record(a.Key), r.now, a.Reason, a.Kind)
			changed = true
		case reconcile.Drain:
			r.heartbeat()
			r.rdzv.Exclude(r.now, a.NodeID, a.Reason)
			changed = true
		case reconcile.ForgetNode:
			if i := r.nodeIndex(a.NodeID); i >= 0 {
				r.nodes = slices.Delete(r.nodes, i, i+1)
			}
			changed = true
		case reconcile.Alert:
		}
	}
	if plan.ScaledUp {
		r.lastUp = r.now
	}
	if plan.ScaledDown {
		r.lastDown = r.now
	}
	r.fallback = plan.Fallback
	for _, l := range launches {
		r.launch(l)
	}
	return changed
}

func (r *runner) putNode(n state.Node) {
	if i := r.nodeIndex(n.ID); i >= 0 {
		r.nodes[i] = n
		return
	}
	r.nodes = append(r.nodes, n)
}

// launch is the controller's launch: persist, Create with the node id as
// the token, persist the outcome, mark or record the offering.
func (r *runner) launch(l reconcile.Launch) {
	n := l.Node
	if !l.Relaunch {
		r.putNode(n)
	}
	prov := reconcile.StartLaunch(n, r.now)
	r.putNode(prov)
	created, err := r.prov.Create(r.ctx, r.cfg, providers.LaunchRequest{
		Offering: l.Offering, Count: 1, UserData: "#cloud-config\n{}\n", IdempotencyToken: n.ID,
		Tags: map[string]string{providers.TagFleet: r.fl.Name, providers.TagNodeID: n.ID, providers.TagDaemonID: daemonID},
	})
	res := reconcile.AfterLaunch(prov, created, err, r.now)
	r.putNode(res.Node)
	if res.Mark != nil {
		r.records[res.Mark.Key] = placement.MarkUnavailable(r.record(res.Mark.Key), r.now, res.Mark.Reason, res.Mark.Kind)
	}
	if res.Succeeded {
		r.records[l.Offering.Key()] = placement.RecordLaunch(r.record(l.Offering.Key()), r.now)
		r.instances = append(r.instances, created...)
		r.chargeRestore(l.Offering)
		r.chargeStage(l.Offering)
	}
}

// moveCost is what placement prices a move with: the checkpoint at the
// store's region, spread over the work left.
func (r *runner) moveCost() *placement.MoveCost { return r.job.moveCost(r.done, r.noEgress) }

// moveCost is the job's checkpoint as placement prices a move, with done
// of the work done (nil without a checkpoint); noEgress hides the egress.
func (j Job) moveCost(done time.Duration, noEgress bool) *placement.MoveCost {
	if j.CheckpointBytes <= 0 {
		return nil
	}
	m := &placement.MoveCost{Bytes: j.CheckpointBytes, Source: placement.Location{Cloud: j.Cloud, Region: j.CheckpointRegion},
		Egress: j.Egress, RestoreMiBps: j.RestoreMiBps, Horizon: max(j.Work-done, time.Hour), CloudOf: map[string]string{sim.Name: j.Cloud}}
	if noEgress {
		m.Egress = placement.EgressTable{Source: "hidden from placement (-no-egress)"}
	}
	return m
}

// restoreEgress is what one node's restore of the checkpoint on offering
// o is charged in egress, and whether it crosses regions.
func (j Job) restoreEgress(o providers.Offering) (float64, bool, *placement.MoveCost, placement.Location) {
	m := j.moveCost(0, false)
	if m == nil {
		return 0, false, nil, placement.Location{}
	}
	dst := m.LocationOf(o)
	rate, _ := j.Egress.Rate(m.Source, dst)
	return float64(m.Bytes) / 1e9 * rate, dst != m.Source, m, dst
}

// chargeRestore bills a launched node's restore of the checkpoint: egress
// from the store's region to the node's (always charged, even when
// placement does not see it).
func (r *runner) chargeRestore(o providers.Offering) {
	cost, cross, m, dst := r.job.restoreEgress(o)
	if m == nil {
		return
	}
	r.res.EgressCost += cost
	if cross {
		r.res.CrossRegionRestores++
	}
	r.logf("restore of %.0f GB from %s to %s: egress $%.2f", float64(m.Bytes)/1e9, m.Source, dst, cost)
}

// timers is the earliest future time at which the reconciler's own
// clock-driven rules can fire: relaunch and boot timeouts, drain
// deadlines, delete retries, forgetting, deferred notices, expiring
// unavailable marks and scale cooldowns.
func (r *runner) timers() time.Time {
	p := r.params
	def := func(d, v time.Duration) time.Duration {
		if d <= 0 {
			return v
		}
		return d
	}
	boot := def(p.BootTimeout, reconcile.DefaultBootTimeout)
	relaunch := def(p.RelaunchAfter, reconcile.DefaultRelaunchAfter)
	retry := def(p.TerminateRetry, reconcile.DefaultTerminateRetry)
	forget := def(p.ForgetAfter, reconcile.DefaultForgetAfter)
	vis := def(p.VisibilityGrace, reconcile.DefaultVisibilityGrace)
	horizon := def(p.NoticeHorizon, reconcile.DefaultNoticeHorizon)
	up := def(p.ScaleUpCooldown, reconcile.DefaultScaleUpCooldown)
	down := def(p.ScaleDownCooldown, reconcile.DefaultScaleDownCooldown)
	var t time.Time
	at := func(c time.Time) {
		if !c.IsZero() && c.After(r.now) && (t.IsZero() || c.Before(t)) {
			t = c
		}
	}
	for _, n := range r.nodes {
		bootStart := n.CreatedAt
		if r.start.After(bootStart) {
			bootStart = r.start
		}
		switch n.State {
		case state.NodeRequested, state.NodeProvisioning:
			at(n.UpdatedAt.Add(relaunch))
			at(bootStart.Add(boot))
		case state.NodeBooting:
			at(bootStart.Add(boot))
			at(n.UpdatedAt.Add(vis))
		case state.NodeDraining:
			at(n.Deadline)
		case state.NodeTerminating:
			at(n.UpdatedAt.Add(retry))
		case state.NodeFailed, state.NodeTerminated:
			at(n.UpdatedAt.Add(retry))
			at(n.UpdatedAt.Add(forget))
		}
	}
	for _, n := range r.notices {
		if !n.Deadline.IsZero() {
			at(n.Deadline.Add(-horizon))
		}
	}
	for _, rec := range r.records {
		at(rec.UnavailableUntil)
	}
	for _, last := range []time.Time{r.lastUp, r.lastDown} {
		if !last.IsZero() {
			at(last.Add(up))
			at(last.Add(down))
		}
	}
	return t
}

// decisionChanged reports whether a pass now would decide differently
// about capacity than the last one, which changed nothing: the deadline
// policy moves with the clock (slack, work left, the age of spot
// capacity) between events. Otherwise nothing it reads has changed.
func (r *runner) decisionChanged() bool {
	return !reconcile.Capacity(r.input(), &r.lastView).Same(r.lastView)
}

// teardown ends the job: the rendezvous finishes and every instance is
// deleted at once (billing stops when the work is done).
func (r *runner) teardown() {
	r.rdzv.Finish(r.now, r.finished)
	insts, _ := r.prov.List(r.ctx, r.cfg, map[string]string{providers.TagFleet: r.fl.Name})
	for _, in := range insts {
		_ = r.prov.Delete(r.ctx, r.cfg, in.ID)
	}
}

// upRunForecast reads from the trace how much longer each spot offering
// of m stays up from a given time: until the first tick with capacity for
// fewer than need instances (the foresight policy).
func upRunForecast(m *sim.Market, need int) placement.RunForecast {
	return func(key string, now time.Time) (time.Duration, bool) {
		o := m.Offer(key)
		if o == nil || o.Spot.Key() != key {
			return 0, false
		}
		i := int(now.Sub(o.Series.Start) / o.Series.Tick)
		if i < 0 || i >= len(o.Series.Avail) {
			return 0, false
		}
		j := i
		for j < len(o.Series.Avail) && o.CapacityAt(j) >= need {
			j++
		}
		return max(o.TickStart(j).Sub(now), 0), true
	}
}
