package agentapi

import (
	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/fleet/state"
)

// networkConfig tells a node's agent the fast network its launch asked
// for (state.Node.Network), so it sets the NCCL/libfabric environment;
// nil for a standard launch.
func networkConfig(n state.Node) *agentwire.NetworkConfig {
	if !n.Network.Fabric || !n.Offering.Network.Fast() {
		return nil
	}
	return &agentwire.NetworkConfig{Fabric: n.Offering.Network.Fabric, Interfaces: n.Offering.Network.Interfaces,
		Group: n.Network.GroupIn(n.Offering.Zone)}
}
