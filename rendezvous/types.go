package rendezvous

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"
	"unicode"
)

// RoundState is the state of a fleet's current round.
type RoundState string

// Round states. A closed round is final: any membership change makes a new
// round number. Finished is the fleet's terminal state.
const (
	RoundOpen     RoundState = "open"     // collecting members; training paused
	RoundClosed   RoundState = "closed"   // assigned; the job runs at this membership
	RoundFinished RoundState = "finished" // the job is done; nothing changes any more
)

// NodeState is one node's view of the rendezvous: what its agent must do.
type NodeState string

// Node states.
const (
	NodeAssigned NodeState = "assigned" // in the current closed round: run workers with the Assignment
	NodeWaiting  NodeState = "waiting"  // in the current open round: workers stopped, wait for it to close
	NodeStandby  NodeState = "standby"  // live but outside the running round: wait for the next one
	NodeExcluded NodeState = "excluded" // draining after an interruption notice: stop and never rejoin
	NodeFinished NodeState = "finished" // the job is done: stop and exit
	NodeUnknown  NodeState = "unknown"  // not a member (dropped, or the daemon forgot it): join again
)

func (s NodeState) valid() bool {
	switch s {
	case NodeAssigned, NodeWaiting, NodeStandby, NodeExcluded, NodeFinished, NodeUnknown:
		return true
	}
	return false
}

// JoinRequest is what a node tells the rendezvous about itself.
type JoinRequest struct {
	NodeID string `json:"node_id"`
	// Addr is the IP the node's workers bind; it becomes MASTER_ADDR when
	// the node has group rank 0. An IP, never a hostname (DNS on cloud VMs
	// is the root of many torchrun hangs).
	Addr  string `json:"addr"`
	Zone  string `json:"zone,omitempty"`
	Nproc int    `json:"nproc"` // workers on this node (LOCAL_WORLD_SIZE)
	// Session is random per agent process. A join repeated with the same
	// session is a retry and changes nothing; a new session from a node of
	// the running round means the agent restarted and lost its workers,
	// so the round is re-formed.
	Session string `json:"session,omitempty"`
}

const (
	maxIDLen = 128
	maxNproc = 1024
)

func validID(s string) bool {
	if s == "" || len(s) > maxIDLen {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

func (r JoinRequest) node() string { return r.NodeID }

// Validate checks a join request.
func (r JoinRequest) Validate() error {
	if !validID(r.NodeID) {
		return fmt.Errorf("node_id must be 1..%d printable characters without spaces", maxIDLen)
	}
	a, err := netip.ParseAddr(r.Addr)
	if err != nil || a.IsUnspecified() || a.Zone() != "" {
		return fmt.Errorf("addr %q is not a usable IP address", r.Addr)
	}
	if r.Zone != "" && !validID(r.Zone) {
		return fmt.Errorf("zone must be at most %d printable characters without spaces", maxIDLen)
	}
	if r.Nproc < 1 || r.Nproc > maxNproc {
		return fmt.Errorf("nproc must be in 1..%d, got %d", maxNproc, r.Nproc)
	}
	if r.Session != "" && !validID(r.Session) {
		return fmt.Errorf("session must be at most %d printable characters without spaces", maxIDLen)
	}
	return nil
}

// HeartbeatRequest keeps a member alive and reports its workers.
type HeartbeatRequest struct {
	NodeID string `json:"node_id"`
	// Round is the round whose assignment the node's workers run (0: none).
	Round int `json:"round,omitempty"`
	// Step is the training step, if the workers report one.
	Step *int64 `json:"step,omitempty"`
	// Workers is a short free-form worker state ("running", "stopped", ...).
	Workers string `json:"workers,omitempty"`
	// Listening, from the master node (group rank 0), is the round whose
	// MASTER_PORT one of its workers listens on (the TCPStore is up).
	Listening int `json:"listening,omitempty"`
	// Progress is the training progress the node's workers reported
	// through FLEETD_PROGRESS (docs/agent.md, "Progress reports"); nil
	// when they reported none.
	Progress *Progress `json:"progress,omitempty"`
}

// Progress is what a node's agent read from its workers' progress file
// (FLEETD_PROGRESS, written by global rank 0) for one round: the latest
// report and the throughput over the round so far. Times are ages, not
// timestamps, so the node's and the daemon's clocks need not agree.
type Progress struct {
	// Round is the rendezvous round of the workers that wrote it, and
	// Nodes and WorldSize its size.
	Round     int `json:"round"`
	Nodes     int `json:"nodes,omitempty"`
	WorldSize int `json:"world_size,omitempty"`
	// Step and Samples are the latest report's: optimizer steps and
	// samples (or tokens) of the whole job so far.
	Step    int64   `json:"step"`
	Samples float64 `json:"samples"`
	// Loss and TotalSteps are the latest report's, when given.
	Loss       *float64 `json:"loss,omitempty"`
	TotalSteps int64    `json:"total_steps,omitempty"`
	// AgeMS is how long before the heartbeat the latest report was made.
	AgeMS int64 `json:"age_ms"`
	// FirstStep is the step of the round's first report (where the
	// round's workers resumed, when they report before the first step),
	// FirstAgeMS how long before the heartbeat it was made.
	FirstStep  int64 `json:"first_step"`
	FirstAgeMS int64 `json:"first_age_ms"`
	// SamplesPerSec and StepsPerSec are the round's throughput over
	// RateSeconds of reports, after its first interval (start-up) when it
	// has three or more reports; 0 while there are fewer than two.
	SamplesPerSec float64 `json:"samples_per_s,omitempty"`
	StepsPerSec   float64 `json:"steps_per_s,omitempty"`
	RateSeconds   float64 `json:"rate_seconds,omitempty"`
	// Reports counts the round's valid reports.
	Reports int `json:"reports"`
	// Batch is the latest report's global batch (samples per optimizer
	// step) and NoiseScale the gradient noise scale its workers measured
	// (fleetd_elastic.AdaptiveBatch), in samples; 0 when not reported.
	// The allocator weighs a size's throughput by the statistical
	// efficiency of the batch it implies.
	Batch      float64 `json:"batch,omitempty"`
	NoiseScale float64 `json:"noise_scale,omitempty"`
}

// Validate checks a progress report's bounds.
func (p *Progress) Validate() error {
	if p == nil {
		return nil
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case p.Round < 0 || p.Nodes < 0 || p.WorldSize < 0 || p.Step < 0 || p.TotalSteps < 0 || p.FirstStep < 0 ||
		p.AgeMS < 0 || p.FirstAgeMS < 0 || p.Reports < 0:
		return errors.New("progress: round, sizes, steps, ages and reports must not be negative")
	case !finite(p.Samples) || p.Samples < 0:
		return errors.New("progress: samples must be a non-negative number")
	case p.Loss != nil && !finite(*p.Loss):
		return errors.New("progress: loss must be a finite number")
	case !finite(p.SamplesPerSec) || !finite(p.StepsPerSec) || !finite(p.RateSeconds) ||
		p.SamplesPerSec < 0 || p.StepsPerSec < 0 || p.RateSeconds < 0:
		return errors.New("progress: rates must be non-negative numbers")
	case !finite(p.Batch) || !finite(p.NoiseScale) || p.Batch < 0 || p.NoiseScale < 0:
		return errors.New("progress: batch and noise_scale must be non-negative numbers")
	}
	return nil
}

const maxWorkersLen = 64

func (r HeartbeatRequest) node() string { return r.NodeID }

// Validate checks a heartbeat request.
func (r HeartbeatRequest) Validate() error {
	if !validID(r.NodeID) {
		return fmt.Errorf("node_id must be 1..%d printable characters without spaces", maxIDLen)
	}
	if r.Round < 0 || r.Listening < 0 {
		return fmt.Errorf("round and listening must not be negative, got %d and %d", r.Round, r.Listening)
	}
	if len(r.Workers) > maxWorkersLen {
		return fmt.Errorf("workers must be at most %d bytes", maxWorkersLen)
	}
	return r.Progress.Validate()
}

// HeartbeatResponse is deliberately small (no member list): with thousands
// of agents heartbeating, it is the hot path. The round number tells the
// agent about changes even when its watch is broken.
type HeartbeatResponse struct {
	Round      int        `json:"round"`
	RoundState RoundState `json:"round_state"`
	State      NodeState  `json:"state"`
	// HeartbeatMS is the interval the agent should heartbeat at.
	HeartbeatMS int64 `json:"heartbeat_ms"`
}

// LeaveRequest removes a node gracefully.
type LeaveRequest struct {
	NodeID string `json:"node_id"`
}

// View is one node's view of its fleet's rendezvous: what join and watch
// return.
type View struct {
	Round      int        `json:"round"`
	RoundState RoundState `json:"round_state"`
	State      NodeState  `json:"state"`
	// Assignment is set when State is assigned.
	Assignment *Assignment `json:"assignment,omitempty"`
	// Reason says why a node is excluded; with Cause, why the running
	// round was replaced.
	Reason string `json:"reason,omitempty"`
	// Cause is set in the views of the waiting and assigned nodes of a
	// round that replaced a running round when their agents should act on
	// why: CauseNotice. Empty for other changes (a lost node, a join).
	Cause string `json:"cause,omitempty"`
	// NoticeDeadline, with CauseNotice (and in an excluded node's view),
	// is when the node with the notice goes away, if its notice said.
	NoticeDeadline time.Time `json:"notice_deadline,omitzero"`
	// Success is the job's outcome when State is finished.
	Success bool `json:"success,omitempty"`
	// HeartbeatMS is the interval the agent should heartbeat at.
	HeartbeatMS int64 `json:"heartbeat_ms,omitempty"`
	// MasterListening: the round's master node reported its store
	// listening on MASTER_PORT, so the other nodes' workers connect at
	// once. MasterListens: a master of an earlier round of this run did,
	// so this job's workers use MASTER_PORT and are worth waiting for.
	MasterListening bool `json:"master_listening,omitempty"`
	MasterListens   bool `json:"master_listens,omitempty"`
}

// CauseNotice: the running round was replaced because a node got an
// interruption notice (Exclude). That node is still alive, so every node's
// workers of the replaced round are asked to checkpoint before they stop
// (docs/agent.md, "Checkpoint on notice").
const CauseNotice = "notice"

// Differs reports whether v tells the agent something new compared with
// last, the view it acts on now. Server and client use this one rule, so
// a long-poll returns exactly when the agent must act.
func (v View) Differs(last View) bool {
	return v.Round != last.Round || v.State != last.State || v.MasterListening != last.MasterListening
}

// Assignment is a node's place in a closed round: everything the agent
// needs for torchrun's worker environment.
type Assignment struct {
	Round int    `json:"round"`
	RunID string `json:"run_id"` // TORCHELASTIC_RUN_ID; unique per fleet incarnation
	// GroupRank is the node's rank in the round (GROUP_RANK).
	GroupRank      int `json:"group_rank"`
	GroupWorldSize int `json:"group_world_size"`
	// RankOffset is the global rank of local rank 0 on this node: the sum
	// of the nproc of all lower group ranks.
	RankOffset     int            `json:"rank_offset"`
	LocalWorldSize int            `json:"local_world_size"`
	WorldSize      int            `json:"world_size"`
	MasterAddr     string         `json:"master_addr"`
	MasterPort     int            `json:"master_port"`
	Members        MembersSummary `json:"members"`
}

// Rank is RANK for a worker with the given local rank.
func (a Assignment) Rank(localRank int) int { return a.RankOffset + localRank }

// MembersSummary describes the round's membership in O(zones) bytes; the
// full member list is in Status (sending it to every agent would cost
// O(n²) per round).
type MembersSummary struct {
	Nodes int         `json:"nodes"`
	Zones []ZoneCount `json:"zones,omitempty"`
}

// ZoneCount is how many nodes of a round are in one zone, in rank order.
type ZoneCount struct {
	Zone  string `json:"zone"`
	Nodes int    `json:"nodes"`
}

// EventKind names what happened to a fleet's rendezvous.
type EventKind string

// Event kinds.
const (
	EventRoundOpened    EventKind = "round_opened"
	EventRoundClosed    EventKind = "round_closed"
	EventMemberJoined   EventKind = "member_joined"
	EventMemberRejoined EventKind = "member_rejoined" // new agent session while assigned
	EventMemberDropped  EventKind = "member_dropped"  // heartbeats stopped
	EventMemberLeft     EventKind = "member_left"
	EventMemberExcluded EventKind = "member_excluded"
	EventFinished       EventKind = "finished"
)

// Event is one transition, for the daemon's event log.
type Event struct {
	Kind   EventKind `json:"kind"`
	At     time.Time `json:"at"`
	Round  int       `json:"round"`
	Node   string    `json:"node,omitempty"`
	Reason string    `json:"reason,omitempty"`
	// Nodes and WorldSize describe a closed round.
	Nodes     int `json:"nodes,omitempty"`
	WorldSize int `json:"world_size,omitempty"`
	// Duration is open→close latency for round_closed and the silence for
	// member_dropped.
	Duration time.Duration `json:"duration,omitempty"`
}

// String renders an event for humans.
func (e Event) String() string {
	switch e.Kind {
	case EventRoundOpened:
		return fmt.Sprintf("round %d opened: %s", e.Round, e.Reason)
	case EventRoundClosed:
		return fmt.Sprintf("round %d closed: %d nodes, world size %d, %s after opening", e.Round, e.Nodes, e.WorldSize, e.Duration)
	case EventMemberJoined:
		return fmt.Sprintf("node %s joined (round %d, %s)", e.Node, e.Round, e.Reason)
	case EventMemberRejoined:
		return fmt.Sprintf("node %s rejoined with a new agent session (round %d)", e.Node, e.Round)
	case EventMemberDropped:
		return fmt.Sprintf("node %s dropped: no heartbeat for %s (round %d)", e.Node, e.Duration, e.Round)
	case EventMemberLeft:
		return fmt.Sprintf("node %s left (round %d)", e.Node, e.Round)
	case EventMemberExcluded:
		return fmt.Sprintf("node %s excluded: %s (round %d)", e.Node, e.Reason, e.Round)
	case EventFinished:
		return fmt.Sprintf("job finished (%s) at round %d", e.Reason, e.Round)
	}
	return fmt.Sprintf("%s round %d %s %s", e.Kind, e.Round, e.Node, e.Reason)
}

// Errors callers branch on.
var (
	ErrUnknownFleet    = errors.New("rendezvous: unknown fleet")
	ErrClosed          = errors.New("rendezvous: service closed")
	ErrUnauthenticated = errors.New("rendezvous: unauthenticated")
	ErrForbidden       = errors.New("rendezvous: forbidden")
)
