package main

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
)

// fleetdRun runs the same job under the dev daemon (driver.FleetdJob):
// every node is a real agent process tree (its own session, address and
// metadata emulator) booted from the daemon's cloud-init user-data. The
// fleet spec uses fleetd's defaults for everything that affects recovery
// (rendezvous last_call 5 s, heartbeat 2 s, dead_after 10 s; reconcile
// tick 2 s).
type fleetdRun struct {
	*driver.FleetdJob[*Timeline]
	cfg config
}

func newFleetd(cfg config, dir string) *fleetdRun {
	return &fleetdRun{FleetdJob: driver.NewFleetdJob(cfg.Config, dir, NewTimeline), cfg: cfg}
}

// spec is the fleet (driver.Spec), the same worker command as under
// torchrun.
func (f *fleetdRun) spec() driver.Spec { return f.cfg.Spec(f.Dir, "127.0.77.", "", f.cfg.trainArgs) }

func (f *fleetdRun) timeline() *Timeline { return f.Timeline() }

func (f *fleetdRun) victim(nodes []string) (string, error) {
	tl := f.timeline()
	for _, n := range nodes {
		if in, ok := tl.Current(n); ok && in.Rank != 0 {
			return n, nil
		}
	}
	return "", fmt.Errorf("no fleetd node other than rank 0's among %v", nodes)
}

// waitNodes waits until n nodes are running and training at world size n.
func (f *fleetdRun) waitNodes(ctx context.Context, n int, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		nodes, err := f.D.Running(ctx)
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
		resp, err := f.D.Client.Events(ctx, from, 0, 0)
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
	defer f.Stop()
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := f.Start(fctx, f.spec()); err != nil {
		return res, err
	}
	say("fleetd: dev daemon up, fleet applied (3 local nodes)")
	nodes, err := f.waitNodes(ctx, 3, f.cfg.StartTimeout)
	if err != nil {
		return res, err
	}

	// 1. A node killed without notice.
	v, err := f.victim(nodes)
	if err != nil {
		return res, err
	}
	survivors := driver.Without(nodes, v)
	t0 := time.Now()
	killed, err := f.D.Kill(v)
	if err != nil {
		return res, err
	}
	say("fleetd: killed node %s (SIGKILL to its %d processes)", v, killed)
	res[driver.ScenKill] = measure(ctx, "fleetd", driver.ScenKill, f.timeline, survivors, t0, 0, f.cfg.ScenarioTimeout)
	f.explain(ctx, driver.ScenKill, t0, res[driver.ScenKill])

	// 3. A node added: the replacement fleetd launched for the lost node,
	// timed from its agent process's start (as torchrun's), which warms
	// its interpreters before it joins; from the join too, for information.
	added, joinAt, err := f.joinedAfter(ctx, nodes, t0, 2*time.Minute)
	if err != nil {
		return res, err
	}
	in, err := f.D.Find(added)
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
	r := measure(ctx, "fleetd", driver.ScenAdd, f.timeline, all, joinAt, 3, f.cfg.ScenarioTimeout)
	r.fromEarlier(joinAt.Sub(started), "from_rendezvous_join")
	res[driver.ScenAdd] = r
	f.explain(ctx, driver.ScenAdd, joinAt, res[driver.ScenAdd])
	if nodes, err = f.waitNodes(ctx, 3, f.cfg.ScenarioTimeout); err != nil {
		return res, err
	}

	// 2. A spot notice, injected into the node's metadata service (the
	// agent sees it there, like on EC2) with the notice lead of the run.
	v, err = f.victim(nodes)
	if err != nil {
		return res, err
	}
	survivors = driver.Without(nodes, v)
	t0 = time.Now()
	if err := f.D.Interrupt(ctx, v, f.cfg.Lead); err != nil {
		return res, err
	}
	say("fleetd: spot notice injected on node %s (deadline in %s)", v, f.cfg.Lead)
	r = measure(ctx, "fleetd", driver.ScenNotice, f.timeline, survivors, t0, 0, f.cfg.ScenarioTimeout)
	if r.missing == "" {
		// negative: the survivors trained again before the node died
		r.extra["from_node_death"] = r.seconds() - f.cfg.Lead.Seconds()
	}
	res[driver.ScenNotice] = r
	f.explain(ctx, driver.ScenNotice, t0, res[driver.ScenNotice])

	// 4. A node that goes silent (SIGSTOP to its session): the daemon
	// learns of it only when its heartbeats stop for dead_after. The
	// notice's replacement first makes three nodes again.
	if nodes, err = f.waitNodes(ctx, 3, f.cfg.Lead+f.cfg.ScenarioTimeout); err != nil {
		return res, err
	}
	if v, err = f.victim(nodes); err != nil {
		return res, err
	}
	if _, err = f.D.Session(v); err != nil {
		return res, err
	}
	survivors = driver.Without(nodes, v)
	t0 = time.Now()
	say("fleetd: node %s silenced (SIGSTOP to its %d processes)", v, f.D.Silence(v))
	res[driver.ScenKillSilent] = measure(ctx, "fleetd", driver.ScenKillSilent, f.timeline, survivors, t0, 0, f.cfg.ScenarioTimeout)
	f.explain(ctx, driver.ScenKillSilent, t0, res[driver.ScenKillSilent])
	return res, nil
}

// explain prints the daemon's events (notices, node transitions,
// rendezvous rounds), the agents' log lines and the worker starts around a
// recovery.
func (f *fleetdRun) explain(ctx context.Context, scen string, t0 time.Time, r result) {
	explain("fleetd", scen, t0, r, f.timeline(), f.D.Notes(ctx, agentExplains))
}

// agentExplains are the agent log lines that explain a restart, with the
// attributes shown: old workers stopped, new ones started (warm or cold),
// the master's store up, the other nodes' wait for it, a new node's join.
var agentExplains = []driver.Explain{
	{Msg: "workers stopped", Attrs: []string{"round", "took", "sigkilled"}},
	{Msg: "worker started", Attrs: []string{"round", "rank", "warm", "warm_ready"}},
	{Msg: "the master's store listens", Attrs: []string{"round", "after"}},
	{Msg: "waited for the master's store", Attrs: []string{"round", "waited", "reason"}},
	{Msg: "warm interpreters ready; joining the rendezvous", Attrs: []string{"waited"}},
}
