package placement

import (
	"fmt"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// GroupFallbackAfter is how many consecutive capacity failures of an
// offering launched in its placement group make node.network = "auto"
// launch it without one: a cluster group's spot capacity is scarcer than
// the zone's (the nodes must fit in one network spine), and a job that
// waits for it trains on nothing. "fast" keeps the group and lets the
// unavailable cache move the job instead.
const GroupFallbackAfter = 3

// networkExclusion says why o cannot serve node n's network, or "".
func networkExclusion(n spec.Node, o providers.Offering) string {
	if n.NetworkMode() != spec.NetworkFast || o.Network.Fast() {
		return ""
	}
	return fmt.Sprintf(`no fast network (EFA, GPUDirect) on %s, node.network is "fast"`, o.InstanceType)
}

// GroupName is the base name of the placement groups (AWS) and resource
// policies (GCE) of one fleet incarnation; providers add the zone or
// region. It carries the incarnation so a re-created fleet never joins
// (or deletes) its predecessor's group, and is a valid GCE resource name
// (fleet names are lowercase, ≤ 40 characters; incarnations short ids).
func GroupName(fleet, incarnation string) string {
	if incarnation == "" {
		return "fleetd-" + fleet
	}
	return "fleetd-" + fleet + "-" + incarnation
}

// NetworkPlan is how one launch uses the fast network.
type NetworkPlan struct {
	Request providers.NetworkRequest
	// Fallback is set when node.network = "auto" launches without the
	// placement group after capacity failures in it: the event says so.
	Fallback string
}

// NetworkFor decides the network of a launch on offering o for fleet fl,
// whose incarnation's group is named group and tagged with tags; rec is
// o's record (its capacity-failure streak drives "auto"'s fallback).
func NetworkFor(fl *spec.Fleet, o providers.Offering, rec state.OfferingRecord, group string, tags map[string]string) NetworkPlan {
	mode := fl.Node.NetworkMode()
	if mode == spec.NetworkStandard || !o.Network.Fast() {
		return NetworkPlan{}
	}
	req := providers.NetworkRequest{Fabric: true, Group: group, GroupTags: tags}
	if mode == spec.NetworkAuto {
		if u, ok := ParseUnavailable(rec); ok && HasFailure(rec) && u.Kind == UnavailableCapacity && u.Streak >= GroupFallbackAfter {
			req.Group, req.GroupTags = "", nil
			return NetworkPlan{Request: req, Fallback: fmt.Sprintf(
				`node.network = "auto": %d capacity failures of %s in placement group %s; launching without a group (fabric kept) until a launch succeeds`,
				u.Streak, o.Key(), group)}
		}
	}
	return NetworkPlan{Request: req}
}
