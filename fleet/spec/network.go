package spec

import (
	"fmt"

	"github.com/hashicorp/hcl/v2"
)

// Network is node.network: how much of the clouds' fast node-to-node
// path (AWS EFA + cluster placement groups, GCP compact placement + GPU
// NICs) a fleet uses. docs/placement.md, "Networking".
type Network string

const (
	// NetworkStandard launches every node with its one default interface
	// and no placement group: the default, because the fast path on AWS
	// takes the nodes' public IPv4 away (several interfaces cannot
	// auto-assign one), which a fleet whose nodes reach the daemon over
	// the internet would not survive.
	NetworkStandard Network = "standard"
	// NetworkAuto uses the fast path on every offering that has one and a
	// placement group while its spot capacity lasts: after a few capacity
	// failures in the group it launches without one, and says so.
	NetworkAuto Network = "auto"
	// NetworkFast requires the fast path: offerings without it are
	// excluded, the group is kept through capacity failures (placement
	// moves the job instead), and the fleet must colocate by zone.
	NetworkFast Network = "fast"
)

var networks = []string{string(NetworkStandard), string(NetworkAuto), string(NetworkFast)}

// NetworkMode is node.network with its default applied.
func (n Node) NetworkMode() Network {
	if n.Network == "" {
		return NetworkStandard
	}
	return n.Network
}

// decodeNetwork reads node.network.
func (p *parser) decodeNetwork(a hcl.Attributes, n *Node) {
	var s string
	if p.enumAttr(a["network"], networks, &s) {
		n.Network = Network(s)
	}
}

// checkNetwork is the cross-block rule of node.network: a fleet that
// requires the fast path keeps its gang in one zone (one placement group),
// because the fabric does not reach across zones.
func (p *parser) checkNetwork(nodeA, placementA hcl.Attributes, fl *Fleet) {
	if nodeA == nil || fl.Node.Network != NetworkFast || fl.Placement.Colocate == ColocateZone {
		return
	}
	subject := nodeA["network"]
	if ca := placementA["colocate"]; ca != nil {
		subject = ca
	}
	p.attrError(subject, "Fast network needs zone colocation",
		fmt.Sprintf(`node.network = "fast" keeps a job's nodes in one placement group, which lives in one zone; placement.colocate is %q. Set colocate = "zone", or network = "auto" to use the fast path only where the nodes happen to share a zone.`, fl.Placement.Colocate))
}
