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
// processes ("nodes" A, B, C, each its own session), c10d rendezvous
// hosted by node A, at fleetd's timeouts ("torchrun", the headline) or at
// torchrun's defaults ("torchrun-defaults"); see package trargs.
type torchrun struct {
	cfg      config
	defaults bool
	dir      string
	port     int
	tl       *Timeline
	mu       sync.Mutex
	nodes    map[string]*trNode
	frozen   procs.Frozen           // SIGSTOPped nodes, killed by stop
	rdzv     map[string][]time.Time // "Rendezvous'ing worker group" per node
	log      []note
	next     byte
}

type trNode struct {
	cmd  *exec.Cmd
	done chan struct{}
}

const (
	rendezvousLine = "Rendezvous'ing worker group"
	torchrunHost   = "A" // hosts the c10d store; never the victim (losing it ends a torchrun job)
)

var torchrunMarkers = []string{"Worker group FAILED", rendezvousLine, "Rendezvous complete", "Stopping worker group",
	"Starting worker group", "failed (exitcode"}

func newTorchrun(cfg config, defaults bool, dir string) (*torchrun, error) {
	port, err := procs.FreePort()
	if err != nil {
		return nil, err
	}
	return &torchrun{cfg: cfg, defaults: defaults, dir: dir, port: port, tl: NewTimeline(), nodes: map[string]*trNode{},
		rdzv: map[string][]time.Time{}, next: 'A'}, nil
}

func (t *torchrun) name() string {
	if t.defaults {
		return sysTorchrunDefaults
	}
	return sysTorchrun
}

func (t *torchrun) timeline() *Timeline { return t.tl }

func (t *torchrun) startNode() (string, error) {
	t.mu.Lock()
	name := string(t.next)
	t.next++
	t.mu.Unlock()
	profile := trargs.FleetdTimeouts
	if t.defaults {
		profile = trargs.Defaults
	}
	args := trargs.Node{Profile: profile, Launcher: t.cfg.keepAliveLauncher, Port: t.port, Host: name == torchrunHost, Nnodes: "2:3",
		LogDir: filepath.Join(t.dir, "logs-"+name), Script: t.cfg.script, Train: t.cfg.trainArgs(filepath.Join(t.dir, "ckpt"))}.Args()
	logf, err := os.Create(filepath.Join(t.dir, "torchrun-"+name+".log"))
	if err != nil {
		return "", err
	}
	cmd := exec.Command(t.cfg.python, args...)
	cmd.Env = append(os.Environ(), "LOGLEVEL=INFO", "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	pr, pw, err := os.Pipe()
	if err != nil {
		logf.Close()
		return "", err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		logf.Close()
		return "", fmt.Errorf("start torchrun node %s: %w", name, err)
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
	return name, nil
}

func (t *torchrun) pump(name string, r io.ReadCloser, logf io.Writer) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		now := time.Now()
		fmt.Fprintf(logf, "%s %s\n", now.Format("15:04:05.000"), line)
		for _, m := range torchrunMarkers {
			if strings.Contains(line, m) {
				msg := line
				if i := strings.Index(msg, "[default]"); i >= 0 {
					msg = msg[i:]
				}
				t.mu.Lock()
				if m == rendezvousLine {
					t.rdzv[name] = append(t.rdzv[name], now)
				}
				t.log = append(t.log, note{now, "torchrun agent " + name + ": " + msg})
				t.mu.Unlock()
				break
			}
		}
		t.tl.Add(name, line)
	}
}

func (t *torchrun) start(ctx context.Context) error {
	for range 3 {
		if _, err := t.startNode(); err != nil {
			return err
		}
	}
	say("torchrun: 3 agents started (c10d store on node A, 127.0.0.1:%d)", t.port)
	return nil
}

func (t *torchrun) live() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for n := range t.nodes {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (t *torchrun) victim() (string, error) {
	for _, n := range t.live() {
		if r, ok := t.tl.Rank(n); n != torchrunHost && ok && r != 0 {
			return n, nil
		}
	}
	return "", fmt.Errorf("no torchrun node other than the store host and rank 0 among %v", t.live())
}

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

// add starts a fourth agent; the join is its entering the rendezvous.
func (t *torchrun) add(ctx context.Context, since time.Time) (string, time.Time, time.Time, error) {
	started := time.Now()
	name, err := t.startNode()
	if err != nil {
		return "", time.Time{}, time.Time{}, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		t.mu.Lock()
		for _, at := range t.rdzv[name] {
			if !at.Before(since) {
				t.mu.Unlock()
				return name, at, started, nil
			}
		}
		t.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	return "", time.Time{}, time.Time{}, fmt.Errorf("torchrun node %s did not enter the rendezvous", name)
}

// silence stops every process of the node's session (SIGSTOP); stop kills it.
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

// notice: torchrun has nothing that reads a notice; the node dies at the
// deadline.
func (t *torchrun) notice(ctx context.Context, node string) (time.Time, time.Time, error) {
	say("torchrun: spot notice for node %s (torchrun cannot act on it; the node dies in %s)", node, t.cfg.lead)
	select {
	case <-ctx.Done():
		return time.Time{}, time.Time{}, ctx.Err()
	case <-time.After(t.cfg.lead):
	}
	death := time.Now()
	return death, time.Time{}, t.kill(node)
}

func (t *torchrun) lossKnown(node string, since time.Time) time.Time { return time.Time{} }

func (t *torchrun) notes(from, to time.Time) []note {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []note
	for _, n := range t.log {
		if !n.At.Before(from) && !n.At.After(to) {
			out = append(out, n)
		}
	}
	return out
}

func (t *torchrun) stop() {
	for _, n := range t.live() {
		_ = t.kill(n)
	}
	t.frozen.KillAll()
}
