// Package reconcile computes, for one fleet, the actions that move what
// exists (node records, observed instances, interruption notices) toward
// what the spec asks for. Reconcile is a pure, deterministic function of
// its Input, the clock included: the daemon executes the returned Plan,
// and `fleetd sim` runs the same code in virtual time.
package reconcile

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
)

// Params tune the reconciler. A zero field means its default.
type Params struct {
	// BootTimeout: a node with no joined agent this long after launch
	// (or after the daemon started, whichever is later) fails.
	BootTimeout time.Duration `json:"boot_timeout"`
	// OrphanGrace: an instance nobody accounts for is deleted only after
	// it has existed this long.
	OrphanGrace time.Duration `json:"orphan_grace"`
	// ScaleUpCooldown spaces growth waves (launches beyond min_nodes that
	// replace nothing), after a growth wave or a scale-down.
	ScaleUpCooldown time.Duration `json:"scale_up_cooldown"`
	// ScaleDownCooldown spaces scale-downs that drain running nodes (each
	// restarts the rendezvous round), after a growth wave or a scale-down.
	ScaleDownCooldown time.Duration `json:"scale_down_cooldown"`
	// MaxLaunchesPerPass caps launches and relaunches in one plan.
	MaxLaunchesPerPass int `json:"max_launches_per_pass"`
	// RelaunchAfter: a provisioning node with no instance in sight gets
	// its Create repeated (same token) this long after its last update.
	RelaunchAfter time.Duration `json:"relaunch_after"`
	// TerminateRetry: Delete is repeated this long after a node entered
	// terminating/failed while its instance is still observed.
	TerminateRetry time.Duration `json:"terminate_retry"`
	// ForgetAfter: terminated and failed records are deleted this long
	// after their last update.
	ForgetAfter time.Duration `json:"forget_after"`
	// VisibilityGrace: a booting node's instance missing from List is
	// taken as lost only this long after the node entered booting (cloud
	// list APIs are eventually consistent).
	VisibilityGrace time.Duration `json:"visibility_grace"`
	// NoticeHorizon: notices with a deadline further away than this are
	// deferred (e.g. maintenance in three days); the daemon keeps passing
	// them until they come within the horizon.
	NoticeHorizon time.Duration `json:"notice_horizon"`
	// DrainGrace is the drain deadline for drains fleetd starts itself
	// (scale-down, spot swap) and notices without a deadline; 0 means the
	// spec's training.drain_grace.
	DrainGrace time.Duration `json:"drain_grace"`
	// MinImprovement is the price-migration threshold (placement.Choose).
	MinImprovement float64         `json:"min_improvement"`
	Model          placement.Model `json:"model"`
	// Deadline is the deadline-mode policy; nil means
	// placement.DefaultDeadlinePolicy.
	Deadline placement.DeadlinePolicy `json:"-"`
	// Forecast, when set, tells placement how long spot capacity stays
	// up (placement.RunForecast); only fleetd sim's foresight policy.
	Forecast placement.RunForecast `json:"-"`
}

// Defaults.
const (
	DefaultBootTimeout        = 10 * time.Minute
	DefaultOrphanGrace        = 5 * time.Minute
	DefaultScaleUpCooldown    = time.Minute
	DefaultScaleDownCooldown  = 5 * time.Minute
	DefaultMaxLaunchesPerPass = 8
	DefaultRelaunchAfter      = 30 * time.Second
	DefaultTerminateRetry     = time.Minute
	DefaultForgetAfter        = time.Hour
	DefaultVisibilityGrace    = time.Minute
	DefaultNoticeHorizon      = 15 * time.Minute
)

func (p Params) withDefaults(f *spec.Fleet) Params {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&p.BootTimeout, DefaultBootTimeout)
	def(&p.OrphanGrace, DefaultOrphanGrace)
	def(&p.ScaleUpCooldown, DefaultScaleUpCooldown)
	def(&p.ScaleDownCooldown, DefaultScaleDownCooldown)
	def(&p.RelaunchAfter, DefaultRelaunchAfter)
	def(&p.TerminateRetry, DefaultTerminateRetry)
	def(&p.ForgetAfter, DefaultForgetAfter)
	def(&p.VisibilityGrace, DefaultVisibilityGrace)
	def(&p.NoticeHorizon, DefaultNoticeHorizon)
	if p.DrainGrace <= 0 && f != nil {
		p.DrainGrace = f.Training.DrainGrace
	}
	def(&p.DrainGrace, spec.DefaultDrainGrace)
	if p.MaxLaunchesPerPass <= 0 {
		p.MaxLaunchesPerPass = DefaultMaxLaunchesPerPass
	}
	return p
}

// Input is everything one pass looks at.
type Input struct {
	// Fleet is the decoded spec; nil (fleet deleted) or Destroying scales to 0.
	Fleet      *spec.Fleet
	Destroying bool
	// Finished says the teardown is because the training job ended (only
	// reasons differ from a destroy).
	Finished bool
	// Name is the fleet name; required when Fleet is nil.
	Name       string
	Generation int64
	DaemonID   string
	// Incarnation is the fleet's incarnation (state.Fleet.Incarnation):
	// instances tagged with another are never adopted, drained or
	// deleted. LegacyUntagged also accepts instances without the tag.
	Incarnation    string
	LegacyUntagged bool
	// Nodes are this fleet's node records.
	Nodes []state.Node
	// Instances are observed through provider List calls by fleet tag.
	Instances []providers.Instance
	// ObservedOK says which providers' List succeeded. A provider missing
	// here counts as failed: nothing is concluded from its absent
	// instances (no loss, no relaunch, no terminated).
	ObservedOK map[string]bool
	// Offerings is the market view; Records the per-offering history and
	// unavailable-offerings cache, by offering key.
	Offerings []providers.Offering
	Records   map[string]state.OfferingRecord
	// Notices are the active interruption notices for this fleet.
	Notices []interruption.Notice
	// Joined: the node's agent registered with the rendezvous service.
	// InRound: the node is a member of the current closed round.
	Joined  map[string]bool
	InRound map[string]bool
	Now     time.Time
	// StartedAt is when the daemon started: boot timeouts count from no
	// earlier than this, so agents get time to reconnect after a restart.
	StartedAt time.Time
	// LastScaleUp / LastScaleDown are when the daemon last applied a plan
	// with ScaledUp / ScaledDown set.
	LastScaleUp   time.Time
	LastScaleDown time.Time
	// Fallback is the persisted fallback state (Plan.Fallback of the
	// previous pass).
	Fallback placement.FallbackState
	// Progress feeds the deadline policy.
	Progress placement.Progress
	// Move prices restoring the job's checkpoint in a group it is not in
	// (placement.MoveCostFor); nil: moves are free.
	Move *placement.MoveCost
	// Target, when above 0, is the autoscaler's size for a fleet without
	// desired_nodes (fleet/autoscale), within [min_nodes, max_nodes];
	// 0 aims at the spec's TargetNodes.
	Target int
	// TargetAt is when the autoscaler last changed Target: the passes
	// after a change act on it without waiting for the scale cooldowns
	// (the autoscaler spaces its own changes).
	TargetAt time.Time
	// WorkScale, above 1, is how much longer the work left takes at the
	// autoscaler's size than at max_nodes (the spec's work is given at
	// max_nodes): the deadline policy counts its slack at that speed.
	WorkScale float64
	// Allot, when set, is the daemon allocator's share of the pool for
	// the fleet (fleet/allocator): it caps the target, and its Drain
	// nodes go first when the fleet shrinks.
	Allot *Allot
	// NewNodeID returns a fresh node id; it is called once per new node,
	// in plan order (the daemon uses NodeIDs). Nil (tests) uses
	// "<fleet>-<generation>-<n>" with the first unused n.
	NewNodeID func() string
	Params    Params
}

// Allot is a fleet's allocation.
type Allot struct {
	// Nodes caps the target; 0 holds the fleet at no nodes (queued or
	// paused: its nodes drain, the fleet stays).
	Nodes int
	// Drain names the nodes to retire first.
	Drain []string
	// Reason is the allocator's, for the drain reasons.
	Reason string
}

// Identity is who this fleet's instances must belong to.
func (in Input) Identity() Identity {
	name := in.Name
	if in.Fleet != nil {
		name = in.Fleet.Name
	}
	return Identity{Fleet: name, DaemonID: in.DaemonID, Incarnation: in.Incarnation, LegacyUntagged: in.LegacyUntagged}
}

// Plan is the outcome of one pass.
type Plan struct {
	Actions []Action `json:"actions"`
	// Target is the node count aimed for; Live the live nodes after the plan.
	Target int `json:"target"`
	Live   int `json:"live"`
	// Group is the colocation group the fleet is placed in ("" if none).
	Group     string             `json:"group,omitempty"`
	Placement string             `json:"placement,omitempty"` // why that group
	Capacity  placement.Decision `json:"capacity"`
	// Fallback is the next fallback state: persist it.
	Fallback placement.FallbackState `json:"fallback"`
	// View is the capacity decision with what it rests on (Capacity).
	View CapacityView `json:"-"`
	// ScaledUp / ScaledDown: record Now as LastScaleUp / LastScaleDown.
	ScaledUp   bool `json:"scaled_up,omitempty"`
	ScaledDown bool `json:"scaled_down,omitempty"`
}

// Alerts returns the plan's alerts.
func (p Plan) Alerts() []Alert {
	var out []Alert
	for _, a := range p.Actions {
		if al, ok := a.(Alert); ok {
			out = append(out, al)
		}
	}
	return out
}

// Live reports whether a node in state s counts toward the fleet's size.
func Live(s state.NodeState) bool {
	switch s {
	case state.NodeRequested, state.NodeProvisioning, state.NodeBooting, state.NodeJoined, state.NodeRunning:
		return true
	}
	return false
}

func inFlight(s state.NodeState) bool {
	return s == state.NodeRequested || s == state.NodeProvisioning || s == state.NodeBooting
}

func ended(s state.NodeState) bool {
	return s == state.NodeTerminated || s == state.NodeFailed
}

// gone reports whether an instance is going or gone for good.
func gone(i providers.Instance) bool {
	return i.State == providers.StateTerminated || i.State == providers.StateStopping
}

type planner struct {
	in     Input
	p      Params
	name   string
	nodes  []state.Node // the input's records until own() copies them
	owned  bool
	byID   map[string]int
	inst   map[string]int       // node id → index of its instance in in.Instances
	dups   []providers.Instance // extra instances of known nodes
	unk    []providers.Instance // instances no record accounts for
	done   map[string]bool      // nodes already moved this pass
	marked map[string]bool      // offering keys marked this pass
	alerts map[string]Alert
	plan   Plan
	// launches counts launches and relaunches; replaced counts nodes that
	// left the live set this pass through notices and losses.
	launches, replaced int
	newIDs             map[string]bool
	seq                int
}

// Reconcile computes the plan for one pass. It never mutates its input.
func Reconcile(in Input) Plan {
	pl := &planner{
		in:     in,
		p:      in.Params.withDefaults(in.Fleet),
		name:   in.Name,
		byID:   make(map[string]int, len(in.Nodes)),
		inst:   make(map[string]int, len(in.Nodes)),
		done:   map[string]bool{},
		marked: map[string]bool{},
		alerts: map[string]Alert{},
		newIDs: map[string]bool{},
	}
	if in.Fleet != nil {
		pl.name = in.Fleet.Name
	}
	// pl.nodes is the input until a record changes (own): a pass that
	// changes nothing copies no records. The capacity cap makes an append
	// reallocate instead of writing into the caller's array.
	pl.nodes = in.Nodes[:len(in.Nodes):len(in.Nodes)]
	// Records come from the store in id order: check before sorting.
	for i := 1; i < len(pl.nodes); i++ {
		if pl.nodes[i-1].ID > pl.nodes[i].ID {
			pl.own()
			sort.Slice(pl.nodes, func(i, j int) bool { return pl.nodes[i].ID < pl.nodes[j].ID })
			break
		}
	}
	for i, n := range pl.nodes {
		pl.byID[n.ID] = i
	}
	pl.observe()
	pl.notices()
	for i := range pl.nodes {
		if !pl.done[pl.nodes[i].ID] {
			pl.lifecycle(i)
		}
	}
	pl.orphans()
	pl.scale()
	pl.emitAlerts()
	return pl.plan
}

// observe matches observed instances to node records.
func (pl *planner) observe() {
	// Instances are visited in id order through a sorted index: sorting
	// 10,000 instance structs themselves costs more than the rest of
	// observe, and the input must not be reordered.
	insts := pl.in.Instances
	order := make([]int, len(insts))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(insts[a].ID, insts[b].ID) })
	byInstance := make(map[string]int, len(pl.nodes))
	for i, n := range pl.nodes {
		if n.InstanceID != "" {
			byInstance[n.InstanceID] = i
		}
	}
	// Candidates per node (index into pl.nodes): the first in id order,
	// and the rare further ones, so that 10,000 nodes with one instance
	// each cost no allocation per node.
	first := make([]int, len(pl.nodes))
	for i := range first {
		first[i] = -1
	}
	more := map[int][]int{}
	who := pl.in.Identity()
	for _, k := range order {
		in := &insts[k]
		switch who.Of(*in) {
		case OtherFleet:
			continue
		case OtherDaemon:
			if !gone(*in) {
				pl.alert(Alert{Kind: AlertForeign, Subject: in.ID,
					Message: fmt.Sprintf("instance %s carries fleet %q but daemon id %q (this daemon is %q); not touching it", in.ID, pl.name, in.Tags[providers.TagDaemonID], who.DaemonID)})
			}
			continue
		case OtherIncarnation:
			if !gone(*in) {
				pl.alert(Alert{Kind: AlertOtherIncarnation, Subject: in.ID,
					Message: fmt.Sprintf("instance %s belongs to incarnation %q of fleet %q, not to the current one (%q); not touching it: delete it by hand if it is stray", in.ID, in.Tags[providers.TagIncarnation], pl.name, who.Incarnation)})
			}
			continue
		}
		i, ok := byInstance[in.ID]
		if !ok {
			i, ok = pl.byID[in.Tags[providers.TagNodeID]]
		}
		switch {
		case ok && first[i] < 0:
			first[i] = k
		case ok:
			more[i] = append(more[i], k)
		case !gone(*in):
			pl.unk = append(pl.unk, *in)
		}
	}
	for i, n := range pl.nodes {
		if first[i] < 0 {
			continue
		}
		if len(more[i]) == 0 {
			pl.inst[n.ID] = first[i]
			continue
		}
		cs := append([]int{first[i]}, more[i]...)
		// The recorded instance wins; otherwise a live one, the oldest.
		slices.SortStableFunc(cs, func(x, y int) int {
			a, b := &insts[x], &insts[y]
			if (a.ID == n.InstanceID) != (b.ID == n.InstanceID) {
				if a.ID == n.InstanceID {
					return -1
				}
				return 1
			}
			if gone(*a) != gone(*b) {
				if !gone(*a) {
					return -1
				}
				return 1
			}
			if c := a.LaunchedAt.Compare(b.LaunchedAt); c != 0 {
				return c
			}
			return strings.Compare(a.ID, b.ID)
		})
		pl.inst[n.ID] = cs[0]
		for _, d := range cs[1:] {
			if !gone(insts[d]) {
				pl.dups = append(pl.dups, insts[d])
			}
		}
	}
	for _, prov := range pl.providers() {
		if !pl.in.ObservedOK[prov] {
			pl.alert(Alert{Kind: AlertObserve, Subject: prov, Message: fmt.Sprintf("listing %s instances failed; no decisions about them this pass", prov)})
		}
	}
}

// providers lists the providers this fleet uses: its spec's and its nodes'.
func (pl *planner) providers() []string {
	set := map[string]bool{}
	if pl.in.Fleet != nil {
		for _, p := range pl.in.Fleet.Providers {
			set[p.Name] = true
		}
	}
	for _, n := range pl.nodes {
		if k, found := pl.inst[n.ID]; !ended(n.State) || (found && pl.in.Instances[k].ID != "") {
			set[n.Offering.Provider] = true
		}
	}
	return sortedKeys(set)
}

// observed returns the node's instance and whether its provider's List
// succeeded, i.e. whether absence means anything.
func (pl *planner) observed(n state.Node) (providers.Instance, bool, bool) {
	k, found := pl.inst[n.ID]
	if !found {
		return providers.Instance{}, false, pl.in.ObservedOK[n.Offering.Provider]
	}
	return pl.in.Instances[k], true, pl.in.ObservedOK[n.Offering.Provider]
}

func (pl *planner) now() time.Time { return pl.in.Now }

func (pl *planner) add(a Action) { pl.plan.Actions = append(pl.plan.Actions, a) }

func (pl *planner) alert(a Alert) { pl.alerts[a.Kind+"\x00"+a.Subject] = a }

// own makes pl.nodes a copy of the input's records, before one changes.
func (pl *planner) own() {
	if !pl.owned {
		pl.nodes, pl.owned = slices.Clone(pl.nodes), true
	}
}

// move transitions node i and records the action.
func (pl *planner) move(i int, to state.NodeState, reason string, edit func(*state.Node)) {
	pl.own()
	n := &pl.nodes[i]
	from := n.State
	n.State = to
	n.Reason = reason
	n.UpdatedAt = pl.now()
	if edit != nil {
		edit(n)
	}
	pl.done[n.ID] = true
	pl.add(Transition{Node: *n, From: from, To: to, Reason: reason})
}

func (pl *planner) terminate(n state.Node, instanceID, reason string) {
	if instanceID == "" {
		return
	}
	pl.add(Terminate{NodeID: n.ID, InstanceID: instanceID, Provider: n.Offering.Provider, Reason: reason})
}

func (pl *planner) mark(key string, kind placement.UnavailableKind, reason string) {
	if pl.marked[key] {
		return
	}
	pl.marked[key] = true
	pl.add(MarkUnavailable{Key: key, Kind: kind, Reason: reason})
}

// notices drains noticed nodes: draining + Drain + the offering marked
// interrupted; the replacement is launched by scale() in the same pass.
func (pl *planner) notices() {
	ns := append([]interruption.Notice(nil), pl.in.Notices...)
	sort.SliceStable(ns, func(i, j int) bool {
		if ns[i].Key() != ns[j].Key() {
			return ns[i].Key() < ns[j].Key()
		}
		return ns[i].Deadline.Before(ns[j].Deadline)
	})
	for _, nt := range ns {
		if !nt.Kind.Terminal() {
			continue // rebalance recommendations are advisory
		}
		i := pl.nodeFor(nt)
		if i < 0 {
			continue
		}
		n := pl.nodes[i]
		if !Live(n.State) || pl.done[n.ID] {
			continue
		}
		inst, found, _ := pl.observed(n)
		instanceID := n.InstanceID
		if instanceID == "" && found {
			instanceID = inst.ID
		}
		src := fmt.Sprintf("%s notice from %s", nt.Kind, nt.Source)
		if nt.Kind == interruption.Lost {
			pl.move(i, state.NodeFailed, "lost: "+src, nil)
			pl.terminate(pl.nodes[i], instanceID, "node lost")
			pl.replaced++
			continue
		}
		deadline := nt.Deadline
		if deadline.IsZero() {
			deadline = pl.now().Add(pl.p.DrainGrace)
		}
		if deadline.Sub(pl.now()) > pl.p.NoticeHorizon {
			continue // deferred until it comes closer
		}
		pl.replaced++
		if n.Offering.CapacityType == providers.Spot {
			// A notice on an on-demand node (a retirement, an operator's
			// debug interrupt) says nothing of the offering's capacity:
			// marking it would take away the fallback of last resort.
			pl.mark(n.Offering.Key(), placement.UnavailableInterrupted, src)
		}
		if instanceID == "" {
			pl.move(i, state.NodeFailed, src+" before its instance was known", nil)
			continue
		}
		pl.move(i, state.NodeDraining, src, func(n *state.Node) {
			n.Deadline = deadline
			n.InstanceID = instanceID
		})
		pl.add(Drain{NodeID: n.ID, Deadline: deadline, Reason: src})
	}
}

func (pl *planner) nodeFor(nt interruption.Notice) int {
	if nt.Node != "" {
		if i, ok := pl.byID[nt.Node]; ok {
			return i
		}
		return -1
	}
	if nt.Instance == "" {
		return -1
	}
	for i, n := range pl.nodes {
		if inst, found, _ := pl.observed(n); n.InstanceID == nt.Instance || (found && inst.ID == nt.Instance) {
			return i
		}
	}
	return -1
}

// bootStart is when a node's boot clock started: launch, or the daemon's
// start if later.
func (pl *planner) bootStart(n state.Node) time.Time {
	if pl.in.StartedAt.After(n.CreatedAt) {
		return pl.in.StartedAt
	}
	return n.CreatedAt
}

// lifecycle advances node i by what was observed.
func (pl *planner) lifecycle(i int) {
	n := pl.nodes[i]
	inst, found, listOK := pl.observed(n)
	now := pl.now()
	switch n.State {
	case state.NodeRequested, state.NodeProvisioning:
		switch {
		case found && !gone(inst):
			n.State = state.NodeBooting
			n.InstanceID = inst.ID
			n.Address = inst.Address
			n.Reason = "instance " + inst.ID + " found"
			n.UpdatedAt = now
			pl.own()
			pl.nodes[i] = n
			pl.done[n.ID] = true
			pl.add(Adopt{Node: n, Instance: inst, Reason: "instance exists for " + string(n.State) + " node"})
		case found:
			pl.move(i, state.NodeFailed, "instance "+inst.ID+" ended before it booted", nil)
			pl.mark(n.Offering.Key(), placement.UnavailableCapacity, "instance ended before it booted")
			if inst.State != providers.StateTerminated {
				pl.terminate(pl.nodes[i], inst.ID, "instance ended before boot")
			}
		case !listOK:
			// Unknown whether an instance exists: wait.
		case !pl.launchable(n.Offering.Key()):
			pl.move(i, state.NodeFailed, "offering "+n.Offering.Key()+" unavailable: "+pl.in.Records[n.Offering.Key()].UnavailableReason, nil)
		case now.Sub(pl.bootStart(n)) >= pl.p.BootTimeout:
			pl.move(i, state.NodeFailed, fmt.Sprintf("no instance %s after launch", pl.p.BootTimeout), nil)
			pl.mark(n.Offering.Key(), placement.UnavailableLaunchError, "launch produced no instance within the boot timeout")
		case n.State == state.NodeRequested || now.Sub(n.UpdatedAt) >= pl.p.RelaunchAfter:
			if pl.launches < pl.p.MaxLaunchesPerPass {
				pl.launches++
				pl.done[n.ID] = true
				pl.add(Launch{Node: n, Offering: n.Offering, Relaunch: true, Reason: "no instance yet; repeating the launch with the same token",
					Network: n.Network}) // the same request: EC2 compares it under the token
			}
		}
	case state.NodeBooting, state.NodeJoined, state.NodeRunning:
		if listOK && pl.lost(n, inst, found) && pl.in.Destroying {
			// During a teardown, nodes power off on their own (an agent
			// whose job finished ends its VM): an end, not a loss, and no
			// interruption to hold against the offering.
			if found && inst.State != providers.StateTerminated {
				// Stopped but not gone: delete it like any other.
				pl.move(i, state.NodeTerminating, fmt.Sprintf("instance %s is %s: %s", inst.ID, inst.State, pl.teardownReason()), nil)
				pl.terminate(pl.nodes[i], inst.ID, pl.teardownReason())
				return
			}
			pl.move(i, state.NodeTerminated, "instance ended: "+pl.teardownReason(), nil)
			return
		}
		if listOK && pl.lost(n, inst, found) {
			why := "instance vanished without notice"
			if found {
				why = fmt.Sprintf("instance %s is %s without notice", inst.ID, inst.State)
			}
			pl.move(i, state.NodeFailed, "lost: "+why, nil)
			if n.Offering.CapacityType == providers.Spot {
				pl.mark(n.Offering.Key(), placement.UnavailableInterrupted, why)
			}
			if found && inst.State != providers.StateTerminated {
				pl.terminate(pl.nodes[i], inst.ID, "node lost")
			}
			pl.replaced++
			return
		}
		// Only ever forward: an agent that reconnects late does not send
		// a running node back to joined.
		switch {
		case pl.in.InRound[n.ID] && n.State != state.NodeRunning:
			pl.move(i, state.NodeRunning, "member of a closed rendezvous round", nil)
			return
		case pl.in.Joined[n.ID] && n.State == state.NodeBooting:
			pl.move(i, state.NodeJoined, "agent registered", nil)
			return
		}
		if n.State == state.NodeBooting && now.Sub(pl.bootStart(n)) >= pl.p.BootTimeout {
			pl.move(i, state.NodeFailed, fmt.Sprintf("boot timeout: no agent after %s", pl.p.BootTimeout), nil)
			pl.terminate(pl.nodes[i], instanceOf(n, inst, found), "boot timeout")
			pl.mark(n.Offering.Key(), placement.UnavailableBootFailure, "boot timeout")
		}
	case state.NodeDraining:
		switch {
		case listOK && (!found || inst.State == providers.StateTerminated):
			pl.move(i, state.NodeTerminated, "instance gone while draining", nil)
		case !n.DrainedAt.IsZero():
			pl.move(i, state.NodeTerminating, "drained: its agent reports its workers stopped and its checkpoint stored", nil)
			pl.terminate(pl.nodes[i], instanceOf(n, inst, found), "drained")
		case !now.Before(n.Deadline):
			pl.move(i, state.NodeTerminating, "drain deadline reached", nil)
			pl.terminate(pl.nodes[i], instanceOf(n, inst, found), "drain deadline reached")
		}
	case state.NodeTerminating:
		switch {
		case listOK && (!found || inst.State == providers.StateTerminated):
			pl.move(i, state.NodeTerminated, "instance deleted", nil)
		case found && now.Sub(n.UpdatedAt) >= pl.p.TerminateRetry:
			pl.terminate(n, inst.ID, "instance still present; repeating delete")
		}
	case state.NodeFailed, state.NodeTerminated:
		switch {
		case found && !gone(inst):
			// First delete comes with the transition; repeat only after a while.
			if now.Sub(n.UpdatedAt) >= pl.p.TerminateRetry || n.InstanceID != inst.ID {
				pl.terminate(n, inst.ID, "instance of an ended node")
			}
		case found && inst.State == providers.StateStopping:
			// Deletion in progress.
		case now.Sub(n.UpdatedAt) >= pl.p.ForgetAfter:
			pl.done[n.ID] = true
			pl.add(ForgetNode{NodeID: n.ID, Reason: fmt.Sprintf("%s for %s", n.State, pl.p.ForgetAfter)})
		}
	}
}

func instanceOf(n state.Node, inst providers.Instance, found bool) string {
	if found {
		return inst.ID
	}
	return n.InstanceID
}

// lost reports whether a booted node's instance is gone (with a
// successful list behind the verdict).
func (pl *planner) lost(n state.Node, inst providers.Instance, found bool) bool {
	if found {
		return gone(inst)
	}
	if n.State == state.NodeBooting && pl.now().Sub(n.UpdatedAt) < pl.p.VisibilityGrace {
		return false
	}
	return true
}

// launchable reports whether an offering may be launched on in this pass.
func (pl *planner) launchable(key string) bool {
	return !pl.marked[key] && placement.Available(pl.in.Records[key], pl.now())
}

// orphans deletes instances nobody accounts for, after the grace period,
// and only when they carry this daemon's id.
func (pl *planner) orphans() {
	now := pl.now()
	for _, in := range pl.dups {
		if !in.LaunchedAt.IsZero() && now.Sub(in.LaunchedAt) >= pl.p.OrphanGrace {
			pl.add(DeleteOrphan{Instance: in, Reason: "duplicate instance for node " + in.Tags[providers.TagNodeID]})
		}
	}
	for _, in := range pl.unk {
		switch {
		case pl.in.DaemonID == "":
			// Without a daemon id of our own, nothing proves it is ours.
			pl.alert(Alert{Kind: AlertForeign, Subject: in.ID,
				Message: fmt.Sprintf("instance %s carries fleet %q but this pass has no daemon id to check it against; not deleting it", in.ID, pl.name)})
		case in.LaunchedAt.IsZero():
			pl.alert(Alert{Kind: AlertUnknownAge, Subject: in.ID,
				Message: fmt.Sprintf("instance %s has no node record and no launch time; delete it by hand if it is stray", in.ID)})
		case now.Sub(in.LaunchedAt) >= pl.p.OrphanGrace:
			pl.add(DeleteOrphan{Instance: in, Reason: fmt.Sprintf("no node record for %q after %s", in.Tags[providers.TagNodeID], pl.p.OrphanGrace)})
		}
	}
}

func (pl *planner) emitAlerts() {
	keys := make([]string, 0, len(pl.alerts))
	for k := range pl.alerts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		pl.add(pl.alerts[k])
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		if v {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// teardownReason names why a fleet is scaled to zero.
func (pl *planner) teardownReason() string {
	if pl.in.Finished {
		return "job finished"
	}
	if pl.in.Allot != nil && !pl.in.Destroying {
		return pl.in.Allot.Reason
	}
	return "fleet destroyed"
}
