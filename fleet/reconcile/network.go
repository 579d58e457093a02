package reconcile

import (
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/providers"
)

// network is how a launch on o uses the fast network (node.network): the
// fabric when o has one, and the incarnation's placement group unless
// "auto" has given up on it after capacity failures.
func (pl *planner) network(o providers.Offering) placement.NetworkPlan {
	if pl.in.Fleet == nil {
		return placement.NetworkPlan{}
	}
	id := pl.in.Identity()
	tags := map[string]string{providers.TagFleet: id.Fleet}
	if id.DaemonID != "" {
		tags[providers.TagDaemonID] = id.DaemonID
	}
	if id.Incarnation != "" {
		tags[providers.TagIncarnation] = id.Incarnation
	}
	return placement.NetworkFor(pl.in.Fleet, o, pl.in.Records[o.Key()], placement.GroupName(id.Fleet, id.Incarnation), tags)
}
