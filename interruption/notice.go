// Package interruption normalises every source of "this node is going
// away" (on-VM metadata, cloud event streams, provider polling, heartbeat
// loss) into one Notice type, so the daemon handles them all the same way
// and idempotently. Source-specific parsers and watchers live in
// sub-packages (imds, ...); this package holds only the shared vocabulary.
package interruption

import (
	"context"
	"fmt"
	"time"
)

// Kind is what is about to happen (or has happened) to a node.
type Kind string

const (
	// SpotInterruption: the cloud reclaims a spot instance at Deadline
	// (AWS instance-action, EventBridge ITN).
	SpotInterruption Kind = "spot-interruption"
	// Rebalance: advisory, the instance is at elevated risk of
	// interruption; it has no deadline.
	Rebalance Kind = "rebalance"
	// Maintenance: a scheduled event (reboot, retirement, stop) starts at
	// Deadline. GPU instances do not live-migrate, so it ends the node.
	Maintenance Kind = "maintenance"
	// Preempted: GCE preemption; the VM is stopped about 30 s later.
	Preempted Kind = "preempted"
	// Lost: the node vanished without notice (provider polling, heartbeat loss).
	Lost Kind = "lost"
)

var kinds = []Kind{SpotInterruption, Rebalance, Maintenance, Preempted, Lost}

// Kinds returns every known kind, in a stable order.
func Kinds() []Kind { return append([]Kind(nil), kinds...) }

// Valid reports whether k is one of the known kinds.
func (k Kind) Valid() bool {
	for _, x := range kinds {
		if k == x {
			return true
		}
	}
	return false
}

// Terminal reports whether the kind ends the node (everything but an
// advisory rebalance recommendation), i.e. whether it calls for a drain.
func (k Kind) Terminal() bool { return k.Valid() && k != Rebalance }

// ParseKind parses a kind name.
func ParseKind(s string) (Kind, error) {
	k := Kind(s)
	if !k.Valid() {
		return "", fmt.Errorf("unknown interruption kind %q (want one of %v)", s, kinds)
	}
	return k, nil
}

// Notice is one normalised interruption notice.
type Notice struct {
	// Node is fleetd's node id; empty when the source only knows the
	// instance (e.g. an EventBridge event before the daemon maps it).
	Node string `json:"node,omitempty"`
	// Instance is the provider's instance id, when known.
	Instance string `json:"instance,omitempty"`
	Kind     Kind   `json:"kind"`
	// Deadline is when the node is expected to be gone; zero means no
	// known deadline (rebalance recommendations, losses already happened).
	Deadline time.Time `json:"deadline,omitzero"`
	// Source names the channel the notice came from, e.g. "aws-imds".
	Source string `json:"source"`
	// Detail is free text from the source (action, event code, description).
	Detail string `json:"detail,omitempty"`
	// ID is the source's own identity of the event, stable across polls of
	// the same event (used by watchers to emit each event once).
	ID string `json:"id,omitempty"`
}

// Key identifies the notice for idempotent handling: the same kind of
// notice for the same node is one notice, whichever source reported it
// first (agent IMDS, SQS, provider polling all race for the same loss).
// When the node is not yet known the instance id stands in for it.
func (n Notice) Key() string {
	who := n.Node
	if who == "" {
		who = "instance:" + n.Instance
	}
	return who + "/" + string(n.Kind)
}

// Validate checks the fields every consumer relies on.
func (n Notice) Validate() error {
	if !n.Kind.Valid() {
		return fmt.Errorf("notice: unknown kind %q", n.Kind)
	}
	if n.Node == "" && n.Instance == "" {
		return fmt.Errorf("notice: neither node nor instance is set")
	}
	if n.Source == "" {
		return fmt.Errorf("notice: source is not set")
	}
	return nil
}

// PollEvery is a polling watcher's loop: it polls at once and then on
// every tick until ctx is done, handing each poll's notices to emit and its
// error (unless ctx ended the poll) to onError, when set. Both run on the
// caller's goroutine. It returns nil when ctx is done.
func PollEvery(ctx context.Context, tick <-chan time.Time, poll func(context.Context) ([]Notice, error), emit func(Notice), onError func(error)) error {
	for {
		notices, err := poll(ctx)
		for _, n := range notices {
			emit(n)
		}
		if err != nil && ctx.Err() == nil && onError != nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
		}
	}
}
