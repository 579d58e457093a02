package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
)

// torchrun runs the job under torchrun (driver.TorchrunJob), at fleetd's
// timeouts ("torchrun", the headline) or at torchrun's defaults
// ("torchrun-defaults"); nodes are named A, B, C, … in start order.
type torchrun struct {
	*driver.TorchrunJob[*Timeline]
	cfg  config
	mu   sync.Mutex
	next byte
}

func newTorchrun(cfg config, defaults bool, dir string) (*torchrun, error) {
	job, err := driver.NewTorchrunJob(cfg.Config, defaults, dir, cfg.trainArgs, NewTimeline())
	return &torchrun{TorchrunJob: job, cfg: cfg, next: 'A'}, err
}

func (t *torchrun) name() string {
	if t.Defaults {
		return sysTorchrunDefaults
	}
	return sysTorchrun
}

func (t *torchrun) timeline() *Timeline { return t.TL }

// startNode starts the next node (A, B, C, …).
func (t *torchrun) startNode() (string, error) {
	t.mu.Lock()
	name := string(t.next)
	t.next++
	t.mu.Unlock()
	return name, t.Nodes.Start(name)
}

func (t *torchrun) start(ctx context.Context) error {
	for range 3 {
		if _, err := t.startNode(); err != nil {
			return err
		}
	}
	say("torchrun: 3 agents started (c10d store on node A, 127.0.0.1:%d)", t.Nodes.Port())
	return nil
}

func (t *torchrun) live() []string { return t.Nodes.Live() }

func (t *torchrun) victim() (string, error) {
	for _, n := range t.live() {
		if r, ok := t.TL.Rank(n); n != driver.TorchrunHost && ok && r != 0 {
			return n, nil
		}
	}
	return "", fmt.Errorf("no torchrun node other than the store host and rank 0 among %v", t.live())
}

func (t *torchrun) kill(name string) error { return t.Nodes.Kill(name) }

// add starts a fourth agent; the join is its entering the rendezvous.
func (t *torchrun) add(ctx context.Context, since time.Time) (string, time.Time, time.Time, error) {
	started := time.Now()
	name, err := t.startNode()
	if err != nil {
		return "", time.Time{}, time.Time{}, err
	}
	at, err := t.Nodes.WaitRendezvous(ctx, name, since, 2*time.Minute)
	if err != nil {
		return "", time.Time{}, time.Time{}, err
	}
	return name, at, started, nil
}

// silence stops every process of the node's session (SIGSTOP); stop kills it.
func (t *torchrun) silence(name string) int { return t.Nodes.Silence(name) }

// notice: torchrun has nothing that reads a notice; the node dies at the
// deadline.
func (t *torchrun) notice(ctx context.Context, node string) (time.Time, time.Time, error) {
	say("torchrun: spot notice for node %s (torchrun cannot act on it; the node dies in %s)", node, t.cfg.Lead)
	select {
	case <-ctx.Done():
		return time.Time{}, time.Time{}, ctx.Err()
	case <-time.After(t.cfg.Lead):
	}
	death := time.Now()
	return death, time.Time{}, t.kill(node)
}

func (t *torchrun) lossKnown(node string, since time.Time) time.Time { return time.Time{} }

func (t *torchrun) notes(from, to time.Time) []note { return driver.Between(t.Nodes.Notes(), from, to) }

func (t *torchrun) stop() { t.Nodes.Stop() }
