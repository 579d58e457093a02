package placement

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// DefaultMinImprovement is how much cheaper (per useful GPU-hour) another
// group must be before a job that could stay moves there for price.
const DefaultMinImprovement = 0.15

// GroupKey is the colocation group of o: its zone, its region, or the one
// group "*" when the fleet does not colocate.
func GroupKey(o providers.Offering, c spec.Colocate) string {
	switch c {
	case spec.ColocateNone:
		return "*"
	case spec.ColocateRegion:
		return o.Provider + "/" + o.Region
	default:
		return o.Provider + "/" + o.Region + "/" + o.Zone
	}
}

// ChooseInput is what Choose needs.
type ChooseInput struct {
	Fleet     *spec.Fleet
	Offerings []providers.Offering // the market; filtered here
	Records   map[string]state.OfferingRecord
	Now       time.Time
	Model     Model
	// Nodes are the offerings of the job's live nodes, one per node.
	Nodes []providers.Offering
	// Need is how many nodes to launch now.
	Need int
	// Target is the total node count wanted; 0 means len(Nodes)+Need.
	Target int
	// Capacity says which capacity types may be launched.
	Capacity Decision
	// Exclude holds offering keys not to launch on, e.g. offerings under
	// an interruption notice in this very pass.
	Exclude map[string]bool
	// AtBoundary: the job is not training (no closed round), so moving it
	// loses nothing but boot time.
	AtBoundary bool
	// OnFallback: the job runs on on-demand fallback nodes and would
	// rather move to spot, even mid-round.
	OnFallback bool
	// MinImprovement is the price-migration threshold; 0 means
	// DefaultMinImprovement.
	MinImprovement float64
	// Outlook rates spot offerings by their observed up-runs and the
	// job's slack (EvaluateIn); its Now is Now.
	Outlook Outlook
	// Move prices restoring the job's checkpoint in a group it is not in
	// (egress and restore time, move.go); nil: moves are free.
	Move *MoveCost
}

// Choice is where to launch.
type Choice struct {
	// Group is the chosen colocation group, "" when none can hold min_nodes.
	Group string `json:"group"`
	// Current is the group the job's nodes are in now, "" for a new job.
	Current string `json:"current"`
	// Migrate: the whole job moves from Current to Group; the caller
	// retires the nodes outside Group.
	Migrate bool `json:"migrate"`
	// Launch is one offering per node to launch, in order. When migrating
	// it fills the whole target in Group, otherwise at most Need.
	Launch []providers.Offering `json:"launch"`
	// Candidates are Group's usable offerings, best first.
	Candidates []Candidate `json:"candidates"`
	// CanHoldMin: Group can hold min_nodes (unknown availability counts
	// as "maybe").
	CanHoldMin bool `json:"can_hold_min"`
	// Cost is the mean weighted score per node of the job in Group.
	Cost   float64 `json:"cost"`
	Reason string  `json:"reason"`
	// Move is what restoring the checkpoint in Group costs, when the job
	// starts or moves there and a checkpoint size is known.
	Move *MoveEstimate `json:"move,omitempty"`
}

// unknownCap stands in for "availability unknown": large, so it reads as
// "maybe enough", but far from overflowing when summed.
const unknownCap = 1 << 20

type group struct {
	key      string
	spot, od []Candidate
}

// held is what a group's existing nodes add to its evaluation: their
// count and the sum of their Weighted, added in node order (the same sum,
// bit for bit, as over a list of their candidates).
type held struct {
	n   int
	sum float64
}

func (h *held) add(c Candidate) { h.n++; h.sum += c.Weighted }

type groupEval struct {
	key         string
	existing    int
	capacity    int
	holdsMin    bool
	holdsTarget bool
	assign      []Candidate
	cost        float64
	cands       []Candidate
	// move is the checkpoint's move cost into the group per GPU-hour (0
	// for the job's current group), est its breakdown.
	move float64
	est  *MoveEstimate
}

// Choose picks the colocation group and the offerings to launch on.
//
// A job stays in its current group while that group can hold min_nodes;
// it moves for price only when another group is at least MinImprovement
// cheaper, the job needs launches anyway, it is at a rendezvous boundary
// (or on on-demand fallback), and the other group has no recent failure.
// When the current group cannot hold min_nodes the whole job moves to the
// best group that can. A group that cannot hold min_nodes is never
// launched into.
func Choose(in ChooseInput) Choice {
	m := in.Model.withDefaults()
	in.Outlook.Now = in.Now
	strategy := strategyOf(in.Fleet)
	colocate := colocateOf(in.Fleet)
	minNodes := 0
	if in.Fleet != nil {
		minNodes = in.Fleet.MinNodes
	}
	target := in.Target
	if target <= 0 {
		target = len(in.Nodes) + in.Need
	}

	all := candidates(in, m, strategy, false)
	clean := candidates(in, m, strategy, true)

	data := DataCostFor(in.Fleet).WithClouds(in.Move)
	existing := map[string]*held{}
	// Nodes share a few offerings: each is evaluated once (a 10,000-node
	// fleet would otherwise look every node up in the market), and a group
	// keeps only its count and cost sum, not a candidate per node.
	type evaluated struct {
		group string
		c     Candidate
	}
	memo := map[providers.Offering]evaluated{}
	var prev providers.Offering
	var e evaluated
	for i, o := range in.Nodes {
		if i == 0 || o != prev { // nodes come in runs of one offering
			var ok bool
			if e, ok = memo[o]; !ok {
				e = evaluated{GroupKey(o, colocate), data.apply(m.EvaluateIn(marketView(in.Offerings, o), in.Records[o.Key()], strategy, in.Outlook))}
				memo[o] = e
			}
			prev = o
		}
		h := existing[e.group]
		if h == nil {
			h = &held{}
			existing[e.group] = h
		}
		h.add(e.c)
	}
	current := ""
	for k, ns := range existing {
		if current == "" || ns.n > existing[current].n || (ns.n == existing[current].n && k < current) {
			current = k
		}
	}

	evalAll := func(groups map[string]*group) map[string]groupEval {
		out := map[string]groupEval{}
		keys := map[string]bool{}
		for k := range groups {
			keys[k] = true
		}
		for k := range existing {
			keys[k] = true
		}
		for k := range keys {
			g := groups[k]
			if g == nil {
				g = &group{key: k}
			}
			e := evaluate(g, existing[k], minNodes, target, in.Capacity, strategy)
			if k != current && len(e.assign) > 0 {
				// Every node restores the checkpoint: those launched here.
				src := in.Move.sourceFor(in.Nodes)
				offs := make([]providers.Offering, len(e.assign))
				for i, a := range e.assign {
					offs[i] = a.Offering
				}
				if est, ok := in.Move.Estimate(src, offs); ok {
					e.move, e.est = est.PerGPUHour, &est
				}
			}
			out[k] = e
		}
		return out
	}
	evals := evalAll(all)

	ch := Choice{Current: current}
	take := func(e groupEval, n int, migrate bool, reason string) Choice {
		c := Choice{Group: e.key, Current: current, Migrate: migrate, CanHoldMin: e.holdsMin, Cost: e.cost, Candidates: e.cands, Reason: reason, Move: e.est}
		if n > len(e.assign) {
			n = len(e.assign)
		}
		for _, a := range e.assign[:max(n, 0)] {
			c.Launch = append(c.Launch, a.Offering)
		}
		return c
	}

	best, ok := bestGroup(evals, current, strategy)
	if current == "" {
		if !ok {
			ch.Reason = "no group can hold min_nodes"
			if why := ExclusionSummary(in.Fleet, in.Offerings); why != "" && len(Filter(in.Fleet, in.Offerings)) == 0 {
				ch.Reason = "no offering fits the fleet: " + why
			}
			return ch
		}
		return take(best, in.Need, false, fmt.Sprintf("best group %s", best.key))
	}
	cur := evals[current]
	if !cur.holdsMin {
		if !ok {
			return take(cur, 0, false, fmt.Sprintf("no group can hold min_nodes (current %s cannot)", current))
		}
		return take(best, len(best.assign), true, fmt.Sprintf("current group %s cannot hold min_nodes; moving to %s", current, best.key))
	}
	if in.Need > 0 && (in.AtBoundary || in.OnFallback) {
		imp := in.MinImprovement
		if imp <= 0 {
			imp = DefaultMinImprovement
		}
		if alt, ok := bestGroup(evalAll(clean), current, strategy); ok && (alt.holdsTarget || !cur.holdsTarget) && alt.cost+alt.move <= cur.cost*(1-imp) {
			reason := fmt.Sprintf("group %s is %.0f%% cheaper than %s", alt.key, 100*(1-alt.cost/cur.cost), current)
			if alt.est != nil {
				reason += fmt.Sprintf(" after the move (%s)", alt.est)
			}
			return take(alt, len(alt.assign), true, reason)
		}
	}
	return take(cur, in.Need, false, fmt.Sprintf("staying in %s", current))
}

// bestGroup returns the best group other than skip that can hold min_nodes:
// groups that can hold the whole target first, then (capacity strategy)
// more capacity, then lower cost, then key.
func bestGroup(evals map[string]groupEval, skip string, s spec.Strategy) (groupEval, bool) {
	var list []groupEval
	for k, e := range evals {
		if k != skip && e.holdsMin && len(e.assign) > 0 {
			list = append(list, e)
		}
	}
	if len(list) == 0 {
		return groupEval{}, false
	}
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i], list[j]
		if a.holdsTarget != b.holdsTarget {
			return a.holdsTarget
		}
		if s == spec.StrategyCapacity && a.capacity != b.capacity {
			return a.capacity > b.capacity
		}
		if !almostEqual(a.cost+a.move, b.cost+b.move) {
			return a.cost+a.move < b.cost+b.move
		}
		return a.key < b.key
	})
	return list[0], true
}

func evaluate(g *group, existing *held, minNodes, target int, dec Decision, s spec.Strategy) groupEval {
	if existing == nil {
		existing = &held{}
	}
	e := groupEval{key: g.key, existing: existing.n}
	var ordered []Candidate
	if dec.Spot {
		ordered = append(ordered, g.spot...)
	}
	odLimit := 0
	if dec.OnDemand {
		odLimit = dec.OnDemandLimit
		if odLimit < 0 {
			odLimit = unknownCap
		}
		if odLimit > 0 {
			ordered = append(ordered, g.od...)
		}
	}
	e.cands = ordered

	spotCap, odCap := 0, 0
	for _, c := range ordered {
		a := c.Offering.Available
		if a < 0 {
			a = unknownCap
		}
		if c.Offering.CapacityType == providers.OnDemand {
			odCap += a
		} else {
			spotCap += a
		}
	}
	e.capacity = spotCap + min(odCap, odLimit)
	e.holdsMin = e.existing+e.capacity >= minNodes

	want := target - e.existing
	odUsed := 0
	for _, c := range ordered {
		if len(e.assign) >= want {
			break
		}
		n := want - len(e.assign)
		if a := c.Offering.Available; a >= 0 && a < n {
			n = a
		}
		if c.Offering.CapacityType == providers.OnDemand {
			n = min(n, odLimit-odUsed)
			odUsed += n
		}
		for range n {
			e.assign = append(e.assign, c)
		}
	}
	e.holdsTarget = e.existing+len(e.assign) >= target

	sum, n := existing.sum, existing.n
	for _, c := range e.assign {
		sum += c.Weighted
		n++
	}
	e.cost = math.Inf(1)
	if n > 0 {
		e.cost = sum / float64(n)
	}
	return e
}

// candidates groups the usable offerings: passing the spec, not excluded,
// available per the cache, with capacity left, and (clean) without a
// failure on file.
func candidates(in ChooseInput, m Model, s spec.Strategy, clean bool) map[string]*group {
	groups := map[string]*group{}
	data := DataCostFor(in.Fleet).WithClouds(in.Move)
	for _, o := range Filter(in.Fleet, in.Offerings) {
		if in.Exclude[o.Key()] || o.Available == 0 {
			continue
		}
		rec := in.Records[o.Key()]
		if !Available(rec, in.Now) {
			continue
		}
		if clean && HasFailure(rec) {
			continue
		}
		k := GroupKey(o, colocateOf(in.Fleet))
		g := groups[k]
		if g == nil {
			g = &group{key: k}
			groups[k] = g
		}
		c := data.apply(m.EvaluateIn(o, rec, s, in.Outlook))
		if o.CapacityType == providers.OnDemand {
			g.od = append(g.od, c)
		} else {
			g.spot = append(g.spot, c)
		}
	}
	for _, g := range groups {
		sortCandidates(g.spot, s)
		sortCandidates(g.od, s)
	}
	return groups
}

func sortCandidates(cs []Candidate, s spec.Strategy) {
	sort.SliceStable(cs, func(i, j int) bool { return less(cs[i], cs[j], s) })
}

// marketView returns the market's current entry for o (fresh price and
// availability) or o itself when the market no longer lists it.
func marketView(market []providers.Offering, o providers.Offering) providers.Offering {
	k := o.Key()
	for _, m := range market {
		if m.Key() == k {
			return m
		}
	}
	return o
}

func strategyOf(f *spec.Fleet) spec.Strategy {
	if f == nil || f.Placement.Strategy == "" {
		return spec.StrategyPriceCapacity
	}
	return f.Placement.Strategy
}

func colocateOf(f *spec.Fleet) spec.Colocate {
	if f == nil || f.Placement.Colocate == "" {
		return spec.ColocateZone
	}
	return f.Placement.Colocate
}
