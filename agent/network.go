package agent

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
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
	// devices under /sys/class/infiniband; GPU NICs under /sys/class/net).
	Devices int
	Group   string
	// Ctrl and NICs name the node's gVNICs on GCP: the control NIC and
	// the GPU data NICs in PCI order (TCPX, TCPXO), or the second gVNIC
	// (RDMA).
	Ctrl string
	NICs []string
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
		if nc.Fabric == fabricRDMA {
			// a3-ultragpu's two gVNICs carry NCCL's socket traffic.
			n.Ctrl, n.NICs = gpuNICs(root, 1)
		}
	default:
		n.Ctrl, n.NICs = gpuNICs(root, nc.Interfaces)
		n.Devices = len(n.NICs)
	}
	return n
}

// gpuNICs finds the control NIC and the GPU NICs of an a3 node. Under GKE
// (and images booted with net.ifnames=0) they are eth0 and eth1…ethN;
// Google's VM images name them by PCI slot instead (a3-megagpu: enp0s12,
// then enp6s0, enp7s0, enp13s0, …, enp142s0, as Google's Slurm and
// cluster-toolkit scripts set NCCL_FASTRAK_IFNAME), so an agent that
// assumed eth names would hand NCCL interfaces that do not exist. gVNIC
// interfaces are the ones bound to the gve driver; the control NIC is the
// one carrying the default route.
func gpuNICs(root string, want int) (ctrl string, nics []string) {
	netDir := filepath.Join(root, "/sys/class/net")
	for i := 1; i <= want; i++ {
		if _, err := os.Stat(filepath.Join(netDir, "eth"+strconv.Itoa(i))); err == nil {
			nics = append(nics, "eth"+strconv.Itoa(i))
		}
	}
	if len(nics) > 0 {
		return "eth0", nics
	}
	ents, _ := os.ReadDir(netDir)
	var gve []string
	for _, e := range ents {
		drv, err := os.Readlink(filepath.Join(netDir, e.Name(), "device/driver"))
		if err == nil && filepath.Base(drv) == "gve" {
			gve = append(gve, e.Name())
		}
	}
	slices.SortFunc(gve, naturalCompare)
	ctrl = defaultRouteDev(root)
	if ctrl == "" && len(gve) > 0 {
		ctrl = gve[0] // the primary NIC has the lowest PCI slot
	}
	for _, g := range gve {
		if g != ctrl && len(nics) < want {
			nics = append(nics, g)
		}
	}
	return ctrl, nics
}

// defaultRouteDev is the interface of the IPv4 default route
// (/proc/net/route: the row whose destination is 00000000).
func defaultRouteDev(root string) string {
	b, err := os.ReadFile(filepath.Join(root, "/proc/net/route"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 1 && f[1] == "00000000" {
			return f[0]
		}
	}
	return ""
}

// naturalCompare orders interface names with their numbers as numbers
// (enp13s0 before enp134s0), which is their PCI order.
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		da, db := digitsPrefix(a), digitsPrefix(b)
		if da != "" && db != "" {
			na, _ := strconv.Atoi(da)
			nb, _ := strconv.Atoi(db)
			if na != nb {
				return cmp.Compare(na, nb)
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func digitsPrefix(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
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

// networkDefaults is the NCCL/libfabric environment of a fast path. The
// worker's environment (the agent's own, then the spec's env) wins over
// every one of them: docs/agent.md lists them.
func networkDefaults(n netPath) map[string]string {
	if !n.active() {
		return nil
	}
	var m map[string]string
	switch n.Fabric {
	case fabricEFA:
		// aws-ofi-nccl over libfabric's EFA provider; GPUDirect RDMA on
		// the types that have it (p4d, p5); fork safety for data loaders.
		m = map[string]string{
			"FI_PROVIDER":            "efa",
			"FI_EFA_USE_DEVICE_RDMA": "1",
			"FI_EFA_FORK_SAFE":       "1",
			"NCCL_CROSS_NIC":         "1",
		}
	case fabricTCPX:
		// a3-highgpu: the control NIC carries control traffic, the 4 GPU
		// NICs the data; the image runs the RxDM receive-path daemon.
		// Google's NCCL test configs for TCPX set these values.
		m = map[string]string{
			"NCCL_SOCKET_IFNAME":                    n.Ctrl,
			"NCCL_GPUDIRECTTCPX_CTRL_DEV":           n.Ctrl,
			"NCCL_GPUDIRECTTCPX_SOCKET_IFNAME":      strings.Join(n.NICs, ","),
			"NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX": "/run/tcpx",
			"NCCL_CROSS_NIC":                        "0",
			"NCCL_ALGO":                             "Ring",
			"NCCL_PROTO":                            "Simple",
			"NCCL_NET_GDR_LEVEL":                    "PIX",
			"NCCL_P2P_PXN_LEVEL":                    "0",
		}
	case fabricTCPXO:
		// a3-megagpu: the FasTrak (TCPXO) plugin over the 8 GPU NICs.
		m = map[string]string{
			"NCCL_SOCKET_IFNAME":     n.Ctrl,
			"NCCL_FASTRAK_CTRL_DEV":  n.Ctrl,
			"NCCL_FASTRAK_IFNAME":    strings.Join(n.NICs, ","),
			"NCCL_CROSS_NIC":         "0",
			"NCCL_PROTO":             "Simple,LL128",
			"NCCL_NET_GDR_LEVEL":     "PIX",
			"NCCL_FASTRAK_NUM_FLOWS": "2",
			"NCCL_FASTRAK_USE_SNAP":  "1",
		}
	case fabricRDMA:
		// a3-ultragpu: Google's gIB NCCL plugin over the RDMA NICs.
		m = map[string]string{
			"NCCL_NET":                   "gIB",
			"NCCL_SOCKET_IFNAME":         strings.Join(slices.DeleteFunc(append([]string{n.Ctrl}, n.NICs...), func(s string) bool { return s == "" }), ","),
			"NCCL_CROSS_NIC":             "0",
			"NCCL_NET_GDR_LEVEL":         "PIX",
			"NCCL_IB_ADAPTIVE_ROUTING":   "1",
			"NCCL_IB_QPS_PER_CONNECTION": "4",
			"NCCL_IB_TC":                 "52",
			"NCCL_IB_FIFO_TC":            "84",
		}
	}
	// An interface the machine does not show is left to NCCL's own choice.
	maps.DeleteFunc(m, func(_, v string) bool { return v == "" })
	return m
}
