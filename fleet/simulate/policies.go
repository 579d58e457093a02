package simulate

import (
	"fmt"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
)

// Greedy is Can't Be Late's greedy baseline as a deadline policy: spot
// whenever a spot placement exists, wait otherwise; the safety net (time
// left < work left + 2 changeovers) switches to on-demand until the end.
type Greedy struct{}

// Decide implements placement.DeadlinePolicy.
func (Greedy) Decide(in placement.DeadlineInput) placement.DeadlineDecision {
	left := in.Work - in.Done
	if left <= 0 {
		return placement.DeadlineDecision{Reason: "work done"}
	}
	if r := in.Deadline.Sub(in.Now); r < left+2*in.Changeover {
		return placement.DeadlineDecision{UseOnDemand: true, OnDemandOnly: true,
			Reason: fmt.Sprintf("safety net: %s to deadline < %s work left + 2×%s changeover", r.Round(time.Second), left.Round(time.Second), in.Changeover)}
	}
	return placement.DeadlineDecision{Reason: "greedy: spot or wait"}
}

// DefaultPolicies are the policies `fleetd sim` runs by default.
func DefaultPolicies() []Policy {
	return []Policy{
		{Name: "optimum", Optimum: true, Description: "omniscient lower bound: the higher of the fluid bound (any fleet and job shape) and, for one-node jobs, the DP over the trace with the same changeover model"},
		{Name: "fleetd", Deadline: placement.DefaultDeadlinePolicy(), Description: "fleetd's deadline policy and zone choice, every zone of the set"},
		{Name: "up", Deadline: placement.UniformProgress{}, PriceOnly: true, Description: "Uniform Progress (Can't Be Late) through fleetd's reconciler, cheapest zone with spot, every zone"},
		{Name: "greedy", Deadline: Greedy{}, PriceOnly: true, Description: "greedy spot + safety net through fleetd's reconciler, cheapest zone with spot, every zone"},
		{Name: "up-1z", Deadline: placement.UniformProgress{}, OneZone: true, PriceOnly: true, Description: "Uniform Progress in one zone (drawn per window)"},
		{Name: "greedy-1z", Deadline: Greedy{}, OneZone: true, PriceOnly: true, Description: "greedy spot + safety net in one zone (drawn per window)"},
		{Name: "on-demand", OnDemand: true, Description: "on-demand only"},
	}
}

// GangDPPolicy is the DP of optimum.go for an all-or-nothing gang of
// max_nodes in one zone at full rate: the optimum's old figure. With
// max_nodes > 1 it is not a lower bound (elastic runs on fewer nodes and
// sub-linear jobs beat it); it is kept to show by how much.
func GangDPPolicy() Policy {
	return Policy{Name: "gang-dp", GangDP: true,
		Description: "DP over the trace for a rigid gang of max_nodes in one zone at full rate (not a lower bound when max_nodes > 1)"}
}

// ForesightPolicy is fleetd's policy told, at every decision, how much
// longer each spot zone's capacity will stay up, from the trace itself.
// No daemon can know that: the policy measures how much of fleetd's gap
// to the optimum better interruption prediction could close at most
// (docs/sim.md, "Foresight"). The rest is hindsight about when capacity
// comes back, which only the optimum has.
func ForesightPolicy() Policy {
	return Policy{Name: "fleetd-foresight", Deadline: placement.DefaultDeadlinePolicy(), Foresight: true,
		Description: "fleetd told every spot zone's true remaining up-run from the trace (not realizable: bounds what better interruption prediction could gain)"}
}

// LookaheadPolicy is the lookahead planner (lookahead.go) that knows the
// trace exactly for the next h: the optimum's DP, re-solved as it goes.
// It measures how much foresight the optimum's lead needs; h = 0 knows
// only the present.
func LookaheadPolicy(name string, h time.Duration) Policy {
	return Policy{Name: name, Planner: true, Lookahead: h,
		Description: fmt.Sprintf("the optimum's DP knowing the trace %s ahead (not realizable: measures the foresight the optimum needs)", h)}
}

// lookaheadReplan is how often the lookahead planner plans again: an
// eighth of its lookahead (at least every tick), so that every decision
// sees at least 7/8 of it ahead.
func lookaheadReplan(h time.Duration) time.Duration { return h / 8 }

// SelectPolicies picks policies by name from DefaultPolicies, the goodput
// policy (GoodputPolicy), the foresight bound (ForesightPolicy) and the
// rigid-gang DP (GangDPPolicy), in the
// order given.
func SelectPolicies(names []string) ([]Policy, error) {
	all := append(DefaultPolicies(), GoodputPolicy(), ForesightPolicy(), GangDPPolicy())
	var out []Policy
	for _, n := range names {
		n = strings.TrimSpace(n)
		if d, ok := strings.CutPrefix(n, "lookahead-"); ok {
			h, err := time.ParseDuration(d)
			if err != nil || h < 0 {
				return nil, fmt.Errorf("policy %q: lookahead-<duration>, e.g. lookahead-2h", n)
			}
			out = append(out, LookaheadPolicy(n, h))
			continue
		}
		found := false
		for _, p := range all {
			if p.Name == n {
				out = append(out, p)
				found = true
			}
		}
		if !found {
			var known []string
			for _, p := range all {
				known = append(known, p.Name)
			}
			known = append(known, "lookahead-<duration>")
			return nil, fmt.Errorf("unknown policy %q (known: %s)", n, strings.Join(known, ", "))
		}
	}
	return out, nil
}
