package reconcile

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/spec/spectest"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
)

// world is a tiny simulator: a scripted market, fake instances, node
// records as the daemon would persist them, agents that join after a boot
// delay and a rendezvous that closes a round once min_nodes joined. It
// executes plans the way the daemon is specified to.
type world struct {
	t        *testing.T
	fleet    *spec.Fleet
	daemonID string
	now      time.Time
	started  time.Time

	market []providers.Offering
	// capacity is the remaining capacity per offering key (missing =
	// unlimited); failKeys make Create fail with a capacity error.
	capacity map[string]int
	failKeys map[string]bool
	// advertise reports capacity in Offering.Available (else -1).
	advertise bool

	nodes     map[string]state.Node
	instances map[string]*providers.Instance
	byToken   map[string]string
	records   map[string]state.OfferingRecord
	notices   []interruption.Notice
	kills     map[string]time.Time // instance id → when the cloud takes it
	joined    map[string]bool
	inRound   map[string]bool
	listFail  map[string]bool

	fallback      placement.FallbackState
	progress      placement.Progress
	lastUp        time.Time
	lastDown      time.Time
	bootDelay     time.Duration
	noJoin        bool // agents never register (boot failure)
	attempts      map[string]int
	creates       int
	seq           int
	alerts        []Alert
	drained       map[string]time.Time
	params        Params
	maxLiveSeen   int
	onDemandSeen  int
	swapOverflows int
	quiet         time.Duration // settle's quiet window; 0 = 5 min
	// target and targetAt are the autoscaler's (Input.Target, TargetAt).
	target   int
	targetAt time.Time
	// allot is the allocator's share (Input.Allot).
	allot *Allot
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newWorld(t *testing.T, f *spec.Fleet, market ...providers.Offering) *world {
	return &world{
		t: t, fleet: f, daemonID: "d1", now: t0, started: t0.Add(-time.Hour),
		market: market, capacity: map[string]int{}, failKeys: map[string]bool{},
		nodes: map[string]state.Node{}, instances: map[string]*providers.Instance{}, byToken: map[string]string{},
		records: map[string]state.OfferingRecord{}, kills: map[string]time.Time{},
		joined: map[string]bool{}, inRound: map[string]bool{}, listFail: map[string]bool{},
		bootDelay: time.Minute, attempts: map[string]int{}, drained: map[string]time.Time{},
	}
}

func testFleet(minN, maxN int) *spec.Fleet {
	f := spectest.TypedFleet(minN, maxN, "aws")
	f.Training.DrainGrace = 90 * time.Second
	return f
}

func offering(zone, typ string, ct providers.CapacityType, price float64) providers.Offering {
	return spectest.Offering("aws", zone, typ, ct, price, -1)
}

func (w *world) input() Input {
	var nodes []state.Node
	for _, n := range w.nodes {
		nodes = append(nodes, n)
	}
	var insts []providers.Instance
	for _, in := range w.instances {
		if in.State == providers.StateTerminated {
			continue // List omits terminated instances
		}
		if w.listFail[in.Offering.Provider] {
			continue
		}
		insts = append(insts, *in)
	}
	ok := map[string]bool{}
	for _, p := range w.fleet.Providers {
		ok[p.Name] = !w.listFail[p.Name]
	}
	market := append([]providers.Offering(nil), w.market...)
	for i := range market {
		if c, capped := w.capacity[market[i].Key()]; capped && w.advertise {
			market[i].Available = c
		}
	}
	recs := map[string]state.OfferingRecord{}
	for k, v := range w.records {
		recs[k] = v
	}
	return Input{
		Fleet: w.fleet, Name: w.fleet.Name, Generation: 1, DaemonID: w.daemonID,
		Nodes: nodes, Instances: insts, ObservedOK: ok, Offerings: market, Records: recs,
		Notices: append([]interruption.Notice(nil), w.notices...), Joined: copyMap(w.joined), InRound: copyMap(w.inRound),
		Now: w.now, StartedAt: w.started, LastScaleUp: w.lastUp, LastScaleDown: w.lastDown,
		Fallback: w.fallback, Progress: w.progress, NewNodeID: w.newID, Params: w.params,
		Target: w.target, TargetAt: w.targetAt, Allot: w.allot,
	}
}

func copyMap(m map[string]bool) map[string]bool {
	out := map[string]bool{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (w *world) newID() string {
	w.seq++
	return fmt.Sprintf("n%03d", w.seq)
}

// create is the fake provider's Create: idempotent on the token.
func (w *world) create(n state.Node) ([]providers.Instance, error) {
	w.creates++
	key := n.Offering.Key()
	w.attempts[key]++
	if id, ok := w.byToken[n.ID]; ok {
		return []providers.Instance{*w.instances[id]}, nil
	}
	if w.failKeys[key] {
		return nil, providers.InsufficientCapacity(fmt.Errorf("no capacity for %s", key))
	}
	if c, capped := w.capacity[key]; capped {
		if c <= 0 {
			return nil, providers.InsufficientCapacity(fmt.Errorf("no capacity left for %s", key))
		}
		w.capacity[key] = c - 1
	}
	id := fmt.Sprintf("i-%s", n.ID)
	in := &providers.Instance{
		ID: id, Offering: n.Offering, State: providers.StateRunning, Address: "10.0.0." + n.ID,
		Tags:       map[string]string{providers.TagFleet: w.fleet.Name, providers.TagNodeID: n.ID, providers.TagDaemonID: w.daemonID},
		LaunchedAt: w.now,
	}
	w.instances[id] = in
	w.byToken[n.ID] = id
	return []providers.Instance{*in}, nil
}

func (w *world) deleteInstance(id string) {
	in, ok := w.instances[id]
	if !ok || in.State == providers.StateTerminated {
		return
	}
	in.State = providers.StateTerminated
	if c, capped := w.capacity[in.Offering.Key()]; capped {
		w.capacity[in.Offering.Key()] = c + 1
	}
}

func (w *world) mark(key string, kind placement.UnavailableKind, reason string) {
	rec := w.records[key]
	rec.Key = key
	w.records[key] = placement.MarkUnavailable(rec, w.now, reason, kind)
}

// apply executes a plan as the daemon does.
func (w *world) apply(p Plan) {
	w.alerts = nil
	for _, a := range p.Actions {
		switch a := a.(type) {
		case Transition:
			w.nodes[a.Node.ID] = a.Node
		case Adopt:
			w.nodes[a.Node.ID] = a.Node
		case Launch:
			n := a.Node
			w.nodes[n.ID] = n
			n = StartLaunch(n, w.now)
			w.nodes[n.ID] = n
			insts, err := w.create(n)
			res := AfterLaunch(n, insts, err, w.now)
			w.nodes[n.ID] = res.Node
			if res.Mark != nil {
				w.mark(res.Mark.Key, res.Mark.Kind, res.Mark.Reason)
			}
			if res.Succeeded {
				rec := w.records[n.Offering.Key()]
				rec.Key = n.Offering.Key()
				w.records[rec.Key] = placement.RecordLaunch(rec, w.now)
			}
		case Terminate:
			w.deleteInstance(a.InstanceID)
		case DeleteOrphan:
			w.deleteInstance(a.Instance.ID)
		case MarkUnavailable:
			w.mark(a.Key, a.Kind, a.Reason)
		case Drain:
			w.drained[a.NodeID] = a.Deadline
			delete(w.inRound, a.NodeID)
		case ForgetNode:
			delete(w.nodes, a.NodeID)
		case Alert:
			w.alerts = append(w.alerts, a)
		default:
			w.t.Fatalf("unknown action %T", a)
		}
	}
	w.fallback = p.Fallback
	if p.ScaledUp {
		w.lastUp = w.now
	}
	if p.ScaledDown {
		w.lastDown = w.now
	}
	// Notices are consumed once the node left the live set.
	var keep []interruption.Notice
	for _, nt := range w.notices {
		if n, ok := w.nodes[nt.Node]; ok && Live(n.State) {
			keep = append(keep, nt)
		}
	}
	w.notices = keep
}

// tick advances the clock and the world: scheduled kills, agents joining,
// the rendezvous closing a round.
func (w *world) tick(d time.Duration) {
	w.now = w.now.Add(d)
	for id, at := range w.kills {
		if !w.now.Before(at) {
			w.deleteInstance(id)
			delete(w.kills, id)
		}
	}
	byNode := map[string]*providers.Instance{}
	for _, in := range w.instances {
		if in.State != providers.StateTerminated {
			byNode[in.Tags[providers.TagNodeID]] = in
		}
	}
	for id := range w.joined {
		if byNode[id] == nil {
			delete(w.joined, id)
			delete(w.inRound, id)
		}
	}
	for id, in := range byNode {
		if !w.noJoin && w.now.Sub(in.LaunchedAt) >= w.bootDelay {
			if n, ok := w.nodes[id]; ok && Live(n.State) {
				w.joined[id] = true
			}
		}
	}
	// A round: the joined live nodes, once at least min_nodes joined, up
	// to max_nodes; members of the current round keep their seats, later
	// joiners wait as standbys while it is full.
	var stay, wait []string
	for id := range w.joined {
		if n, ok := w.nodes[id]; ok && Live(n.State) {
			if w.inRound[id] {
				stay = append(stay, id)
			} else {
				wait = append(wait, id)
			}
		}
	}
	sort.Strings(stay)
	sort.Strings(wait)
	members := append(stay, wait...)
	if len(members) > w.fleet.MaxNodes {
		members = members[:w.fleet.MaxNodes]
	}
	w.inRound = map[string]bool{}
	if len(members) >= w.fleet.MinNodes {
		for _, id := range members {
			w.inRound[id] = true
		}
	}
}

// pass runs one reconcile pass and applies it, checking invariants.
func (w *world) pass() Plan {
	w.t.Helper()
	p := Reconcile(w.input())
	w.apply(p)
	w.check()
	return p
}

// check asserts the invariants that must hold after every pass.
func (w *world) check() {
	w.t.Helper()
	live, od := 0, 0
	for _, n := range w.nodes {
		if Live(n.State) {
			live++
			if n.Offering.CapacityType == providers.OnDemand {
				od++
			}
		}
	}
	limit := w.fleet.MaxNodes
	if w.fleet.Node.Spot {
		limit += od // a spot node may stand in for each on-demand node while it joins
	}
	if live > limit {
		w.t.Fatalf("%s: %d live nodes > %d allowed\n%s", w.now.Sub(t0), live, limit, w.dump())
	}
	if live > w.fleet.MaxNodes {
		w.swapOverflows++
	}
	w.maxLiveSeen = max(w.maxLiveSeen, live)
	w.onDemandSeen = max(w.onDemandSeen, od)
	// No node ever has two live instances (idempotent launches).
	per := map[string]int{}
	for _, in := range w.instances {
		if in.State != providers.StateTerminated {
			per[in.Tags[providers.TagNodeID]]++
		}
	}
	for id, c := range per {
		if c > 1 {
			w.t.Fatalf("node %s has %d live instances", id, c)
		}
	}
}

// settle runs a pass every step until plans have carried only alerts for
// a quiet window (default five virtual minutes: longer than boot delay,
// drain grace and cooldowns), or fails after limit passes.
func (w *world) settle(step time.Duration, limit int) {
	w.t.Helper()
	quiet := w.quiet
	if quiet == 0 {
		quiet = 5 * time.Minute
	}
	var quietSince time.Time
	for i := 0; i < limit; i++ {
		p := w.pass()
		switch {
		case !onlyAlerts(p):
			quietSince = time.Time{}
		case quietSince.IsZero():
			quietSince = w.now
		case w.now.Sub(quietSince) >= quiet:
			return
		}
		w.tick(step)
	}
	w.t.Fatalf("no fixpoint after %d passes\n%s", limit, w.dump())
}

func onlyAlerts(p Plan) bool {
	for _, a := range p.Actions {
		if _, ok := a.(Alert); !ok {
			return false
		}
	}
	return true
}

// count returns how many nodes are in each state.
// settleRunning settles the world in steps of step and fails the test,
// saying when, unless it then runs exactly running nodes.
func (w *world) settleRunning(running int, when string) {
	w.t.Helper()
	w.settle(step, 200)
	if c := w.count(); c[state.NodeRunning] != running {
		w.t.Fatalf("%s: %v, want %d running\n%s", when, c, running, w.dump())
	}
}

func (w *world) count() map[state.NodeState]int {
	out := map[state.NodeState]int{}
	for _, n := range w.nodes {
		out[n.State]++
	}
	return out
}

func (w *world) liveBy(fn func(state.Node) bool) int {
	c := 0
	for _, n := range w.nodes {
		if Live(n.State) && fn(n) {
			c++
		}
	}
	return c
}

func (w *world) dump() string {
	var ids []string
	for id := range w.nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var b strings.Builder
	for _, id := range ids {
		n := w.nodes[id]
		fmt.Fprintf(&b, "  %s %-12s %s %s (%s)\n", id, n.State, n.Offering.Key(), n.InstanceID, n.Reason)
	}
	for _, a := range w.alerts {
		fmt.Fprintf(&b, "  alert %s\n", a.Message)
	}
	return b.String()
}

func actionsOf[T Action](p Plan) []T {
	var out []T
	for _, a := range p.Actions {
		if x, ok := a.(T); ok {
			out = append(out, x)
		}
	}
	return out
}
