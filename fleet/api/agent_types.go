package api

import "time"

// Agent API (per-node token): the on-VM agent registers, reports notices and
// ships worker log tails. Paths: /v1/agent/{fleet}/{node}/{register,notice,logs}.

// RegisterRequest is sent by an agent when it starts (and again after the
// daemon restarts, which is harmless).
type RegisterRequest struct {
	Address      string `json:"address"` // address workers bind and peers reach (MASTER_ADDR)
	Zone         string `json:"zone,omitempty"`
	InstanceID   string `json:"instance_id,omitempty"`
	AgentVersion string `json:"agent_version,omitempty"`
}

// TrainingConfig is what the agent runs; it comes from the fleet's current
// spec so a re-applied spec reaches nodes at their next round.
type TrainingConfig struct {
	Command       []string          `json:"command"`
	Workdir       string            `json:"workdir,omitempty"`
	NprocPerNode  int               `json:"nproc_per_node"`
	MaxRestarts   int               `json:"max_restarts"`
	MasterPort    int               `json:"master_port"`
	DrainGrace    time.Duration     `json:"drain_grace"`
	CheckpointURI string            `json:"checkpoint_uri,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
	Heartbeat     time.Duration     `json:"heartbeat"`
	// WarmStart false turns the agent's warm interpreters off; nil: on.
	WarmStart *bool `json:"warm_start,omitempty"`
}

// RegisterResponse tells the agent how to proceed.
type RegisterResponse struct {
	Fleet    string         `json:"fleet"`
	Node     string         `json:"node"`
	Training TrainingConfig `json:"training"`
	// RendezvousURL is the base the rendezvous client uses (the daemon URL).
	RendezvousURL string `json:"rendezvous_url"`
}

// NoticeRequest reports an interruption notice seen on the node.
type NoticeRequest struct {
	Kind     string    `json:"kind"`
	Deadline time.Time `json:"deadline,omitzero"`
	Source   string    `json:"source"`
	Detail   string    `json:"detail,omitempty"`
	ID       string    `json:"id,omitempty"`
}

// LogsRequest ships the tail of a worker's output for one round.
type LogsRequest struct {
	Round int64    `json:"round"`
	Rank  int      `json:"rank"`
	Lines []string `json:"lines"`
}

// LogLine is one stored log line.
type LogLine struct {
	Node  string    `json:"node"`
	Round int64     `json:"round"`
	Rank  int       `json:"rank"`
	Time  time.Time `json:"time"`
	Line  string    `json:"line"`
}

// InterruptRequest injects an interruption (local and sim providers, tests,
// game days): POST /v1/fleets/{name}/nodes/{node}/interrupt.
type InterruptRequest struct {
	Kind string        `json:"kind,omitempty"` // default spot-interruption
	Lead time.Duration `json:"lead,omitempty"` // default: the provider's notice lead
}

// DoneRequest reports that the training job ended (any node may send it;
// the first one wins).
type DoneRequest struct {
	Success bool   `json:"success"`
	Step    int64  `json:"step,omitempty"`
	Detail  string `json:"detail,omitempty"`
}
