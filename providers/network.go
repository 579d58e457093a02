package providers

import (
	"context"
	"fmt"
)

// NetworkInfo is what an offering's nodes get between each other: the
// fast fabric the type supports, if any, and its bandwidth. Placement
// excludes offerings without a fabric when a fleet requires one
// (node.network = "fast") and feeds the bandwidth to the goodput model.
type NetworkInfo struct {
	// Fabric names the node-to-node fast path: FabricEFA on AWS,
	// FabricTCPX/FabricTCPXO/FabricRDMA on GCP a3 types; "" when the type
	// has only its default interface.
	Fabric string `json:"fabric,omitempty"`
	// Interfaces is how many fabric interfaces (EFA devices, GPU NICs) a
	// node is launched with on the fast path.
	Interfaces int `json:"interfaces,omitempty"`
	// BandwidthGbps is the node's total network bandwidth on the fast
	// path (all its cards); 0 when unknown.
	BandwidthGbps float64 `json:"bandwidth_gbps,omitempty"`
}

// Fabric names (NetworkInfo.Fabric). The agent picks the NCCL/libfabric
// environment by them, so they are part of the wire contract.
const (
	FabricEFA   = "efa"             // AWS Elastic Fabric Adapter (libfabric + aws-ofi-nccl)
	FabricTCPX  = "gpudirect-tcpx"  // GCP a3-highgpu: 4 GPU NICs, NCCL TCPX plugin
	FabricTCPXO = "gpudirect-tcpxo" // GCP a3-megagpu: 8 GPU NICs, NCCL TCPXO (FasTrak) plugin
	FabricRDMA  = "rdma"            // GCP a3-ultragpu: 8 RDMA NICs (MRDMA), NCCL gIB plugin
)

// Fast reports whether the offering has a fast node-to-node path.
func (n NetworkInfo) Fast() bool { return n.Fabric != "" }

// String is "efa ×32, 3200 Gbps", or "standard".
func (n NetworkInfo) String() string {
	if !n.Fast() {
		return "standard"
	}
	s := fmt.Sprintf("%s ×%d", n.Fabric, n.Interfaces)
	if n.BandwidthGbps > 0 {
		s += fmt.Sprintf(", %g Gbps", n.BandwidthGbps)
	}
	return s
}

// NetworkRequest asks a launch for the fast path. The zero value is the
// standard launch: one default interface, no placement group or policy.
type NetworkRequest struct {
	// Fabric: attach the offering's fabric interfaces (Offering.Network).
	Fabric bool `json:"fabric,omitempty"`
	// Group is the base name of the placement group (AWS: a cluster
	// placement group) or resource policy (GCE: a compact placement
	// policy) the node joins, one per zone named GroupIn(zone), created
	// when absent and reused by every later launch of the fleet
	// incarnation; "" joins none. GroupTags tag the group so
	// ReleaseNetwork and people can tell whose it is.
	Group     string            `json:"group,omitempty"`
	GroupTags map[string]string `json:"group_tags,omitempty"`
}

// GroupIn is the name of the request's group in zone: a cluster group or
// compact policy packs its nodes in one zone, so each zone has its own.
func (r NetworkRequest) GroupIn(zone string) string {
	if r.Group == "" {
		return ""
	}
	return r.Group + "-" + zone
}

// NetworkReleaser is implemented by providers that create per-fleet
// network resources (placement groups, resource policies) for
// NetworkRequest.Group: the daemon calls it when a destroyed fleet has no
// instance left. Deleting what does not exist is not an error.
type NetworkReleaser interface {
	ReleaseNetwork(ctx context.Context, cfg Config, group string) error
}
