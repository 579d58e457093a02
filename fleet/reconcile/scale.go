package reconcile

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// target is the node count the pass aims at: the autoscaler's when it
// decided (Input.Target), else the spec's TargetNodes; within
// [0, max_nodes].
func (pl *planner) target() int {
	f := pl.in.Fleet
	t := f.TargetNodes()
	if pl.in.Target > 0 && f.DesiredNodes == 0 {
		t = max(pl.in.Target, f.MinNodes)
	}
	if a := pl.in.Allot; a != nil {
		t = min(t, a.Nodes)
	}
	return min(max(t, 0), f.MaxNodes)
}

// cooling reports whether a scale step (growth beyond what restores
// min_nodes, or a drain of running nodes) waits for the cooldown d: it
// does within d of the last growth wave or scale-down, unless the
// autoscaler changed its target since.
func (pl *planner) cooling(d time.Duration) bool {
	now := pl.now()
	last := pl.in.LastScaleUp
	if pl.in.LastScaleDown.After(last) {
		last = pl.in.LastScaleDown
	}
	if !pl.in.TargetAt.IsZero() && pl.in.TargetAt.After(last) {
		return false
	}
	return now.Sub(pl.in.LastScaleUp) < d || now.Sub(pl.in.LastScaleDown) < d
}

// liveNodes returns the indices of live nodes, in ID order.
func (pl *planner) liveNodes() []int {
	var out []int
	for i, n := range pl.nodes {
		if Live(n.State) {
			out = append(out, i)
		}
	}
	return out
}

// capacityView is a pass's capacity decision and what it was made from.
type capacityView struct {
	dec      placement.Decision
	fallback placement.FallbackState
	// base is the placement input every choice of the pass starts from:
	// offerings marked this pass and spot offerings the deadline policy
	// does not admit are excluded.
	base placement.ChooseInput
	// spot is the spot-only choice on admitted offerings (the spot probe).
	spot placement.Choice
	// viable, offered: spot on admitted offerings, on any, can hold
	// min_nodes.
	viable, offered bool
}

// capacity decides which capacity types the pass may launch. It folds
// this look at the market into the fleet's spot history, asks the
// deadline policy which spot offerings are worth a new node
// (placement.MinSpotRun: expected run from the history), probes for a
// spot placement on those and on all, and applies the fallback policy.
// live are the indices of the live nodes. prev, when set, is the view of
// an earlier look at the same nodes, market and records (only the clock
// moved): its probes stand when the same offerings are excluded.
func (pl *planner) capacity(live []int, prev *CapacityView) capacityView {
	f := pl.in.Fleet
	now := pl.now()
	target := pl.target()
	liveOffs := make([]providers.Offering, 0, len(live))
	odLive, running, pendingSpot := 0, 0, 0
	for _, i := range live {
		n := pl.nodes[i]
		liveOffs = append(liveOffs, n.Offering)
		switch {
		case n.Offering.CapacityType == providers.OnDemand:
			odLive++
		case n.State != state.NodeRunning:
			pendingSpot++
		}
		if n.State == state.NodeRunning {
			running++
		}
	}
	fb, ownSpot := pl.observeSpot(live)
	fin := placement.FallbackInput{
		Fleet: f, State: fb, Now: now, Live: len(live), OnDemandLive: odLive,
		ChangeRate: placement.ChangeRate(fb.Spot, pl.in.Records, now), Progress: pl.in.Progress,
		Changeover: pl.p.Model.InterruptionCost, Policy: pl.p.Deadline,
	}
	if k := pl.in.WorkScale; k > 1 && f.Work > 0 {
		// The work (given at max_nodes) takes k times as long at the
		// autoscaler's size: so does what is left of it.
		scaled := *f
		scaled.Work = time.Duration(float64(f.Work) * k)
		fin.Fleet = &scaled
		fin.Progress.Done = time.Duration(float64(fin.Progress.Done) * k)
	}

	outlook := pl.outlook(fb, fin)
	exclude := map[string]bool{}
	for k := range pl.marked {
		exclude[k] = true
	}
	// Spot dearer than the market's best by more than the policy's
	// premium counts as not offered: the policy waits for the cheaper
	// capacity as it waits when there is none (PriceWaiter).
	for k := range placement.Overpriced(f, pl.in.Offerings, pl.in.Records, pl.p.Model, outlook, placement.MaxPremium(fin), ownSpot) {
		exclude[k] = true
	}
	base := placement.ChooseInput{
		Fleet: f, Offerings: pl.in.Offerings, Records: pl.in.Records, Now: now,
		Model: pl.p.Model, Nodes: liveOffs, Need: max(target-len(live), 0), Target: target,
		Exclude: exclude, AtBoundary: running == 0, MinImprovement: pl.p.MinImprovement,
		Outlook: outlook, Move: pl.in.Move,
	}
	admitted := base
	if minRun := placement.MinSpotRun(fin); minRun > 0 {
		admitted.Exclude = map[string]bool{}
		for k := range exclude {
			admitted.Exclude[k] = true
		}
		for _, o := range placement.Filter(f, pl.in.Offerings) {
			if o.CapacityType == providers.Spot && !ownSpot[o.Key()] && !exclude[o.Key()] &&
				outlook.ExpectedRun(o, pl.in.Records[o.Key()]) < minRun {
				admitted.Exclude[o.Key()] = true
			}
		}
	}
	cv := capacityView{base: admitted}
	switch {
	case !f.Node.Spot:
		// On-demand only: no spot to probe for.
	case prev != nil && slices.Equal(prev.Excluded, cv.excluded()):
		cv.viable, cv.offered = prev.SpotViable, prev.SpotOffered
	default:
		// The job's own spot nodes that are not running yet (booting, or
		// joined and waiting for the round) hold capacity the market no
		// longer shows as free: spot is available to the job. Otherwise
		// a policy that wants on-demand while spot is away would retire
		// the spot node replacing an on-demand one before it takes over,
		// see its capacity free again and launch it again — every pass.
		viable := func(c placement.Choice) bool {
			return c.CanHoldMin && (len(c.Candidates) > 0 || pendingSpot > 0)
		}
		probe := func(in placement.ChooseInput) placement.Choice {
			in.Capacity = placement.SpotOnly("spot probe")
			return placement.Choose(in)
		}
		cv.spot = probe(base)
		cv.offered = viable(cv.spot)
		if len(admitted.Exclude) > len(exclude) {
			cv.spot = probe(admitted)
		}
		cv.viable = viable(cv.spot)
	}
	fin.SpotViable, fin.SpotOffered = cv.viable, cv.offered
	cv.dec, cv.fallback = placement.DecideCapacity(fin)
	return cv
}

// outlook is what placement ranks spot offerings by beyond their
// records: the fleet's market history (with this look folded in), the
// notice lead, and the slack an interruption's changeover costs, priced
// by the deadline policy (SlackWorth) at the cheapest on-demand
// $/GPU-hour.
func (pl *planner) outlook(fb placement.FallbackState, fin placement.FallbackInput) placement.Outlook {
	f := pl.in.Fleet
	out := placement.Outlook{Now: pl.now(), Spot: fb.Spot, Lead: placement.DefaultNoticeLead, Forecast: pl.p.Forecast}
	if out.SlackValue = placement.SlackWorth(fin); out.SlackValue > 0 {
		for _, o := range placement.Filter(f, pl.in.Offerings) {
			if o.CapacityType != providers.OnDemand {
				continue
			}
			if p := o.PricePerGPUHour(); out.OnDemandPerGPU == 0 || p < out.OnDemandPerGPU {
				out.OnDemandPerGPU = p
			}
		}
	}
	return out
}

// observeSpot folds this look at the market into the fleet's spot
// history (placement.ObserveSpot); the fleet's own live spot nodes hold
// capacity that is up. It returns the new fallback state and those
// nodes' offering keys.
func (pl *planner) observeSpot(live []int) (placement.FallbackState, map[string]bool) {
	own := map[string]bool{}
	for _, i := range live {
		if o := pl.nodes[i].Offering; o.CapacityType == providers.Spot {
			own[o.Key()] = true
		}
	}
	fb := pl.in.Fallback
	fb.Spot = placement.ObserveSpot(fb.Spot, pl.in.Fleet, pl.in.Offerings, own, pl.now())
	return fb, own
}

func (c capacityView) excluded() []string {
	out := make([]string, 0, len(c.base.Exclude))
	for k := range c.base.Exclude {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// scale brings the live count to the target: placement, fallback, launches,
// migration, spot swaps and scale-down.
func (pl *planner) scale() {
	f := pl.in.Fleet
	target := 0
	if f != nil && !pl.in.Destroying {
		target = pl.target()
	}
	pl.plan.Target = target
	if target == 0 {
		// Destroy: everything goes, without cooldowns.
		for _, i := range pl.liveNodes() {
			pl.retire(i, pl.teardownReason())
		}
		pl.plan.Live = 0
		return
	}
	colocate := f.Placement.Colocate
	if colocate == "" {
		colocate = spec.ColocateZone
	}

	live := pl.liveNodes()
	odLive, inflight := 0, 0
	for _, i := range live {
		n := pl.nodes[i]
		if n.Offering.CapacityType == providers.OnDemand {
			odLive++
		}
		if inFlight(n.State) {
			inflight++
		}
	}
	deficit := max(target-len(live), 0)

	cv := pl.capacity(live, nil)
	dec := cv.dec
	base := cv.base
	pl.plan.Capacity, pl.plan.Fallback, pl.plan.View = dec, cv.fallback, cv.view()
	choice := cv.spot
	onFallback := f.Node.Spot && odLive > 0 && !dec.KeepOnDemand
	if dec.OnDemand || !dec.Spot || onFallback {
		in := base
		in.Capacity = dec
		in.OnFallback = onFallback
		choice = placement.Choose(in)
	}
	pl.plan.Group, pl.plan.Placement = choice.Group, choice.Reason
	if len(live) < f.MinNodes && !choice.CanHoldMin {
		pl.alert(Alert{Kind: AlertNoCapacity, Message: fmt.Sprintf("%d of min_nodes %d live and no placement can hold min_nodes: %s (%s)", len(live), f.MinNodes, choice.Reason, dec.Reason)})
	}
	if f.Node.Spot && odLive > 0 {
		pl.alert(Alert{Kind: AlertOnDemand, Message: fmt.Sprintf("%d on-demand node(s) live: %s", odLive, dec.Reason)})
	}
	pl.quotaAlerts(f)

	if choice.Migrate {
		for _, i := range live {
			if placement.GroupKey(pl.nodes[i].Offering, colocate) != choice.Group {
				pl.retire(i, "job moves to "+choice.Group+": "+choice.Reason)
			}
		}
		pl.launch(choice.Launch, len(choice.Launch), "placement: "+choice.Reason)
		pl.plan.Live = len(pl.liveNodes())
		return
	}

	surplus := len(live) - target
	swapping := f.Node.Spot && odLive > 0 && !dec.KeepOnDemand
	switch {
	case surplus > 0 && surplus <= odLive && swapping:
		// The surplus nodes are spot nodes replacing on-demand ones (or the
		// target dropped: on-demand nodes are the best victims either
		// way). Retire the on-demand nodes once nothing is in flight, i.e.
		// the spot nodes have joined.
		if inflight == 0 {
			for _, v := range pl.pickVictims(live, surplus, colocate, choice.Group, providers.OnDemand) {
				pl.retire(v, "replaced by spot capacity")
			}
		}
	case surplus > 0 && odLive > 0 && dec.KeepOnDemand:
		// The policy wants on-demand (e.g. its safety net) while spot
		// nodes are joining to replace on-demand ones: those go first,
		// wherever they are.
		pl.shrink(live, surplus, colocate, choice.Group, func(n state.Node) bool {
			return n.Offering.CapacityType == providers.Spot && n.State != state.NodeRunning
		})
	case surplus > 0 && pl.in.Allot != nil && len(pl.in.Allot.Drain) > 0:
		// The allocator named the nodes to give up (never rank 0 while
		// another can go): those first, in its order.
		pl.shrink(live, surplus, colocate, choice.Group, pl.allotFirst())
	case surplus > 0:
		pl.shrink(live, surplus, colocate, choice.Group, nil)
	case deficit > 0:
		// Launches that restore min_nodes or replace nodes lost in this
		// pass never wait; growth beyond that waits for the cooldowns.
		exempt := max(f.MinNodes-len(live), pl.replaced, 0)
		n := deficit
		if pl.cooling(pl.p.ScaleUpCooldown) {
			n = min(n, exempt)
		}
		got := pl.launch(choice.Launch, n, "placement: "+choice.Reason)
		if got > exempt {
			pl.plan.ScaledUp = true
		}
	case swapping && inflight == 0:
		// At target with on-demand nodes while spot is back: add one spot
		// node in the job's group; its on-demand twin goes once it joined.
		in := base
		// The spot node comes on top of the target until its twin goes.
		in.Need, in.Target, in.Capacity = 1, target+1, placement.SpotOnly("spot swap")
		sc := placement.Choose(in)
		if !sc.Migrate && sc.Group != "" && sc.Group == sc.Current && len(sc.Launch) > 0 {
			pl.launch(sc.Launch, 1, "spot swap: spot capacity is back; replaces an on-demand node once joined")
		} else if odLive == len(live) {
			// No spot in the job's group, but the job runs entirely on
			// on-demand: it moves whole to spot in the best other group
			// (a restart from its checkpoint) when that is cheaper by
			// MinImprovement, like a move at a rendezvous boundary.
			in.Nodes, in.Need, in.Target = nil, target, target
			if mc := placement.Choose(in); mc.Group != "" && mc.Group != choice.Group && len(mc.Launch) == target && mc.Cost <= choice.Cost*(1-pl.minImprovement()) {
				// At max_nodes the rendezvous keeps the new nodes out of
				// the running round (standbys) until the on-demand nodes
				// leave: those keep training while the spot nodes boot
				// and go once they joined (the case above), so the move
				// costs the restart but not the boot. Below max_nodes the
				// new nodes would be merged into the round across groups:
				// the on-demand nodes go first.
				mbb := target == f.MaxNodes
				if !mbb {
					for _, i := range live {
						pl.retire(i, "job on on-demand moves to spot in "+mc.Group)
					}
				}
				reason := "placement: on-demand job moves to spot: " + mc.Reason
				if mbb {
					reason += "; replaces the on-demand nodes once joined"
				}
				pl.launch(mc.Launch, target, reason)
			}
		}
	}
	pl.plan.Live = len(pl.liveNodes())
}

// shrink retires surplus nodes, those matching first (when set) before
// the rest. Nodes that are not running go at once (no round changes);
// draining running nodes restarts the round, so that part waits for the
// cooldowns.
func (pl *planner) shrink(live []int, surplus int, colocate spec.Colocate, group string, first func(state.Node) bool) {
	var victims []int
	if first != nil {
		var firsts []int
		for _, i := range live {
			if first(pl.nodes[i]) {
				firsts = append(firsts, i)
			}
		}
		victims = pl.pickVictims(firsts, surplus, colocate, group, "")
	}
	taken := map[int]bool{}
	for _, v := range victims {
		taken[v] = true
	}
	for _, v := range pl.pickVictims(live, len(live), colocate, group, "") {
		if len(victims) < surplus && !taken[v] {
			victims = append(victims, v)
		}
	}
	cool := pl.cooling(pl.p.ScaleDownCooldown)
	for _, i := range victims {
		if pl.nodes[i].State == state.NodeRunning {
			if cool {
				continue
			}
			pl.plan.ScaledDown = true
		}
		pl.retire(i, fmt.Sprintf("scale down to %d nodes", pl.plan.Target))
	}
}

// allotFirst is shrink's preference for the allocator's drain order.
func (pl *planner) allotFirst() func(state.Node) bool {
	named := map[string]bool{}
	for _, id := range pl.in.Allot.Drain {
		named[id] = true
	}
	return func(n state.Node) bool { return named[n.ID] }
}

// pickVictims orders live nodes for removal: outside the job's group
// first, then not yet running, then most expensive, then newest; with ct
// set, only nodes of that capacity type qualify.
func (pl *planner) pickVictims(live []int, n int, colocate spec.Colocate, group string, ct providers.CapacityType) []int {
	var cands []int
	for _, i := range live {
		if ct != "" && pl.nodes[i].Offering.CapacityType != ct {
			continue
		}
		cands = append(cands, i)
	}
	outside := func(i int) bool {
		return group != "" && placement.GroupKey(pl.nodes[i].Offering, colocate) != group
	}
	sort.SliceStable(cands, func(x, y int) bool {
		a, b := pl.nodes[cands[x]], pl.nodes[cands[y]]
		if oa, ob := outside(cands[x]), outside(cands[y]); oa != ob {
			return oa
		}
		if ra, rb := a.State == state.NodeRunning, b.State == state.NodeRunning; ra != rb {
			return !ra
		}
		if a.Offering.PricePerHour != b.Offering.PricePerHour {
			return a.Offering.PricePerHour > b.Offering.PricePerHour
		}
		if !a.CreatedAt.Equal(b.CreatedAt) {
			return a.CreatedAt.After(b.CreatedAt)
		}
		return a.ID > b.ID
	})
	if len(cands) > n {
		cands = cands[:n]
	}
	return cands
}

// retire takes a live node out: running nodes drain gracefully, nodes
// without an instance end at once, the rest are deleted.
func (pl *planner) retire(i int, reason string) {
	n := pl.nodes[i]
	inst, found, _ := pl.observed(n)
	id := instanceOf(n, inst, found)
	switch {
	case n.State == state.NodeRunning:
		deadline := pl.now().Add(pl.p.DrainGrace)
		pl.move(i, state.NodeDraining, reason, func(n *state.Node) { n.Deadline = deadline })
		pl.add(Drain{NodeID: n.ID, Deadline: deadline, Reason: reason})
	case id == "":
		// Never launched as far as anyone knows; an instance that shows
		// up later belongs to an ended node and is deleted.
		pl.move(i, state.NodeTerminated, reason+" (before an instance existed)", nil)
	default:
		pl.move(i, state.NodeTerminating, reason, func(n *state.Node) { n.InstanceID = id })
		pl.terminate(pl.nodes[i], id, reason)
	}
}

// launch adds up to n new nodes on offs (in order), within the per-pass
// cap; it returns how many it added.
func (pl *planner) launch(offs []providers.Offering, n int, reason string) int {
	got := 0
	for _, o := range offs {
		if got >= n || pl.launches >= pl.p.MaxLaunchesPerPass {
			break
		}
		id := pl.newID()
		net, why := pl.network(o), reason
		if net.Fallback != "" {
			why += "; " + net.Fallback // the node's event says the group was given up
		}
		node := state.Node{
			ID: id, Fleet: pl.name, State: state.NodeRequested, Reason: why,
			Offering: o, Network: net.Request, CreatedAt: pl.now(), UpdatedAt: pl.now(),
		}
		pl.nodes = append(pl.nodes, node)
		pl.byID[id] = len(pl.nodes) - 1
		pl.done[id] = true
		pl.add(Launch{Node: node, Offering: o, Reason: why, Network: net.Request})
		pl.launches++
		got++
	}
	return got
}

func (pl *planner) newID() string {
	if pl.in.NewNodeID != nil {
		id := pl.in.NewNodeID()
		pl.newIDs[id] = true
		return id
	}
	for {
		pl.seq++
		id := pl.name + "-" + strconv.FormatInt(pl.in.Generation, 10) + "-" + strconv.Itoa(pl.seq)
		if _, taken := pl.byID[id]; !taken && !pl.newIDs[id] {
			pl.newIDs[id] = true
			return id
		}
	}
}

// quotaAlerts raises one alert per offering of the fleet backed off on a
// quota error.
func (pl *planner) quotaAlerts(f *spec.Fleet) {
	for _, o := range placement.Filter(f, pl.in.Offerings) {
		rec := pl.in.Records[o.Key()]
		u, ok := placement.ParseUnavailable(rec)
		if !ok || u.Kind != placement.UnavailableQuota || placement.Available(rec, pl.now()) {
			continue
		}
		pl.alert(Alert{Kind: AlertQuota, Subject: o.Key(),
			Message: fmt.Sprintf("quota exceeded for %s (retry after %s): %s", o.Key(), u.Until.UTC().Format("2006-01-02T15:04:05Z"), u.Message)})
	}
}

func (pl *planner) minImprovement() float64 {
	if pl.p.MinImprovement > 0 {
		return pl.p.MinImprovement
	}
	return placement.DefaultMinImprovement
}

// CapacityView is the capacity decision a pass would make, with what it
// rests on beyond the Decision: fleetd sim compares views to skip passes
// that would plan nothing new.
type CapacityView struct {
	Decision placement.Decision
	Fallback placement.FallbackState
	// SpotViable and SpotOffered: a spot placement on admitted offerings,
	// and on any, can hold min_nodes.
	SpotViable, SpotOffered bool
	// Excluded are the offering keys no placement of the pass may use.
	Excluded []string
}

// Same reports whether a pass at v would choose as one at o did: the
// same capacity types, limits and history, and the same offerings to
// choose from. MinSpotRun and the reasons may differ.
func (v CapacityView) Same(o CapacityView) bool {
	a, b := v.Decision, o.Decision
	return a.Spot == b.Spot && a.OnDemand == b.OnDemand && a.OnDemandLimit == b.OnDemandLimit &&
		a.KeepOnDemand == b.KeepOnDemand && v.Fallback.Equal(o.Fallback) &&
		v.SpotViable == o.SpotViable && v.SpotOffered == o.SpotOffered && slices.Equal(v.Excluded, o.Excluded)
}

// Capacity is the capacity decision a pass at in would make, for a live
// fleet whose nodes need no lifecycle step (the state after a pass that
// changed nothing). prev, when set, is the view at the same nodes,
// market and records, only earlier: its spot probes are reused when the
// same offerings are excluded.
func Capacity(in Input, prev *CapacityView) CapacityView {
	pl := newReadOnlyPlanner(in)
	if pl == nil {
		return CapacityView{Fallback: in.Fallback}
	}
	return pl.capacity(pl.liveNodes(), prev).view()
}

func (c capacityView) view() CapacityView {
	return CapacityView{Decision: c.dec, Fallback: c.fallback, SpotViable: c.viable, SpotOffered: c.offered, Excluded: c.excluded()}
}

// ObserveSpot is the fallback state a pass at in would persist when it
// decides nothing new: the fleet's spot history with this look at the
// market folded in.
func ObserveSpot(in Input) placement.FallbackState {
	pl := newReadOnlyPlanner(in)
	if pl == nil {
		return in.Fallback
	}
	fb, _ := pl.observeSpot(pl.liveNodes())
	return fb
}

// newReadOnlyPlanner is a planner over in's nodes for the read-only views
// above; nil for a fleet being removed.
func newReadOnlyPlanner(in Input) *planner {
	if in.Fleet == nil || in.Destroying {
		return nil
	}
	pl := &planner{in: in, p: in.Params.withDefaults(in.Fleet), name: in.Fleet.Name, marked: map[string]bool{}}
	pl.nodes = append([]state.Node(nil), in.Nodes...)
	sort.Slice(pl.nodes, func(i, j int) bool { return pl.nodes[i].ID < pl.nodes[j].ID })
	return pl
}
