package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/bench/internal/procs"
	"github.com/fleetd/fleetd/bench/internal/trargs"
)

// torchrun runs the job under Debian's torchrun 1.13: three agent
// processes on this machine ("nodes" A, B, C, each its own session), c10d
// rendezvous hosted by node A, at fleetd's timeouts (the headline) or at
// torchrun's defaults (package trargs). The workers' collective timeout is
// the training script's, the same under fleetd.
type torchrun struct {
	cfg      config
	defaults bool // torchrun's defaults, not fleetd's timeouts
	dir      string
	port     int
	tl       *Timeline
	mu       sync.Mutex
	nodes    map[string]*trNode
	frozen   procs.Frozen           // SIGSTOPped nodes, killed by stop
	rdzvLogs map[string][]time.Time // arrival of "Rendezvous'ing worker group"
	notes    []note                 // the agents' log lines that explain a recovery
}

// agentMarkers are the torchrun agent log lines kept to explain a recovery.
var agentMarkers = []string{"Worker group FAILED", rendezvousLine, "Rendezvous complete", "new nodes from group_rank", "Stopping worker group", "Starting worker group", "failed (exitcode"}

type trNode struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{}
}

// rendezvousLine is what a torchrun agent logs (LOGLEVEL=INFO) as it
// enters the rendezvous: the moment a new node joins.
const rendezvousLine = "Rendezvous'ing worker group"

// torchrunHost is the node that hosts the c10d store; it is never killed
// (losing it ends a torchrun job: a fleetd job has no such node).
const torchrunHost = "A"

func newTorchrun(cfg config, defaults bool, dir string) (*torchrun, error) {
	port, err := procs.FreePort()
	if err != nil {
		return nil, err
	}
	return &torchrun{cfg: cfg, defaults: defaults, dir: dir, port: port, tl: NewTimeline(), nodes: map[string]*trNode{}, rdzvLogs: map[string][]time.Time{}}, nil
}

// name is the system's name in figures.
func (t *torchrun) name() string {
	if t.defaults {
		return sysTorchrunDefaults
	}
	return sysTorchrun
}

func (t *torchrun) timeline() *Timeline { return t.tl }

// argv is one torchrun agent's command line.
func (t *torchrun) argv(name string) []string {
	profile := trargs.FleetdTimeouts
	if t.defaults {
		profile = trargs.Defaults
	}
	return trargs.Node{Profile: profile, Launcher: t.cfg.keepAliveLauncher, Port: t.port, Host: name == torchrunHost, Nnodes: "2:3",
		LogDir: filepath.Join(t.dir, "logs-"+name), Script: t.cfg.script, Train: t.cfg.trainArgs(filepath.Join(t.dir, "ckpt"))}.Args()
}

// startNode starts one torchrun agent in a session of its own and feeds
// its output (workers' lines are tee'd with a "[default0]:" prefix) to the
// timeline and to a log file.
func (t *torchrun) startNode(name string) error {
	logf, err := os.Create(filepath.Join(t.dir, "torchrun-"+name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(t.cfg.python, t.argv(name)...)
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
	n := &trNode{name: name, cmd: cmd, started: time.Now(), done: make(chan struct{})}
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

func (t *torchrun) pump(name string, r io.ReadCloser, logf io.Writer) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		now := time.Now()
		fmt.Fprintf(logf, "%s %s\n", now.Format("15:04:05.000"), line)
		for _, m := range agentMarkers {
			if strings.Contains(line, m) {
				t.mu.Lock()
				if m == rendezvousLine {
					t.rdzvLogs[name] = append(t.rdzvLogs[name], now)
				}
				msg := line
				if i := strings.Index(msg, "[default]"); i >= 0 {
					msg = msg[i:]
				}
				t.notes = append(t.notes, note{now, "torchrun agent " + name + ": " + msg})
				t.mu.Unlock()
				break
			}
		}
		t.tl.Add(name, line)
	}
}

// kill powers a node off: SIGKILL to its whole session.
func (t *torchrun) kill(name string) error {
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

func (t *torchrun) stop() {
	t.mu.Lock()
	var names []string
	for name := range t.nodes {
		names = append(names, name)
	}
	t.mu.Unlock()
	t.frozen.KillAll()
	for _, name := range names {
		_ = t.kill(name)
	}
}

func (t *torchrun) live() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for name := range t.nodes {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// victim picks a live node that is neither the store host nor the rank-0
// worker's node (the fair case; see docs/benchmarks.md).
func (t *torchrun) victim() (string, error) {
	for _, n := range t.live() {
		in, ok := t.tl.Current(n)
		if n != torchrunHost && ok && in.Rank != 0 {
			return n, nil
		}
	}
	return "", fmt.Errorf("no torchrun node other than the store host and rank 0 among %v", t.live())
}

// run plays the scenarios and returns their results.
func (t *torchrun) run(ctx context.Context) (map[string]result, error) {
	res := map[string]result{}
	defer t.stop()
	sys := t.name()
	for _, n := range []string{"A", "B", "C"} {
		if err := t.startNode(n); err != nil {
			return res, err
		}
	}
	say("%s: 3 agents started (c10d store on node A, 127.0.0.1:%d)", sys, t.port)
	if err := waitSteady(ctx, t.timeline, t.live(), 3, 3*time.Second, t.cfg.startTimeout); err != nil {
		return res, fmt.Errorf("%s never trained at world size 3: %w", sys, err)
	}

	// 1. A node killed without notice.
	v, err := t.victim()
	if err != nil {
		return res, err
	}
	survivors := without(t.live(), v)
	t0 := time.Now()
	if err := t.kill(v); err != nil {
		return res, err
	}
	say("%s: killed node %s (SIGKILL to its session)", sys, v)
	res[scenKill] = measure(ctx, sys, scenKill, t.timeline, survivors, t0, 0, t.cfg.scenarioTimeout)
	t.explain(scenKill, t0, res[scenKill])
	if err := waitSteady(ctx, t.timeline, survivors, 2, 2*time.Second, t.cfg.scenarioTimeout); err != nil {
		return res, fmt.Errorf("%s survivors not steady at world size 2: %w", sys, err)
	}

	// 2. A node added, timed from its agent's process start as fleetd's
	// is (from the rendezvous entry too, for information).
	r, err := t.addNode(ctx, "D")
	res[scenAdd] = r
	if err != nil {
		return res, err
	}

	// 3. A spot notice: torchrun has nothing that reads it, so training
	// goes on until the node dies at the deadline; the figure is timed
	// from that death (the lead is reported on its own).
	v, err = t.victim()
	if err != nil {
		return res, err
	}
	survivors = without(t.live(), v)
	notice := time.Now()
	say("%s: spot notice for node %s (torchrun cannot act on it; the node dies in %s)", sys, v, t.cfg.lead)
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(t.cfg.lead):
	}
	death := time.Now()
	if err := t.kill(v); err != nil {
		return res, err
	}
	say("%s: node %s reclaimed at the notice deadline", sys, v)
	r = measure(ctx, sys, scenNotice, t.timeline, survivors, death, 0, t.cfg.scenarioTimeout)
	if r.missing == "" {
		r.extra["from_notice"] = r.seconds() + death.Sub(notice).Seconds()
	}
	res[scenNotice] = r
	t.explain(scenNotice, death, r)
	if err := waitSteady(ctx, t.timeline, survivors, 2, 2*time.Second, t.cfg.scenarioTimeout); err != nil {
		return res, fmt.Errorf("%s survivors not steady at world size 2: %w", sys, err)
	}

	// 4. A node that goes silent, as a vanished VM does: its processes
	// are stopped (SIGSTOP), so no connection is reset and the survivors
	// learn of it only through their timeouts. A third node first.
	if _, err := t.addNode(ctx, "E"); err != nil {
		return res, err
	}
	if v, err = t.victim(); err != nil {
		return res, err
	}
	survivors = without(t.live(), v)
	t0 = time.Now()
	stopped := t.silence(v)
	say("%s: node %s silenced (SIGSTOP to its %d processes)", sys, v, stopped)
	res[scenKillSilent] = measure(ctx, sys, scenKillSilent, t.timeline, survivors, t0, 0, t.cfg.scenarioTimeout)
	t.explain(scenKillSilent, t0, res[scenKillSilent])
	return res, nil
}

// addNode starts a torchrun agent and measures until all live nodes train
// at world size 3, from the agent process's start (the headline, the same
// event as fleetd's agent start) and from its entering the rendezvous.
func (t *torchrun) addNode(ctx context.Context, name string) (result, error) {
	sys := t.name()
	started := time.Now()
	if err := t.startNode(name); err != nil {
		return result{missing: err.Error()}, err
	}
	joinAt, err := t.waitRendezvousLine(ctx, name, started, time.Minute)
	if err != nil {
		return result{missing: err.Error()}, err
	}
	say("%s: node %s entered the rendezvous %.2fs after its start", sys, name, joinAt.Sub(started).Seconds())
	all := t.live()
	r := measure(ctx, sys, scenAdd, t.timeline, all, joinAt, 3, t.cfg.scenarioTimeout)
	r.fromEarlier(joinAt.Sub(started), "from_rendezvous_join")
	t.explain(scenAdd, joinAt, r)
	if err := waitSteady(ctx, t.timeline, all, 3, 2*time.Second, t.cfg.scenarioTimeout); err != nil {
		return r, fmt.Errorf("%s not steady at world size 3 after adding %s: %w", sys, name, err)
	}
	return r, nil
}

// silence stops every process of node's session and keeps the node (its
// processes stay until stop kills them, as a stopped VM's sockets stay open).
func (t *torchrun) silence(name string) int {
	if n := t.take(name); n != nil {
		return t.frozen.Stop(n.cmd.Process.Pid)
	}
	return 0
}

// take removes node name from the live ones and returns it (nil: none).
func (t *torchrun) take(name string) *trNode {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.nodes[name]
	delete(t.nodes, name)
	return n
}

func (t *torchrun) explain(scen string, t0 time.Time, r result) {
	t.mu.Lock()
	notes := append([]note(nil), t.notes...)
	t.mu.Unlock()
	explain(t.name(), scen, t0, r, t.tl, notes)
}

// waitRendezvousLine waits for node's agent to log that it enters the
// rendezvous after since.
func (t *torchrun) waitRendezvousLine(ctx context.Context, node string, since time.Time, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		t.mu.Lock()
		for _, at := range t.rdzvLogs[node] {
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

func without(list []string, x string) []string {
	var out []string
	for _, s := range list {
		if s != x {
			out = append(out, s)
		}
	}
	return out
}
