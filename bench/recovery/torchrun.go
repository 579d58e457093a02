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
)

// torchrun runs the job under `python3 -m torch.distributed.run` (Debian's
// torchrun 1.13): three agent processes on this machine ("nodes" A, B, C,
// each its own session), c10d rendezvous hosted by node A, everything
// else at torchrun's defaults (monitor_interval 5 s, last_call 30 s,
// keep-alive 5 s × 3). max_restarts is raised from its default 0, or the
// first lost node would end the job.
type torchrun struct {
	cfg      config
	dir      string
	port     int
	tl       *Timeline
	mu       sync.Mutex
	nodes    map[string]*trNode
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

func newTorchrun(cfg config, dir string) (*torchrun, error) {
	port, err := procs.FreePort()
	if err != nil {
		return nil, err
	}
	return &torchrun{cfg: cfg, dir: dir, port: port, tl: NewTimeline(), nodes: map[string]*trNode{}, rdzvLogs: map[string][]time.Time{}}, nil
}

func (t *torchrun) timeline() *Timeline { return t.tl }

// argv is one torchrun agent's command line.
func (t *torchrun) argv(name string) []string {
	isHost := "0"
	if name == torchrunHost {
		isHost = "1"
	}
	args := []string{"-m", "torch.distributed.run", "-r", "1", "-t", "1",
		"--nnodes=2:3", "--nproc_per_node=1", "--rdzv_backend=c10d",
		fmt.Sprintf("--rdzv_endpoint=127.0.0.1:%d", t.port), "--rdzv_id=bench", "--rdzv_conf=is_host=" + isHost,
		"--max_restarts=10", "--log_dir=" + filepath.Join(t.dir, "logs-"+name), t.cfg.script}
	return append(args, t.cfg.trainArgs(filepath.Join(t.dir, "ckpt"))...)
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
	t.mu.Lock()
	n := t.nodes[name]
	delete(t.nodes, name)
	t.mu.Unlock()
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

// run plays the three scenarios and returns their results.
func (t *torchrun) run(ctx context.Context) (map[string]result, error) {
	res := map[string]result{}
	defer t.stop()
	for _, n := range []string{"A", "B", "C"} {
		if err := t.startNode(n); err != nil {
			return res, err
		}
	}
	say("torchrun: 3 agents started (c10d store on node A, 127.0.0.1:%d)", t.port)
	if err := waitSteady(ctx, t.timeline, t.live(), 3, 3*time.Second, t.cfg.startTimeout); err != nil {
		return res, fmt.Errorf("torchrun never trained at world size 3: %w", err)
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
	say("torchrun: killed node %s (SIGKILL to its session)", v)
	res[scenKill] = measure(ctx, "torchrun", scenKill, t.timeline, survivors, t0, 0, t.cfg.scenarioTimeout)
	t.explain(scenKill, t0, res[scenKill])
	if err := waitSteady(ctx, t.timeline, survivors, 2, 2*time.Second, t.cfg.scenarioTimeout); err != nil {
		return res, fmt.Errorf("torchrun survivors not steady at world size 2: %w", err)
	}

	// 3. A node added: measured from its agent entering the rendezvous
	// (and, for information, from its process start).
	if err := t.startNode("D"); err != nil {
		return res, err
	}
	started := time.Now()
	joinAt, err := t.waitRendezvousLine(ctx, "D", started, time.Minute)
	if err != nil {
		return res, err
	}
	say("torchrun: node D entered the rendezvous %.2fs after its start", joinAt.Sub(started).Seconds())
	all := t.live()
	r := measure(ctx, "torchrun", scenAdd, t.timeline, all, joinAt, 3, t.cfg.scenarioTimeout)
	if r.missing == "" {
		r.extra["from_process_start"] = r.seconds() + joinAt.Sub(started).Seconds()
	}
	res[scenAdd] = r
	t.explain(scenAdd, joinAt, r)
	if err := waitSteady(ctx, t.timeline, all, 3, 2*time.Second, t.cfg.scenarioTimeout); err != nil {
		return res, fmt.Errorf("torchrun not steady at world size 3 after adding D: %w", err)
	}

	// 2. A spot notice: torchrun has nothing that reads it, so training
	// goes on until the node dies at the deadline.
	v, err = t.victim()
	if err != nil {
		return res, err
	}
	survivors = without(t.live(), v)
	t0 = time.Now()
	say("torchrun: spot notice for node %s (torchrun cannot act on it; the node dies in %s)", v, t.cfg.lead)
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(t.cfg.lead):
	}
	death := time.Now()
	if err := t.kill(v); err != nil {
		return res, err
	}
	say("torchrun: node %s reclaimed at the notice deadline", v)
	r = measure(ctx, "torchrun", scenNotice, t.timeline, survivors, t0, 0, t.cfg.lead+t.cfg.scenarioTimeout)
	if r.missing == "" {
		r.extra["from_node_death"] = r.seconds() - death.Sub(t0).Seconds()
	}
	res[scenNotice] = r
	t.explain(scenNotice, t0, r)
	return res, nil
}

func (t *torchrun) explain(scen string, t0 time.Time, r result) {
	t.mu.Lock()
	notes := append([]note(nil), t.notes...)
	t.mu.Unlock()
	explain("torchrun", scen, t0, r, t.tl, notes)
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
