package main

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
)

// torchrun runs the job under torchrun (driver.TorchrunJob): nodes A, B,
// C, at fleetd's timeouts (the headline) or at torchrun's defaults. The
// workers' collective timeout is the training script's, the same under
// fleetd.
type torchrun struct {
	*driver.TorchrunJob[*Timeline]
	cfg config
}

func newTorchrun(cfg config, defaults bool, dir string) (*torchrun, error) {
	job, err := driver.NewTorchrunJob(cfg.Config, defaults, dir, cfg.trainArgs, NewTimeline())
	return &torchrun{TorchrunJob: job, cfg: cfg}, err
}

// name is the system's name in figures.
func (t *torchrun) name() string {
	if t.Defaults {
		return sysTorchrunDefaults
	}
	return sysTorchrun
}

func (t *torchrun) timeline() *Timeline { return t.TL }

// victim picks a live node that is neither the store host nor the rank-0
// worker's node (the fair case; see docs/benchmarks.md).
func (t *torchrun) victim() (string, error) {
	for _, n := range t.Nodes.Live() {
		in, ok := t.TL.Current(n)
		if n != driver.TorchrunHost && ok && in.Rank != 0 {
			return n, nil
		}
	}
	return "", fmt.Errorf("no torchrun node other than the store host and rank 0 among %v", t.Nodes.Live())
}

// run plays the scenarios and returns their results.
func (t *torchrun) run(ctx context.Context) (map[string]result, error) {
	res := map[string]result{}
	defer t.Nodes.Stop()
	sys := t.name()
	for _, n := range []string{"A", "B", "C"} {
		if err := t.Nodes.Start(n); err != nil {
			return res, err
		}
	}
	say("%s: 3 agents started (c10d store on node A, 127.0.0.1:%d)", sys, t.Nodes.Port())
	if err := waitSteady(ctx, t.timeline, t.Nodes.Live(), 3, 3*time.Second, t.cfg.StartTimeout); err != nil {
		return res, fmt.Errorf("%s never trained at world size 3: %w", sys, err)
	}

	// 1. A node killed without notice.
	v, err := t.victim()
	if err != nil {
		return res, err
	}
	survivors := driver.Without(t.Nodes.Live(), v)
	t0 := time.Now()
	if err := t.Nodes.Kill(v); err != nil {
		return res, err
	}
	say("%s: killed node %s (SIGKILL to its session)", sys, v)
	res[driver.ScenKill] = measure(ctx, sys, driver.ScenKill, t.timeline, survivors, t0, 0, t.cfg.ScenarioTimeout)
	t.explain(driver.ScenKill, t0, res[driver.ScenKill])
	if err := waitSteady(ctx, t.timeline, survivors, 2, 2*time.Second, t.cfg.ScenarioTimeout); err != nil {
		return res, fmt.Errorf("%s survivors not steady at world size 2: %w", sys, err)
	}

	// 2. A node added, timed from its agent's process start as fleetd's
	// is (from the rendezvous entry too, for information).
	r, err := t.addNode(ctx, "D")
	res[driver.ScenAdd] = r
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
	survivors = driver.Without(t.Nodes.Live(), v)
	notice := time.Now()
	say("%s: spot notice for node %s (torchrun cannot act on it; the node dies in %s)", sys, v, t.cfg.Lead)
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(t.cfg.Lead):
	}
	death := time.Now()
	if err := t.Nodes.Kill(v); err != nil {
		return res, err
	}
	say("%s: node %s reclaimed at the notice deadline", sys, v)
	r = measure(ctx, sys, driver.ScenNotice, t.timeline, survivors, death, 0, t.cfg.ScenarioTimeout)
	if r.missing == "" {
		r.extra["from_notice"] = r.seconds() + death.Sub(notice).Seconds()
	}
	res[driver.ScenNotice] = r
	t.explain(driver.ScenNotice, death, r)
	if err := waitSteady(ctx, t.timeline, survivors, 2, 2*time.Second, t.cfg.ScenarioTimeout); err != nil {
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
	survivors = driver.Without(t.Nodes.Live(), v)
	t0 = time.Now()
	stopped := t.Nodes.Silence(v)
	say("%s: node %s silenced (SIGSTOP to its %d processes)", sys, v, stopped)
	res[driver.ScenKillSilent] = measure(ctx, sys, driver.ScenKillSilent, t.timeline, survivors, t0, 0, t.cfg.ScenarioTimeout)
	t.explain(driver.ScenKillSilent, t0, res[driver.ScenKillSilent])
	return res, nil
}

// addNode starts a torchrun agent and measures until all live nodes train
// at world size 3, from the agent process's start (the headline, the same
// event as fleetd's agent start) and from its entering the rendezvous.
func (t *torchrun) addNode(ctx context.Context, name string) (result, error) {
	sys := t.name()
	started := time.Now()
	if err := t.Nodes.Start(name); err != nil {
		return result{missing: err.Error()}, err
	}
	joinAt, err := t.Nodes.WaitRendezvous(ctx, name, started, time.Minute)
	if err != nil {
		return result{missing: err.Error()}, err
	}
	say("%s: node %s entered the rendezvous %.2fs after its start", sys, name, joinAt.Sub(started).Seconds())
	all := t.Nodes.Live()
	r := measure(ctx, sys, driver.ScenAdd, t.timeline, all, joinAt, 3, t.cfg.ScenarioTimeout)
	r.fromEarlier(joinAt.Sub(started), "from_rendezvous_join")
	t.explain(driver.ScenAdd, joinAt, r)
	if err := waitSteady(ctx, t.timeline, all, 3, 2*time.Second, t.cfg.ScenarioTimeout); err != nil {
		return r, fmt.Errorf("%s not steady at world size 3 after adding %s: %w", sys, name, err)
	}
	return r, nil
}

func (t *torchrun) explain(scen string, t0 time.Time, r result) {
	explain(t.name(), scen, t0, r, t.TL, t.Nodes.Notes())
}
