package reconcile

import (
	"fmt"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// StartLaunch returns n as it must be persisted just before Create is
// called: provisioning. A crash after this point leaves a provisioning
// node, which the next pass adopts (instance found) or relaunches with
// the same token.
func StartLaunch(n state.Node, now time.Time) state.Node {
	n.State = state.NodeProvisioning
	n.Reason = "launch requested from " + n.Offering.Key()
	n.UpdatedAt = now
	return n
}

// LaunchResult is what the daemon persists after a Create call.
type LaunchResult struct {
	// Node is the updated record.
	Node state.Node
	// Mark, when set, goes into the unavailable-offerings cache.
	Mark *MarkUnavailable
	// Succeeded: apply placement.RecordLaunch to the offering's record.
	Succeeded bool
}

// AfterLaunch classifies the outcome of Create for node n. Capacity, quota
// and configuration errors fail the node (a fresh node id will be placed
// elsewhere: a token cannot be reused with another offering) and back the
// offering off; transient and unclassified errors leave the node
// provisioning, so it is retried with the same token after RelaunchAfter
// (bounded by BootTimeout).
func AfterLaunch(n state.Node, created []providers.Instance, err error, now time.Time) LaunchResult {
	n.UpdatedAt = now
	key := n.Offering.Key()
	if err == nil {
		if len(created) == 0 {
			n.State = state.NodeProvisioning
			n.Reason = "launch returned no instance; will retry with the same token"
			return LaunchResult{Node: n}
		}
		n.State = state.NodeBooting
		n.InstanceID = created[0].ID
		n.Address = created[0].Address
		n.Reason = "instance " + created[0].ID + " launched"
		return LaunchResult{Node: n, Succeeded: true}
	}
	if isForeignLaunch(err) {
		// Not the offering's fault: no back-off. The node's id (and so its
		// token) is never reused, so its replacement launches afresh.
		n.State = state.NodeFailed
		n.Reason = err.Error()
		return LaunchResult{Node: n}
	}
	var kind placement.UnavailableKind
	switch providers.KindOf(err) {
	case providers.KindCapacity:
		kind = placement.UnavailableCapacity
	case providers.KindQuota:
		kind = placement.UnavailableQuota
	case providers.KindInvalidConfig:
		kind = placement.UnavailableLaunchError
	default:
		n.State = state.NodeProvisioning
		n.Reason = fmt.Sprintf("launch error, will retry with the same token: %v", err)
		return LaunchResult{Node: n}
	}
	n.State = state.NodeFailed
	n.Reason = fmt.Sprintf("launch failed: %v", err)
	return LaunchResult{Node: n, Mark: &MarkUnavailable{Key: key, Kind: kind, Reason: err.Error()}}
}
