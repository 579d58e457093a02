package driver

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/bench/internal/procs"
	"github.com/fleetd/fleetd/bench/internal/trargs"
	"github.com/fleetd/fleetd/internal/freeport"
)

// RendezvousLine is what a torchrun agent logs (LOGLEVEL=INFO) as it
// enters the rendezvous: the moment a new node joins.
const RendezvousLine = "Rendezvous'ing worker group"

// TorchrunHost is the node that hosts the c10d store; it is never the
// victim (losing it ends a torchrun job: a fleetd job has no such node).
const TorchrunHost = "A"

// agentMarkers are the torchrun agent log lines kept to explain a recovery.
var agentMarkers = []string{"Worker group FAILED", RendezvousLine, "Rendezvous complete", "new nodes from group_rank",
	"Stopping worker group", "Starting worker group", "failed (exitcode"}

// TorchrunConfig is how the agents are started.
type TorchrunConfig struct {
	// Python runs Argv (torchrun, or the keep-alive launcher).
	Python string
	// Dir holds each node's log, torchrun-<node>.log.
	Dir string
	// Argv is node's command line, with the c10d store's port.
	Argv func(node string, port int) []string
	// Line receives every output line of a node (its workers' lines are
	// tee'd with a "[default0]:" prefix): the benchmark's timeline.
	Line func(node, line string)
}

// Torchrun is a set of torchrun agent processes on this machine, each in
// a session of its own (a "node"), sharing a c10d store on a free port.
type Torchrun struct {
	cfg    TorchrunConfig
	port   int
	mu     sync.Mutex
	nodes  map[string]*trNode
	frozen procs.Frozen           // SIGSTOPped nodes, killed by Stop
	rdzv   map[string][]time.Time // RendezvousLine per node
	notes  []Note
}

type trNode struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// NewTorchrun picks the store's port; no agent runs yet.
func NewTorchrun(cfg TorchrunConfig) (*Torchrun, error) {
	port, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	return &Torchrun{cfg: cfg, port: port, nodes: map[string]*trNode{}, rdzv: map[string][]time.Time{}}, nil
}

// Port is the c10d store's port.
func (t *Torchrun) Port() int { return t.port }

// SetDir sets where the nodes' logs go (before the first Start).
func (t *Torchrun) SetDir(dir string) { t.cfg.Dir = dir }

// Start starts node's agent in a session of its own and feeds its output
// to Line and to its log file.
func (t *Torchrun) Start(name string) error {
	logf, err := os.Create(filepath.Join(t.cfg.Dir, "torchrun-"+name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(t.cfg.Python, t.cfg.Argv(name, t.port)...)
	cmd.Env = append(os.Environ(), "LOGLEVEL=INFO", "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	pr, pw, err := os.Pipe()
	if err != nil {
		logf.Close()
		return err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		logf.Close()
		return fmt.Errorf("start torchrun node %s: %w", name, err)
	}
	pw.Close()
	n := &trNode{cmd: cmd, done: make(chan struct{})}
	t.mu.Lock()
	t.nodes[name] = n
	t.mu.Unlock()
	go func() {
		defer close(n.done)
		defer logf.Close()
		t.pump(name, pr, logf)
		_ = cmd.Wait()
	}()
	return nil
}

func (t *Torchrun) pump(name string, r io.ReadCloser, logf io.Writer) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		now := time.Now()
		fmt.Fprintf(logf, "%s %s\n", now.Format("15:04:05.000"), line)
		for _, m := range agentMarkers {
			if strings.Contains(line, m) {
				msg := line
				if i := strings.Index(msg, "[default]"); i >= 0 {
					msg = msg[i:]
				}
				t.mu.Lock()
				if m == RendezvousLine {
					t.rdzv[name] = append(t.rdzv[name], now)
				}
				t.notes = append(t.notes, Note{now, "torchrun agent " + name + ": " + msg})
				t.mu.Unlock()
				break
			}
		}
		t.cfg.Line(name, line)
	}
}

// Live are the nodes started and neither killed nor silenced, sorted.
func (t *Torchrun) Live() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Sorted(maps.Keys(t.nodes))
}

// Kill powers a node off: SIGKILL to its whole session.
func (t *Torchrun) Kill(name string) error {
	n := t.take(name)
	if n == nil {
		return fmt.Errorf("no torchrun node %s", name)
	}
	procs.KillSession(n.cmd.Process.Pid)
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
	}
	return nil
}

// Silence stops every process of node's session (SIGSTOP) and keeps them
// until Stop (as a stopped VM's sockets stay open); it returns how many
// it stopped.
func (t *Torchrun) Silence(name string) int {
	if n := t.take(name); n != nil {
		return t.frozen.Stop(n.cmd.Process.Pid)
	}
	return 0
}

// take removes node name from the live ones and returns it (nil: none).
func (t *Torchrun) take(name string) *trNode {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.nodes[name]
	delete(t.nodes, name)
	return n
}

// Stop kills every node, silenced ones too.
func (t *Torchrun) Stop() {
	t.frozen.KillAll()
	for _, n := range t.Live() {
		_ = t.Kill(n)
	}
}

// Notes are the agents' log lines that explain a recovery.
func (t *Torchrun) Notes() []Note {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Note(nil), t.notes...)
}

// WaitRendezvous waits for node's agent to enter the rendezvous at or
// after since.
func (t *Torchrun) WaitRendezvous(ctx context.Context, node string, since time.Time, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		t.mu.Lock()
		for _, at := range t.rdzv[node] {
			if !at.Before(since) {
				t.mu.Unlock()
				return at, nil
			}
		}
		t.mu.Unlock()
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("torchrun node %s did not enter the rendezvous within %s", node, timeout)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Agent is the benchmarks' torchrun agent command line (package trargs):
// 2 to 3 nodes, node TorchrunHost hosting the c10d store, at fleetd's
// timeouts (through the keep-alive launcher) or at torchrun's defaults.
type Agent struct {
	Defaults bool   // torchrun's defaults, not fleetd's timeouts
	Launcher string // bench/torchrun_keepalive.py
	Script   string
	// Train are the worker's arguments with its checkpoint directory.
	Train func(ckpt string) []string
	// Dir holds logs-<node> and the checkpoint (ckpt).
	Dir string
}

// Argv is node's command line with the store's port.
func (a *Agent) Argv(node string, port int) []string {
	profile := trargs.FleetdTimeouts
	if a.Defaults {
		profile = trargs.Defaults
	}
	return trargs.Node{Profile: profile, Launcher: a.Launcher, Port: port, Host: node == TorchrunHost, Nnodes: "2:3",
		LogDir: filepath.Join(a.Dir, "logs-"+node), Script: a.Script, Train: a.Train(filepath.Join(a.Dir, "ckpt"))}.Args()
}
