package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fleetd/fleetd/agentwire"
)

// EnvNetwork tells workers which network path the node got ("efa ×32,
// placement group fleetd-bert-k3x9-us-east-1a"); unset on the standard
// network.
const EnvNetwork = "FLEETD_NETWORK"

// netPath is the fast network a node was launched on, as the agent found
// it on the machine.
type netPath struct {
	Fabric     string
	Interfaces int // launched with
	// Devices is how many fabric devices the agent found (EFA: RDMA
	// devices under /sys/class/infiniband; GPU NICs: eth1…ethN under
	// /sys/class/net).
	Devices int
	Group   string
}

// Fabric names (providers.Fabric*; the agent does not import providers).
const (
	fabricEFA   = "efa"
	fabricTCPX  = "gpudirect-tcpx"
	fabricTCPXO = "gpudirect-tcpxo"
	fabricRDMA  = "rdma"
)

// detectNetwork checks the configured path against the machine under root
// ("" on a VM): a fabric whose devices are missing (an image without the
// EFA driver, NICs not attached) leaves NCCL on plain TCP, and the status
// says so instead of the job silently training at a fraction of its speed.
func detectNetwork(root string, nc *agentwire.NetworkConfig) netPath {
	if nc == nil || nc.Fabric == "" {
		return netPath{}
	}
	n := netPath{Fabric: nc.Fabric, Interfaces: nc.Interfaces, Group: nc.Group}
	switch nc.Fabric {
	case fabricEFA, fabricRDMA:
		ents, _ := os.ReadDir(filepath.Join(root, "/sys/class/infiniband"))
		n.Devices = len(ents)
	default:
		for i := 1; i <= nc.Interfaces; i++ {
			if _, err := os.Stat(filepath.Join(root, "/sys/class/net", "eth"+strconv.Itoa(i))); err == nil {
				n.Devices++
			}
		}
	}
	return n
}

// active: the fabric is there to use.
func (n netPath) active() bool { return n.Fabric != "" && n.Devices > 0 }

// String is the human form: "efa ×32, placement group fleetd-…", or
// "tcp: efa expected, no device found"; "" on the standard network.
func (n netPath) String() string {
	switch {
	case n.Fabric == "":
		return ""
	case !n.active():
		return fmt.Sprintf("tcp: %s expected (%d interfaces), no device found", n.Fabric, n.Interfaces)
	}
	s := fmt.Sprintf("%s ×%d", n.Fabric, n.Devices)
	if n.Group != "" {
		s += ", placement group " + n.Group
	}
	return s
}

// short is the heartbeat's form (the rendezvous keeps 64 bytes of a
// node's worker state): "efa×32+pg", "tcp!efa".
func (n netPath) short() string {
	switch {
	case n.Fabric == "":
		return ""
	case !n.active():
		return "tcp!" + n.Fabric
	}
	s := n.Fabric + "×" + strconv.Itoa(n.Devices)
	if n.Group != "" {
		s += "+pg"
	}
	return s
}

// ethList is "eth1,eth2,…,ethN".
func ethList(n int) string {
	names := make([]string, 0, n)
	for i := 1; i <= n; i++ {
		names = append(names, "eth"+strconv.Itoa(i))
	}
	return strings.Join(names, ",")
}

// networkDefaults is the NCCL/libfabric environment of a fast path. The
// worker's environment (the agent's own, then the spec's env) wins over
// every one of them: docs/agent.md lists them.
func networkDefaults(n netPath) map[string]string {
	if !n.active() {
		return nil
	}
	switch n.Fabric {
	case fabricEFA:
		// aws-ofi-nccl over libfabric's EFA provider; GPUDirect RDMA on
		// the types that have it (p4d, p5); fork safety for data loaders.
		return map[string]string{
			"FI_PROVIDER":            "efa",
			"FI_EFA_USE_DEVICE_RDMA": "1",
			"FI_EFA_FORK_SAFE":       "1",
			"NCCL_CROSS_NIC":         "1",
		}
	case fabricTCPX:
		// a3-highgpu: eth0 carries control traffic, eth1–eth4 the GPU
		// data; the image runs the RxDM receive-path daemon.
		return map[string]string{
			"NCCL_SOCKET_IFNAME":                    "eth0",
			"NCCL_GPUDIRECTTCPX_CTRL_DEV":           "eth0",
			"NCCL_GPUDIRECTTCPX_SOCKET_IFNAME":      ethList(n.Devices),
			"NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX": "/run/tcpx",
			"NCCL_CROSS_NIC":                        "0",
			"NCCL_ALGO":                             "Ring",
			"NCCL_PROTO":                            "Simple",
			"NCCL_NET_GDR_LEVEL":                    "PIX",
			"NCCL_P2P_PXN_LEVEL":                    "0",
		}
	case fabricTCPXO:
		// a3-megagpu: the FasTrak (TCPXO) plugin over eth1–eth8.
		return map[string]string{
			"NCCL_SOCKET_IFNAME":     "eth0",
			"NCCL_FASTRAK_CTRL_DEV":  "eth0",
			"NCCL_FASTRAK_IFNAME":    ethList(n.Devices),
			"NCCL_CROSS_NIC":         "0",
			"NCCL_PROTO":             "Simple,LL128",
			"NCCL_NET_GDR_LEVEL":     "PIX",
			"NCCL_FASTRAK_NUM_FLOWS": "2",
			"NCCL_FASTRAK_USE_SNAP":  "1",
		}
	case fabricRDMA:
		// a3-ultragpu: Google's gIB NCCL plugin over the RDMA NICs.
		return map[string]string{
			"NCCL_NET":                   "gIB",
			"NCCL_SOCKET_IFNAME":         "eth0,eth1",
			"NCCL_CROSS_NIC":             "0",
			"NCCL_NET_GDR_LEVEL":         "PIX",
			"NCCL_IB_ADAPTIVE_ROUTING":   "1",
			"NCCL_IB_QPS_PER_CONNECTION": "4",
			"NCCL_IB_TC":                 "52",
			"NCCL_IB_FIFO_TC":            "84",
		}
	}
	return nil
}
