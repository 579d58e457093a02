package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/rendezvous"
)

// fakeDevices makes root look like a VM with n EFA devices (EFA shows up
// as RDMA devices under /sys/class/infiniband) and n GPU NICs eth1…ethN.
func fakeDevices(t *testing.T, root string, n int) {
	t.Helper()
	for i := range n {
		for _, d := range []string{filepath.Join(root, "sys/class/infiniband", "rdmap"+itoa(i)+"s0"), filepath.Join(root, "sys/class/net", "eth"+itoa(i+1))} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// fakeGVNICs makes root look like an a3 VM on Google's image: gVNIC
// interfaces named by PCI slot, the first carrying the default route.
func fakeGVNICs(t *testing.T, root string, names ...string) {
	t.Helper()
	drv := filepath.Join(root, "sys/bus/pci/drivers/gve")
	if err := os.MkdirAll(drv, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range append(names, "lo") {
		dev := filepath.Join(root, "sys/class/net", n, "device")
		if err := os.MkdirAll(dev, 0o755); err != nil {
			t.Fatal(err)
		}
		if n != "lo" {
			if err := os.Symlink(drv, filepath.Join(dev, "driver")); err != nil {
				t.Fatal(err)
			}
		}
	}
	route := "Iface\tDestination\tGateway\n" + names[0] + "\t00000000\t0100800A\n" + names[0] + "\t0000800A\t00000000\n"
	if err := os.MkdirAll(filepath.Join(root, "proc/net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "proc/net/route"), []byte(route), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestNetworkEnv(t *testing.T) {
	root := t.TempDir()
	fakeDevices(t, root, 4)
	// Listed out of PCI order, with the primary NIC in the middle.
	mega := t.TempDir()
	fakeGVNICs(t, mega, "enp0s12", "enp134s0", "enp13s0", "enp6s0", "enp142s0", "enp7s0", "enp14s0", "enp141s0", "enp135s0")
	ultra := t.TempDir()
	fakeGVNICs(t, ultra, "enp0s19", "enp192s20")
	for i := range 8 {
		if err := os.MkdirAll(filepath.Join(ultra, "sys/class/infiniband", "mlx5_"+itoa(i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a := rendezvous.Assignment{Round: 1, WorldSize: 8, LocalWorldSize: 8, GroupWorldSize: 1, MasterAddr: "10.0.0.1", MasterPort: 29500, RunID: "r"}
	for _, c := range []struct {
		name    string
		root    string
		nc      *agentwire.NetworkConfig
		base    []string
		spec    map[string]string
		want    map[string]string
		absent  []string
		network string
	}{
		{name: "standard", root: root, absent: []string{"FI_PROVIDER", EnvNetwork, "NCCL_NET"}},
		{name: "efa", root: root, nc: &agentwire.NetworkConfig{Fabric: fabricEFA, Interfaces: 4, Group: "fleetd-bert-k3x9-us-east-1a"},
			want:    map[string]string{"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"},
			network: "efa ×4, placement group fleetd-bert-k3x9-us-east-1a"},
		{name: "spec env wins", root: root, nc: &agentwire.NetworkConfig{Fabric: fabricEFA, Interfaces: 4},
			spec: map[string]string{"FI_EFA_USE_DEVICE_RDMA": "0"}, base: []string{"FI_PROVIDER=sockets"},
			want: map[string]string{"FI_PROVIDER": "sockets", "FI_EFA_USE_DEVICE_RDMA": "0", "FI_EFA_FORK_SAFE": "1"}, network: "efa ×4"},
		{name: "efa missing on the machine", root: t.TempDir(), nc: &agentwire.NetworkConfig{Fabric: fabricEFA, Interfaces: 4},
			absent: []string{"FI_PROVIDER"}, network: "tcp: efa expected (4 interfaces), no device found"},
		{name: "tcpx", root: root, nc: &agentwire.NetworkConfig{Fabric: fabricTCPX, Interfaces: 4},
			want:    map[string]string{"NCCL_GPUDIRECTTCPX_SOCKET_IFNAME": "eth1,eth2,eth3,eth4", "NCCL_GPUDIRECTTCPX_CTRL_DEV": "eth0", "NCCL_SOCKET_IFNAME": "eth0"},
			network: "gpudirect-tcpx ×4"},
		{name: "tcpxo on a VM image names NICs by PCI slot", root: mega, nc: &agentwire.NetworkConfig{Fabric: fabricTCPXO, Interfaces: 8},
			want: map[string]string{"NCCL_FASTRAK_IFNAME": "enp6s0,enp7s0,enp13s0,enp14s0,enp134s0,enp135s0,enp141s0,enp142s0",
				"NCCL_FASTRAK_CTRL_DEV": "enp0s12", "NCCL_SOCKET_IFNAME": "enp0s12"},
			network: "gpudirect-tcpxo ×8"},
		{name: "rdma sockets on both gVNICs", root: ultra, nc: &agentwire.NetworkConfig{Fabric: fabricRDMA, Interfaces: 8},
			want: map[string]string{"NCCL_NET": "gIB", "NCCL_SOCKET_IFNAME": "enp0s19,enp192s20"}, network: "rdma ×8"},
		{name: "spoofed FLEETD_NETWORK is dropped", root: root, base: []string{EnvNetwork + "=lies"}, absent: []string{EnvNetwork}},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := envMap(workerEnv(workerEnvParams{Base: c.base, Assignment: a, Training: TrainingConfig{Env: c.spec, Network: c.nc}, Network: detectNetwork(c.root, c.nc)}, 0))
			checkEnv(t, env, c.want, c.absent)
			if c.network != "" && env[EnvNetwork] != c.network {
				t.Errorf("%s=%q, want %q", EnvNetwork, env[EnvNetwork], c.network)
			}
		})
	}
}

// TestWorkerNetworkEnvironment runs real agents and workers on the fast
// network: the node whose machine has its EFA devices gives its workers
// the libfabric/NCCL environment (the spec's env winning), the one
// without them trains on TCP and says so.
func TestWorkerNetworkEnvironment(t *testing.T) {
	py := needPython(t)
	addrs := loopbackAddrs(t, 2)
	dir, ckpt, out := t.TempDir(), t.TempDir(), t.TempDir()
	script := filepath.Join(dir, "envdump.py")
	if err := os.WriteFile(script, []byte(envDumpScript), 0o644); err != nil {
		t.Fatal(err)
	}
	off := false
	tc := TrainingConfig{Command: []string{py, script}, NprocPerNode: 1, MaxRestarts: 1, DrainGrace: 5 * time.Second,
		CheckpointURI: ckpt, Workdir: dir, WarmStart: &off,
		Env:     map[string]string{"ENV_OUT": out, "FI_EFA_FORK_SAFE": "0"},
		Network: &agentwire.NetworkConfig{Fabric: fabricEFA, Interfaces: 4, Group: "fleetd-bert-k3x9-us-east-1a"}}
	d := newFakeDaemon(t, rdzvConfig(t, 2, 2), tc)
	efaRoot := t.TempDir()
	fakeDevices(t, efaRoot, 4)
	withRoot := func(root string) agentOpt { return func(o *Options) { o.Root = root } }
	agents := []*testAgent{startAgent(t, d, "a", addrs[0], withRoot(efaRoot)), startAgent(t, d, "b", addrs[1])}
	agents[0].root = efaRoot
	waitAll(t, 30*time.Second, agents...)
	wantDone(t, d, true)

	st, err := d.service().Status(testFleet)
	if err != nil {
		t.Fatal(err)
	}
	for rank := range 2 {
		b, err := os.ReadFile(filepath.Join(out, "env-"+itoa(rank)+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var env map[string]string
		if err := json.Unmarshal(b, &env); err != nil {
			t.Fatal(err)
		}
		switch node := st.Members[rank].NodeID; node {
		case "a":
			if env["FI_PROVIDER"] != "efa" || env["FI_EFA_USE_DEVICE_RDMA"] != "1" || env["FI_EFA_FORK_SAFE"] != "0" ||
				env[EnvNetwork] != "efa ×4, placement group fleetd-bert-k3x9-us-east-1a" {
				t.Errorf("node a (EFA devices): FI_PROVIDER=%q FI_EFA_USE_DEVICE_RDMA=%q FI_EFA_FORK_SAFE=%q %s=%q",
					env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"], env["FI_EFA_FORK_SAFE"], EnvNetwork, env[EnvNetwork])
			}
		case "b":
			if _, ok := env["FI_PROVIDER"]; ok || !strings.HasPrefix(env[EnvNetwork], "tcp: efa expected") {
				t.Errorf("node b (no EFA devices): FI_PROVIDER=%q %s=%q", env["FI_PROVIDER"], EnvNetwork, env[EnvNetwork])
			}
		default:
			t.Fatalf("member %q", node)
		}
	}
	b, err := os.ReadFile(agents[0].paths().LogFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"msg":"network"`) || !strings.Contains(string(b), `"path":"efa ×4, placement group fleetd-bert-k3x9-us-east-1a"`) {
		t.Errorf("agent a's log does not name its network path:\n%s", b)
	}
}
