// Package trargs builds the torchrun command lines of the benchmarks, so
// that bench/recovery and bench/elastic run torchrun the same way: Debian's
// torchrun 1.13 (`-r 1 -t 1` are needed on Python 3.11), c10d rendezvous
// hosted by one node, max_restarts raised from its default 0 (or the first
// lost node would end the job), in one of two profiles:
//
//   - FleetdTimeouts (the headline comparison): fleetd's defaults for
//     last_call and the keep-alive (heartbeat every 2 s, dead after 10 s:
//     2 s × 5), and the worker monitor polling every 0.1 s where fleetd's
//     agent learns of a worker's exit at once (waitid). torch 1.13
//     hard-codes the keep-alive: it is set through bench/torchrun_keepalive.py,
//     which reads it from --rdzv_conf as later torch releases do;
//   - Defaults: `python3 -m torch.distributed.run` at its defaults
//     (monitor_interval 5 s, last_call 30 s, keep-alive 5 s × 3).
package trargs

import (
	"fmt"

	"github.com/fleetd/fleetd/fleet/spec"
)

// Profile is how torchrun's timeouts are set.
type Profile int

// Profiles.
const (
	FleetdTimeouts Profile = iota
	Defaults
)

// MonitorInterval is torchrun's worker poll under FleetdTimeouts.
const MonitorInterval = 0.1 // s

// Node is one torchrun agent's command line.
type Node struct {
	Profile  Profile
	Launcher string // bench/torchrun_keepalive.py (FleetdTimeouts)
	Port     int    // of the c10d store
	Host     bool   // this node hosts the store
	Nnodes   string // e.g. "2:3"
	LogDir   string
	Script   string
	Train    []string // the training script's arguments
}

// Args are the arguments after the Python executable.
func (n Node) Args() []string {
	host := "0"
	if n.Host {
		host = "1"
	}
	launcher := []string{"-m", "torch.distributed.run"}
	conf := "is_host=" + host
	var monitor []string
	if n.Profile == FleetdTimeouts {
		launcher = []string{n.Launcher}
		conf += fmt.Sprintf(",last_call_timeout=%d,keep_alive_interval=%d,keep_alive_max_attempt=%d",
			int(spec.DefaultLastCall.Seconds()), int(spec.DefaultHeartbeat.Seconds()), int(spec.DefaultDeadAfter/spec.DefaultHeartbeat))
		monitor = []string{fmt.Sprintf("--monitor_interval=%g", MonitorInterval)}
	}
	args := append(launcher, "-r", "1", "-t", "1", "--nnodes="+n.Nnodes, "--nproc_per_node=1", "--rdzv_backend=c10d",
		fmt.Sprintf("--rdzv_endpoint=127.0.0.1:%d", n.Port), "--rdzv_id=bench", "--rdzv_conf="+conf,
		"--max_restarts=10", "--log_dir="+n.LogDir)
	args = append(append(args, monitor...), n.Script)
	return append(args, n.Train...)
}
