package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/rendezvous"
)

// HandleNotice takes an interruption notice from any source (agents,
// provider polling, queues, heartbeat loss). Notices are idempotent by
// node+kind; the first one excludes the node from the next rendezvous
// round at once (survivors restart before it dies) and asks for a pass,
// which drains the node and launches its replacement.
func (c *Controller) HandleNotice(ctx context.Context, fleetName string, n interruption.Notice) error {
	if err := n.Validate(); err != nil {
		return err
	}
	node, err := state.Read(ctx, c.store, func(tx state.Tx) (state.Node, error) { return tx.Node(fleetName, n.Node) })
	if err != nil {
		return fmt.Errorf("notice for %s/%s: %w", fleetName, n.Node, err)
	}
	if n.Instance == "" {
		n.Instance = node.InstanceID
	}
	rt := c.runtime(fleetName)
	rt.mu.Lock()
	_, dup := rt.notices[n.Key()]
	if !dup {
		rt.notices[n.Key()] = n
	}
	rt.mu.Unlock()
	if dup {
		return nil
	}
	if n.Kind.Terminal() {
		c.opts.Recorder.Notice(fleetName, c.now())
	}
	msg := fmt.Sprintf("%s notice for %s from %s", n.Kind, n.Node, n.Source)
	if !n.Deadline.IsZero() {
		msg += fmt.Sprintf(", deadline in %s", n.Deadline.Sub(c.now()).Round(time.Second))
	}
	// Batched: a storm's concurrent notices share one transaction and one
	// fsync instead of queueing behind each other's.
	c.appendEvent(ctx, state.Event{Fleet: fleetName, Node: n.Node, Type: "notice", Message: msg,
		Data: map[string]string{"kind": string(n.Kind), "source": n.Source}})
	if rz := c.rz(); n.Kind.Terminal() && rz != nil {
		// The deadline travels with the round change: every node's workers
		// bound their checkpoint by it (docs/agent.md, "Checkpoint on notice").
		if err := rz.ExcludeUntil(ctx, fleetName, n.Node, string(n.Kind)+" notice", n.Deadline); err != nil && !errors.Is(err, rendezvous.ErrUnknownFleet) {
			c.log.Warn("rendezvous exclude", "fleet", fleetName, "node", n.Node, "err", err)
		}
	}
	c.Kick()
	return nil
}
