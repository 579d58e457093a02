package rendezvous

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Config tunes one fleet's rendezvous. It mirrors the spec's min_nodes,
// max_nodes, training.master_port and rendezvous { } block.
type Config struct {
	MinNodes int // a round closes only with at least this many nodes
	MaxNodes int // a round closes at once when this many have joined
	// LastCall is how long an open round keeps collecting after MinNodes
	// joined, and how long joiners of a running job are batched.
	LastCall time.Duration
	// Heartbeat is the interval agents are told to heartbeat at.
	Heartbeat time.Duration
	// DeadAfter is the silence after which a member is dropped.
	DeadAfter time.Duration
	// MasterPort is the first of the MasterPortSpan ports MASTER_PORT
	// cycles through, one per round (RoundPort).
	MasterPort int
}

// MasterPortSpan is how many consecutive ports MASTER_PORT cycles through.
const MasterPortSpan = 8

// RoundPort is MASTER_PORT for a round: base, base+1, … base+7, then base
// again (shifted down by the span where it would pass 65535). A worker of
// an earlier round that is still alive (blocked in init_process_group,
// where SIGTERM waits, or not yet stopped by its agent) can neither reach
// the new round's store nor hold its port; with one fixed port it joined
// the new round's group (benchmarks, finding 2).
func RoundPort(base, round int) int {
	p := base + ((round-1)%MasterPortSpan+MasterPortSpan)%MasterPortSpan
	if p > 65535 {
		p -= MasterPortSpan
	}
	return p
}

// Validate reports the first inconsistency of c.
func (c Config) Validate() error {
	switch {
	case c.MinNodes < 1:
		return fmt.Errorf("min_nodes must be at least 1, got %d", c.MinNodes)
	case c.MaxNodes < c.MinNodes:
		return fmt.Errorf("max_nodes (%d) must be at least min_nodes (%d)", c.MaxNodes, c.MinNodes)
	case c.LastCall < 0:
		return fmt.Errorf("last_call must not be negative, got %s", c.LastCall)
	case c.Heartbeat <= 0:
		return fmt.Errorf("heartbeat must be positive, got %s", c.Heartbeat)
	case c.DeadAfter <= c.Heartbeat:
		return fmt.Errorf("dead_after (%s) must exceed heartbeat (%s)", c.DeadAfter, c.Heartbeat)
	case c.MasterPort < 1 || c.MasterPort > 65535:
		return fmt.Errorf("master_port must be in 1..65535, got %d", c.MasterPort)
	}
	return nil
}

// configJSON spells durations as Go duration strings: readable in status
// output, and Duration.String/ParseDuration round-trip exactly.
type configJSON struct {
	MinNodes   int    `json:"min_nodes"`
	MaxNodes   int    `json:"max_nodes"`
	LastCall   string `json:"last_call"`
	Heartbeat  string `json:"heartbeat"`
	DeadAfter  string `json:"dead_after"`
	MasterPort int    `json:"master_port"`
}

// MarshalJSON implements json.Marshaler.
func (c Config) MarshalJSON() ([]byte, error) {
	return json.Marshal(configJSON{
		MinNodes: c.MinNodes, MaxNodes: c.MaxNodes,
		LastCall: c.LastCall.String(), Heartbeat: c.Heartbeat.String(), DeadAfter: c.DeadAfter.String(),
		MasterPort: c.MasterPort,
	})
}

// UnmarshalJSON implements json.Unmarshaler.
func (c *Config) UnmarshalJSON(b []byte) error {
	var j configJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var out Config
	out.MinNodes, out.MaxNodes, out.MasterPort = j.MinNodes, j.MaxNodes, j.MasterPort
	var errs []error
	parse := func(name, s string, d *time.Duration) {
		v, err := time.ParseDuration(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		*d = v
	}
	parse("last_call", j.LastCall, &out.LastCall)
	parse("heartbeat", j.Heartbeat, &out.Heartbeat)
	parse("dead_after", j.DeadAfter, &out.DeadAfter)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	*c = out
	return nil
}
