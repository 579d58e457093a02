package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/bench/internal/devd"
	"github.com/fleetd/fleetd/bench/internal/procs"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/providers"
)

// fleetdRun runs the same job under a real `fleetd serve -dev` with the
// embedded local provider: every node is a real agent process tree (its
// own session, address and metadata emulator) booted from the daemon's
// cloud-init user-data. The fleet spec uses fleetd's defaults for
// everything that affects recovery (rendezvous last_call 5 s, heartbeat
// 2 s, dead_after 10 s; reconcile tick 2 s).
type fleetdRun struct {
	cfg    config
	dir    string
	daemon *devd.Daemon
	client *api.Client

	mu     sync.Mutex
	tl     *Timeline
	frozen procs.Frozen // sessions stopped by kill_silent, killed by stop
}

const benchFleet = "bench"

func newFleetd(cfg config, dir string) *fleetdRun {
	return &fleetdRun{cfg: cfg, dir: dir, tl: NewTimeline()}
}

func (f *fleetdRun) stateDir() string { return filepath.Join(f.dir, "local") }

// spec is the fleet: 3 nodes of 1 GPU, min 2, the same worker command as
// under torchrun. Three zones so that a replacement has a spot offering
// once the lost node's offering is marked interrupted.
func (f *fleetdRun) spec() string {
	cmd, _ := json.Marshal(append([]string{f.cfg.python, f.cfg.script}, f.cfg.trainArgs(filepath.Join(f.dir, "ckpt"))...))
	return fmt.Sprintf(`
fleet %q {
  min_nodes     = 2
  max_nodes     = 3
  desired_nodes = 3

  node {
    gpus      = 1
    gpu_types = ["sim-gpu"]
    spot      = true
  }

  placement {
    colocate = "region"
  }

  provider "local" {
    zones          = ["local-a", "local-b", "local-c"]
    state_dir      = %q
    address_prefix = "127.0.77."
    instance_types = {
      "sim-gpu-1" = {
        gpus            = 1
        gpu_type        = "sim-gpu"
        vcpus           = 4
        memory_gib      = 16
        spot_price      = 0.35
        on_demand_price = 1.10
      }
    }
    notice_lead = %q
  }

  training {
    command        = %s
    nproc_per_node = 1
    max_restarts   = 10
    env = {
      OMP_NUM_THREADS  = "1"
      PYTHONUNBUFFERED = "1"
    }
  }
}
`, benchFleet, f.stateDir(), f.cfg.lead.String(), cmd)
}

// start runs `fleetd serve -dev` and applies the fleet.
func (f *fleetdRun) start(ctx context.Context) error {
	d, err := devd.Start(ctx, f.cfg.fleetd, f.dir)
	f.daemon = d
	if err != nil {
		return err
	}
	f.client = d.Client
	if _, err := f.client.Apply(ctx, api.ApplyRequest{Filename: "bench.hcl", Source: f.spec()}); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	go f.follow(ctx)
	return nil
}

// stop ends the dev daemon (which terminates its nodes) and then powers
// off whatever node is still up.
func (f *fleetdRun) stop() {
	f.daemon.Stop()
	for _, n := range f.instances() {
		procs.KillSession(n.PID)
	}
	f.frozen.KillAll()
}

func (f *fleetdRun) instances() []devd.Instance { return devd.Instances(f.stateDir()) }

// follow rebuilds the timeline from every node's per-round worker log
// files (root/var/log/fleetd/round-N/rank-R.log) four times a second.
func (f *fleetdRun) follow(ctx context.Context) {
	for ctx.Err() == nil {
		tl := NewTimeline()
		for _, in := range f.instances() {
			node := in.Tags[providers.TagNodeID]
			rounds, _ := filepath.Glob(filepath.Join(in.Dir, "root", "var", "log", "fleetd", "round-*"))
			sort.Slice(rounds, func(i, j int) bool { return roundNum(rounds[i]) < roundNum(rounds[j]) })
			for _, rd := range rounds {
				files, _ := filepath.Glob(filepath.Join(rd, "rank-*.log"))
				sort.Strings(files)
				for _, p := range files {
					fh, err := os.Open(p)
					if err != nil {
						continue
					}
					sc := bufio.NewScanner(fh)
					sc.Buffer(make([]byte, 64*1024), 1<<20)
					for sc.Scan() {
						tl.Add(node, sc.Text())
					}
					fh.Close()
				}
			}
		}
		f.mu.Lock()
		f.tl = tl
		f.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func roundNum(dir string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), "round-"))
	return n
}

func (f *fleetdRun) timeline() *Timeline {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tl
}

// liveNodes are the fleet's nodes the daemon has running.
func (f *fleetdRun) liveNodes(ctx context.Context) ([]string, error) {
	det, err := f.client.Fleet(ctx, benchFleet)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range det.Nodes {
		if n.State == "running" {
			out = append(out, n.ID)
		}
	}
	sort.Strings(out)
	return out, nil
}

func (f *fleetdRun) victim(nodes []string) (string, error) {
	tl := f.timeline()
	for _, n := range nodes {
		if in, ok := tl.Current(n); ok && in.Rank != 0 {
			return n, nil
		}
	}
	return "", fmt.Errorf("no fleetd node other than rank 0's among %v", nodes)
}

func (f *fleetdRun) session(node string) (int, error) {
	for _, in := range f.instances() {
		if in.Tags[providers.TagNodeID] == node && in.PID > 0 {
			return in.PID, nil
		}
	}
	return 0, fmt.Errorf("no local instance for node %s", node)
}

// waitNodes waits until n nodes are running and training at world size n.
func (f *fleetdRun) waitNodes(ctx context.Context, n int, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		nodes, err := f.liveNodes(ctx)
		if err == nil && len(nodes) == n && f.timeline().Steady(nodes, n, 3*time.Second, time.Now()) {
			return nodes, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d nodes not training at world size %d within %s (running: %v, err %v)", n, n, timeout, nodes, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// joinedAfter waits for a rendezvous join of a node not in known, at or
// after since, from the daemon's event log.
func (f *fleetdRun) joinedAfter(ctx context.Context, known []string, since time.Time, timeout time.Duration) (string, time.Time, error) {
	deadline := time.Now().Add(timeout)
	isKnown := map[string]bool{}
	for _, n := range known {
		isKnown[n] = true
	}
	var from uint64
	for time.Now().Before(deadline) {
		resp, err := f.client.Events(ctx, from, 0, 0)
		if err == nil {
			for _, e := range resp.Events {
				if e.Type == "rendezvous.member_joined" && !isKnown[e.Node] && !e.Time.Before(since) {
					return e.Node, e.Time, nil
				}
			}
			from = resp.Next
		}
		select {
		case <-ctx.Done():
			return "", time.Time{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return "", time.Time{}, fmt.Errorf("no new node joined the rendezvous within %s", timeout)
}

// run plays the three scenarios.
func (f *fleetdRun) run(ctx context.Context) (map[string]result, error) {
	res := map[string]result{}
	defer f.stop()
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := f.start(fctx); err != nil {
		return res, err
	}
	say("fleetd: dev daemon up, fleet applied (3 local nodes)")
	nodes, err := f.waitNodes(ctx, 3, f.cfg.startTimeout)
	if err != nil {
		return res, err
	}

	// 1. A node killed without notice.
	v, err := f.victim(nodes)
	if err != nil {
		return res, err
	}
	sid, err := f.session(v)
	if err != nil {
		return res, err
	}
	survivors := without(nodes, v)
	t0 := time.Now()
	killed := procs.KillSession(sid)
	say("fleetd: killed node %s (SIGKILL to its %d processes)", v, killed)
	res[scenKill] = measure(ctx, "fleetd", scenKill, f.timeline, survivors, t0, 0, f.cfg.scenarioTimeout)
	f.explain(ctx, scenKill, t0, res[scenKill])

	// 3. A node added: the replacement fleetd launched for the lost node,
	// timed from its agent process's start (as torchrun's), which warms
	// its interpreters before it joins; from the join too, for information.
	added, joinAt, err := f.joinedAfter(ctx, nodes, t0, 2*time.Minute)
	if err != nil {
		return res, err
	}
	in, err := devd.Find(f.stateDir(), added)
	if err != nil {
		return res, err
	}
	started, err := in.AgentStarted()
	if err != nil {
		return res, fmt.Errorf("%s: %w", added, err)
	}
	say("fleetd: replacement %s joined the rendezvous %.2fs after the kill, %.2fs after its agent started", added,
		joinAt.Sub(t0).Seconds(), joinAt.Sub(started).Seconds())
	all := append(append([]string(nil), survivors...), added)
	r := measure(ctx, "fleetd", scenAdd, f.timeline, all, joinAt, 3, f.cfg.scenarioTimeout)
	r.fromEarlier(joinAt.Sub(started), "from_rendezvous_join")
	res[scenAdd] = r
	f.explain(ctx, scenAdd, joinAt, res[scenAdd])
	if nodes, err = f.waitNodes(ctx, 3, f.cfg.scenarioTimeout); err != nil {
		return res, err
	}

	// 2. A spot notice, injected into the node's metadata service (the
	// agent sees it there, like on EC2) with the notice lead of the run.
	v, err = f.victim(nodes)
	if err != nil {
		return res, err
	}
	survivors = without(nodes, v)
	t0 = time.Now()
	err = f.client.Do(ctx, http.MethodPost, "/v1/fleets/"+benchFleet+"/nodes/"+v+"/interrupt", nil,
		api.InterruptRequest{Kind: "spot-interruption", Lead: f.cfg.lead}, nil)
	if err != nil {
		return res, fmt.Errorf("interrupt %s: %w", v, err)
	}
	say("fleetd: spot notice injected on node %s (deadline in %s)", v, f.cfg.lead)
	r = measure(ctx, "fleetd", scenNotice, f.timeline, survivors, t0, 0, f.cfg.scenarioTimeout)
	if r.missing == "" {
		// negative: the survivors trained again before the node died
		r.extra["from_node_death"] = r.seconds() - f.cfg.lead.Seconds()
	}
	res[scenNotice] = r
	f.explain(ctx, scenNotice, t0, res[scenNotice])

	// 4. A node that goes silent (SIGSTOP to its session): the daemon
	// learns of it only when its heartbeats stop for dead_after. The
	// notice's replacement first makes three nodes again.
	if nodes, err = f.waitNodes(ctx, 3, f.cfg.lead+f.cfg.scenarioTimeout); err != nil {
		return res, err
	}
	if v, err = f.victim(nodes); err != nil {
		return res, err
	}
	if sid, err = f.session(v); err != nil {
		return res, err
	}
	survivors = without(nodes, v)
	t0 = time.Now()
	say("fleetd: node %s silenced (SIGSTOP to its %d processes)", v, f.frozen.Stop(sid))
	res[scenKillSilent] = measure(ctx, "fleetd", scenKillSilent, f.timeline, survivors, t0, 0, f.cfg.scenarioTimeout)
	f.explain(ctx, scenKillSilent, t0, res[scenKillSilent])
	return res, nil
}

// explain prints the daemon's events (notices, node transitions,
// rendezvous rounds) and the worker starts around a recovery.
func (f *fleetdRun) explain(ctx context.Context, scen string, t0 time.Time, r result) {
	var notes []note
	var from uint64
	for range 100 { // bounded: 100 pages of events
		resp, err := f.client.Events(ctx, from, 500, 0)
		if err != nil || len(resp.Events) == 0 {
			break
		}
		for _, e := range resp.Events {
			switch {
			case e.Type == "notice", e.Type == "node.transition", strings.HasPrefix(e.Type, "rendezvous."):
				notes = append(notes, note{e.Time, "daemon event " + e.Type + ": " + e.Message})
			}
		}
		from = resp.Next
	}
	for _, in := range f.instances() {
		notes = append(notes, agentNotes(in.Tags[providers.TagNodeID], in.AgentLog())...)
	}
	explain("fleetd", scen, t0, r, f.timeline(), notes)
}

// agentExplains are the agent log lines that explain a restart, with the
// attributes shown: old workers stopped, new ones started (warm or cold),
// the master's store up, the other nodes' wait for it, a new node's join.
var agentExplains = []struct {
	msg   string
	attrs []string
}{
	{"workers stopped", []string{"round", "took", "sigkilled"}},
	{"worker started", []string{"round", "rank", "warm", "warm_ready"}},
	{"the master's store listens", []string{"round", "after"}},
	{"waited for the master's store", []string{"round", "waited", "reason"}},
	{"warm interpreters ready; joining the rendezvous", []string{"waited"}},
}

// agentNotes reads one node's agent log (JSON lines) for agentExplains.
func agentNotes(node, file string) []note {
	fh, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer fh.Close()
	var out []note
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(l["time"]))
		if err != nil {
			continue
		}
		for _, x := range agentExplains {
			if l["msg"] != x.msg {
				continue
			}
			var kv []string
			for _, a := range x.attrs {
				if v, ok := l[a]; ok {
					kv = append(kv, fmt.Sprintf("%s=%v", a, v))
				}
			}
			out = append(out, note{at, fmt.Sprintf("agent %s: %s (%s)", node, x.msg, strings.Join(kv, " "))})
		}
	}
	return out
}
