package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
)

// fleetdRun runs the job under a real `fleetd serve -dev` with the
// embedded local provider (driver.Fleetd: every node a real agent process
// tree in a session of its own, booted from the daemon's user-data), in
// restart mode or in-process mode, with fleetd's defaults for everything
// that affects recovery (rendezvous last_call 5 s, heartbeat 2 s,
// dead_after 10 s).
type fleetdRun struct {
	cfg  config
	mode string // "restart" or "in-process"
	dir  string
	d    *driver.Fleetd

	tl driver.Latest[*Timeline]
}

func newFleetd(cfg config, mode, dir string) *fleetdRun {
	f := &fleetdRun{cfg: cfg, mode: mode, dir: dir}
	f.tl.Set(NewTimeline())
	return f
}

func (f *fleetdRun) name() string {
	return "fleetd " + f.mode
}

// spec is the fleet (driver.Spec) in the run's elastic mode.
func (f *fleetdRun) spec() driver.Spec {
	return driver.Spec{StateDir: driver.StateDir(f.dir), AddressPrefix: "127.0.78.", Lead: f.cfg.lead, Elastic: f.mode,
		Command: append([]string{f.cfg.python, f.cfg.script}, f.cfg.trainArgs(filepath.Join(f.dir, "ckpt"))...)}
}

func (f *fleetdRun) start(ctx context.Context) error {
	d, err := driver.StartFleetd(ctx, f.cfg.fleetd, f.dir, f.spec())
	f.d = d
	if err != nil {
		return err
	}
	go driver.Follow(ctx, d, NewTimeline, f.tl.Set)
	say("%s: dev daemon up, fleet applied (3 local nodes, elastic = %q)", f.name(), f.mode)
	return nil
}

func (f *fleetdRun) stop() {
	if f.d != nil {
		f.d.Stop()
	}
}

func (f *fleetdRun) timeline() *Timeline { return f.tl.Get() }

func (f *fleetdRun) live() []string {
	out, _ := f.d.Running(context.Background())
	return out
}

func (f *fleetdRun) victim() (string, error) {
	for _, n := range f.live() {
		if r, ok := f.timeline().Rank(n); ok && r != 0 {
			return n, nil
		}
	}
	return "", fmt.Errorf("no fleetd node other than rank 0's among %v", f.live())
}

func (f *fleetdRun) kill(node string) error {
	_, err := f.d.Kill(node)
	return err
}

// add waits for the replacement the daemon launched for the lost node to
// join the rendezvous (the daemon's member_joined event).
func (f *fleetdRun) add(ctx context.Context, since time.Time) (string, time.Time, time.Time, error) {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, e := range f.d.Events(ctx) {
			if e.Type == "rendezvous.member_joined" && !e.Time.Before(since) {
				in, err := f.d.Find(e.Node)
				if err != nil {
					return "", time.Time{}, time.Time{}, err
				}
				started, err := in.AgentStarted()
				if err != nil {
					return "", time.Time{}, time.Time{}, fmt.Errorf("%s: %w", e.Node, err)
				}
				return e.Node, e.Time, started, nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return "", time.Time{}, time.Time{}, errors.New("no replacement joined the rendezvous")
}

// silence stops every process of the node's session (SIGSTOP); stop kills it.
func (f *fleetdRun) silence(node string) int { return f.d.Silence(node) }

// notice injects a spot notice into the node's metadata service; known
// is when the daemon had it (its notice event).
func (f *fleetdRun) notice(ctx context.Context, node string) (time.Time, time.Time, error) {
	t0 := time.Now()
	if err := f.d.Interrupt(ctx, node, f.cfg.lead); err != nil {
		return time.Time{}, time.Time{}, err
	}
	say("%s: spot notice injected on node %s (deadline in %s)", f.name(), node, f.cfg.lead)
	return time.Time{}, f.lossKnown(node, t0), nil
}

// lossKnown is when the daemon learned of the node's notice or loss
// after since (its notice event), waiting a little for it.
func (f *fleetdRun) lossKnown(node string, since time.Time) time.Time {
	for range 100 {
		for _, e := range f.d.Events(context.Background()) {
			if e.Type == "notice" && e.Node == node && !e.Time.Before(since) {
				return e.Time
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Time{}
}

// agentExplains are the agent log lines that explain a change.
var agentExplains = []driver.Explain{
	{Msg: "workers stopped", Attrs: []string{"round", "took", "sigkilled"}},
	{Msg: "workers checkpointed and stopped", Attrs: []string{"round", "took", "checkpoint_step"}},
	{Msg: "worker started", Attrs: []string{"round", "rank", "warm"}},
	{Msg: "the master's store listens", Attrs: []string{"round", "after"}},
	{Msg: "asking workers to checkpoint before they stop", Attrs: []string{"round", "bound"}},
	{Msg: "in-process: new round handed to the running workers", Attrs: []string{"round", "world_size", "took"}},
	{Msg: "in-process: asking the workers to leave the job", Attrs: []string{"round"}},
	{Msg: "in-process: the workers left the job", Attrs: []string{"round", "took"}},
	{Msg: "fleetd_elastic: worker agreed", Attrs: []string{"round", "step", "took"}},
	{Msg: "fleetd_elastic: worker joined", Attrs: []string{"round", "world_size", "step", "took"}},
	{Msg: "fleetd_elastic: worker synced", Attrs: []string{"round", "bytes", "seconds", "mib_per_s", "why"}},
	{Msg: "fleetd_elastic: worker collective-failed", Attrs: []string{"round", "step"}},
	{Msg: "fleetd_elastic: worker reconfigured", Attrs: []string{"round", "took"}},
}

func (f *fleetdRun) notes(from, to time.Time) []note {
	return driver.Between(f.d.Notes(context.Background(), agentExplains), from, to)
}
