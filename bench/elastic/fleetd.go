package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
)

// fleetdRun runs the job under the dev daemon (driver.FleetdJob) in
// restart mode or in-process mode, with fleetd's defaults for everything
// that affects recovery (rendezvous last_call 5 s, heartbeat 2 s,
// dead_after 10 s).
type fleetdRun struct {
	*driver.FleetdJob[*Timeline]
	cfg  config
	mode string // "restart" or "in-process"
}

func newFleetd(cfg config, mode, dir string) *fleetdRun {
	return &fleetdRun{FleetdJob: driver.NewFleetdJob(cfg.Config, dir, NewTimeline), cfg: cfg, mode: mode}
}

func (f *fleetdRun) name() string {
	return "fleetd " + f.mode
}

func (f *fleetdRun) start(ctx context.Context) error {
	if err := f.Start(ctx, f.cfg.Spec(f.Dir, "127.0.78.", f.mode, f.cfg.trainArgs)); err != nil {
		return err
	}
	say("%s: dev daemon up, fleet applied (3 local nodes, elastic = %q)", f.name(), f.mode)
	return nil
}

func (f *fleetdRun) stop() { f.Stop() }

func (f *fleetdRun) timeline() *Timeline { return f.Timeline() }

func (f *fleetdRun) live() []string {
	out, _ := f.D.Running(context.Background())
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
	_, err := f.D.Kill(node)
	return err
}

// add waits for the replacement the daemon launched for the lost node to
// join the rendezvous (the daemon's member_joined event).
func (f *fleetdRun) add(ctx context.Context, since time.Time) (string, time.Time, time.Time, error) {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, e := range f.D.Events(ctx) {
			if e.Type == "rendezvous.member_joined" && !e.Time.Before(since) {
				in, err := f.D.Find(e.Node)
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
func (f *fleetdRun) silence(node string) int { return f.D.Silence(node) }

// notice injects a spot notice into the node's metadata service; known
// is when the daemon had it (its notice event).
func (f *fleetdRun) notice(ctx context.Context, node string) (time.Time, time.Time, error) {
	t0 := time.Now()
	if err := f.D.Interrupt(ctx, node, f.cfg.Lead); err != nil {
		return time.Time{}, time.Time{}, err
	}
	say("%s: spot notice injected on node %s (deadline in %s)", f.name(), node, f.cfg.Lead)
	return time.Time{}, f.lossKnown(node, t0), nil
}

// lossKnown is when the daemon learned of the node's notice or loss
// after since (its notice event), waiting a little for it.
func (f *fleetdRun) lossKnown(node string, since time.Time) time.Time {
	for range 100 {
		for _, e := range f.D.Events(context.Background()) {
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
	return driver.Between(f.D.Notes(context.Background(), agentExplains), from, to)
}
