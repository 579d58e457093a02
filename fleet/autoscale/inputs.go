package autoscale

import (
	"sort"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// live reports whether a node in state s counts toward the fleet's size
// (as reconcile.Live).
func live(s state.NodeState) bool {
	switch s {
	case state.NodeRequested, state.NodeProvisioning, state.NodeBooting, state.NodeJoined, state.NodeRunning:
		return true
	}
	return false
}

// NodePrices is what the fleet pays per hour for its first, second, …
// node: the live nodes, cheapest first (scale-down retires the dearest),
// then the offering placement would add (the cheapest available one of
// the fleet's group and capacity type, from the last pass's group and
// capacity decision), up to max_nodes.
func NodePrices(fl *spec.Fleet, nodes []state.Node, offs []providers.Offering, recs map[string]state.OfferingRecord, group string, capacity placement.Decision, now time.Time) []float64 {
	var out []float64
	for _, n := range nodes {
		if live(n.State) {
			out = append(out, n.Offering.PricePerHour)
		}
	}
	sort.Float64s(out)
	next := 0.0
	colocate := fl.Placement.Colocate
	if colocate == "" {
		colocate = spec.ColocateZone
	}
	spot := fl.Node.Spot && (capacity.Spot || capacity.Reason == "")
	for _, pass := range []bool{true, false} { // in the fleet's group first, then anywhere
		for _, o := range placement.Filter(fl, offs) {
			if !placement.Available(recs[o.Key()], now) || o.PricePerHour <= 0 || o.Available == 0 {
				continue
			}
			if spot != (o.CapacityType == providers.Spot) && !(spot && o.CapacityType == providers.OnDemand && capacity.OnDemand) {
				continue
			}
			if pass && group != "" && placement.GroupKey(o, colocate) != group {
				continue
			}
			if next == 0 || o.PricePerHour < next {
				next = o.PricePerHour
			}
		}
		if next > 0 {
			break
		}
	}
	if next == 0 && len(out) > 0 {
		next = out[len(out)-1]
	}
	if next == 0 {
		return out // prices unknown: Decide counts nodes
	}
	for len(out) < fl.MaxNodes {
		out = append(out, next)
	}
	return out
}

// InterruptionRate is the expected interruptions per node-hour of the
// fleet's live nodes (the placement model's learned rates), or of the
// cheapest offering when none is live.
func InterruptionRate(m placement.Model, nodes []state.Node, recs map[string]state.OfferingRecord) float64 {
	var sum float64
	n := 0
	for _, nd := range nodes {
		if live(nd.State) {
			sum += m.Rate(nd.Offering, recs[nd.Offering.Key()])
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}
