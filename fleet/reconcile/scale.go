package reconcile

import (
	"fmt"
	"sort"
	"strconv"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

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

// scale brings the live count to the target: placement, fallback, launches,
// migration, spot swaps and scale-down.
func (pl *planner) scale() {
	f := pl.in.Fleet
	target := 0
	if f != nil && !pl.in.Destroying {
		target = min(max(f.TargetNodes(), 0), f.MaxNodes)
	}
	pl.plan.Target = target
	if target == 0 {
		// Destroy: everything goes, without cooldowns.
		for _, i := range pl.liveNodes() {
			pl.retire(i, "fleet destroyed")
		}
		pl.plan.Live = 0
		return
	}
	colocate := f.Placement.Colocate
	if colocate == "" {
		colocate = spec.ColocateZone
	}

	live := pl.liveNodes()
	var liveOffs []providers.Offering
	odLive, inflight, running := 0, 0, 0
	for _, i := range live {
		n := pl.nodes[i]
		liveOffs = append(liveOffs, n.Offering)
		if n.Offering.CapacityType == providers.OnDemand {
			odLive++
		}
		if inFlight(n.State) {
			inflight++
		}
		if n.State == state.NodeRunning {
			running++
		}
	}
	deficit := max(target-len(live), 0)

	exclude := map[string]bool{}
	for k := range pl.marked {
		exclude[k] = true
	}
	base := placement.ChooseInput{
		Fleet: f, Offerings: pl.in.Offerings, Records: pl.in.Records, Now: pl.now(),
		Model: pl.p.Model, Nodes: liveOffs, Need: deficit, Target: target,
		Exclude: exclude, AtBoundary: running == 0, MinImprovement: pl.p.MinImprovement,
	}
	spotIn := base
	spotIn.Capacity = placement.SpotOnly("spot probe")
	spotChoice := placement.Choose(spotIn)
	dec, fb := placement.DecideCapacity(placement.FallbackInput{
		Fleet: f, State: pl.in.Fallback, Now: pl.now(), Live: len(live), OnDemandLive: odLive,
		SpotViable: f.Node.Spot && spotChoice.CanHoldMin && len(spotChoice.Candidates) > 0, Progress: pl.in.Progress,
		Changeover: pl.p.Model.InterruptionCost, Policy: pl.p.Deadline,
	})
	pl.plan.Capacity, pl.plan.Fallback = dec, fb
	choice := spotChoice
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
	case surplus == 1 && swapping:
		// The surplus node is the spot node replacing an on-demand one (or
		// the target dropped by one: the on-demand node is the best victim
		// either way). Retire the on-demand node once nothing is in
		// flight, i.e. the spot node has joined.
		if inflight == 0 {
			if victim := pl.pickVictims(live, 1, colocate, choice.Group, true); len(victim) == 1 {
				pl.retire(victim[0], "replaced by spot capacity")
			}
		}
	case surplus > 0:
		pl.shrink(live, surplus, colocate, choice.Group)
	case deficit > 0:
		// Launches that restore min_nodes or replace nodes lost in this
		// pass never wait; growth beyond that waits for the cooldowns.
		exempt := max(f.MinNodes-len(live), pl.replaced, 0)
		n := deficit
		cool := pl.now().Sub(pl.in.LastScaleUp) < pl.p.ScaleUpCooldown || pl.now().Sub(pl.in.LastScaleDown) < pl.p.ScaleUpCooldown
		if cool {
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
				for _, i := range live {
					pl.retire(i, "job on on-demand moves to spot in "+mc.Group)
				}
				pl.launch(mc.Launch, target, "placement: on-demand job moves to spot: "+mc.Reason)
			}
		}
	}
	pl.plan.Live = len(pl.liveNodes())
}

// shrink retires surplus nodes. Nodes that are not running go at once
// (no round changes); draining running nodes restarts the round, so that
// part waits for the cooldowns.
func (pl *planner) shrink(live []int, surplus int, colocate spec.Colocate, group string) {
	victims := pl.pickVictims(live, surplus, colocate, group, false)
	cool := pl.now().Sub(pl.in.LastScaleUp) < pl.p.ScaleDownCooldown || pl.now().Sub(pl.in.LastScaleDown) < pl.p.ScaleDownCooldown
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

// pickVictims orders live nodes for removal: outside the job's group
// first, then not yet running, then most expensive, then newest; with
// onDemandOnly, only on-demand nodes qualify.
func (pl *planner) pickVictims(live []int, n int, colocate spec.Colocate, group string, onDemandOnly bool) []int {
	var cands []int
	for _, i := range live {
		if onDemandOnly && pl.nodes[i].Offering.CapacityType != providers.OnDemand {
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
		node := state.Node{
			ID: id, Fleet: pl.name, State: state.NodeRequested, Reason: reason,
			Offering: o, CreatedAt: pl.now(), UpdatedAt: pl.now(),
		}
		pl.nodes = append(pl.nodes, node)
		pl.byID[id] = len(pl.nodes) - 1
		pl.done[id] = true
		pl.add(Launch{Node: node, Offering: o, Reason: reason})
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
