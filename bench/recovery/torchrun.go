package main

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
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
	tl       *Timeline
	agent    driver.Agent
	nodes    *driver.Torchrun
}

func newTorchrun(cfg config, defaults bool, dir string) (*torchrun, error) {
	t := &torchrun{cfg: cfg, defaults: defaults, dir: dir, tl: NewTimeline()}
	t.agent = driver.Agent{Defaults: defaults, Launcher: cfg.keepAliveLauncher, Script: cfg.script, Train: cfg.trainArgs, Dir: dir}
	nodes, err := driver.NewTorchrun(driver.TorchrunConfig{Python: cfg.python, Dir: dir, Argv: t.agent.Argv, Line: t.tl.Add})
	t.nodes = nodes
	return t, err
}

// setDir sets where the nodes' logs and the checkpoint go.
func (t *torchrun) setDir(dir string) {
	t.dir, t.agent.Dir = dir, dir
	t.nodes.SetDir(dir)
}

// name is the system's name in figures.
func (t *torchrun) name() string {
	if t.defaults {
		return sysTorchrunDefaults
	}
	return sysTorchrun
}

func (t *torchrun) timeline() *Timeline { return t.tl }

// victim picks a live node that is neither the store host nor the rank-0
// worker's node (the fair case; see docs/benchmarks.md).
func (t *torchrun) victim() (string, error) {
	for _, n := range t.nodes.Live() {
		in, ok := t.tl.Current(n)
		if n != driver.TorchrunHost && ok && in.Rank != 0 {
			return n, nil
		}
	}
	return "", fmt.Errorf("no torchrun node other than the store host and rank 0 among %v", t.nodes.Live())
}

// run plays the scenarios and returns their results.
func (t *torchrun) run(ctx context.Context) (map[string]result, error) {
	res := map[string]result{}
	defer t.nodes.Stop()
	sys := t.name()
	for _, n := range []string{"A", "B", "C"} {
		if err := t.nodes.Start(n); err != nil {
			return res, err
		}
	}
	say("%s: 3 agents started (c10d store on node A, 127.0.0.1:%d)", sys, t.nodes.Port())
	if err := waitSteady(ctx, t.timeline, t.nodes.Live(), 3, 3*time.Second, t.cfg.startTimeout); err != nil {
		return res, fmt.Errorf("%s never trained at world size 3: %w", sys, err)
	}

	// 1. A node killed without notice.
	v, err := t.victim()
	if err != nil {
		return res, err
	}
	survivors := driver.Without(t.nodes.Live(), v)
	t0 := time.Now()
	if err := t.nodes.Kill(v); err != nil {
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
	survivors = driver.Without(t.nodes.Live(), v)
	notice := time.Now()
	say("%s: spot notice for node %s (torchrun cannot act on it; the node dies in %s)", sys, v, t.cfg.lead)
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(t.cfg.lead):
	}
	death := time.Now()
	if err := t.nodes.Kill(v); err != nil {
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
	survivors = driver.Without(t.nodes.Live(), v)
	t0 = time.Now()
	stopped := t.nodes.Silence(v)
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
	if err := t.nodes.Start(name); err != nil {
		return result{missing: err.Error()}, err
	}
	joinAt, err := t.nodes.WaitRendezvous(ctx, name, started, time.Minute)
	if err != nil {
		return result{missing: err.Error()}, err
	}
	say("%s: node %s entered the rendezvous %.2fs after its start", sys, name, joinAt.Sub(started).Seconds())
	all := t.nodes.Live()
	r := measure(ctx, sys, scenAdd, t.timeline, all, joinAt, 3, t.cfg.scenarioTimeout)
	r.fromEarlier(joinAt.Sub(started), "from_rendezvous_join")
	t.explain(scenAdd, joinAt, r)
	if err := waitSteady(ctx, t.timeline, all, 3, 2*time.Second, t.cfg.scenarioTimeout); err != nil {
		return r, fmt.Errorf("%s not steady at world size 3 after adding %s: %w", sys, name, err)
	}
	return r, nil
}

func (t *torchrun) explain(scen string, t0 time.Time, r result) {
	explain(t.name(), scen, t0, r, t.tl, t.nodes.Notes())
}
