package agentwire

import "time"

// The node-facing agent API's request and response bodies, shared by the
// daemon (fleet/api aliases them) and the agent. Paths:
// /v1/agent/{fleet}/{node}/{register,notice,logs,done}.

// RegisterRequest is sent by an agent when it starts (and again after the
// daemon restarts, which is harmless).
type RegisterRequest struct {
	Address    string `json:"address"` // address workers bind and peers reach (MASTER_ADDR)
	Zone       string `json:"zone,omitempty"`
	InstanceID string `json:"instance_id,omitempty"`
	// AgentVersion is checked against the daemon's window (CheckSkew).
	AgentVersion string `json:"agent_version,omitempty"`
}

// ElasticInProcess is TrainingConfig.Elastic for the in-process mode.
const ElasticInProcess = "in-process"

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
	// WarmStart false turns the agent's warm interpreters off; nil (an
	// older daemon, or not set in the spec) means on.
	WarmStart *bool `json:"warm_start,omitempty"`
	// Elastic is training.elastic: "restart" (or empty, from an older
	// daemon) stops and restarts the workers on a membership change;
	// "in-process" hands each new round to the running workers.
	Elastic string `json:"elastic,omitempty"`
	// Checkpoint is training.checkpoint; nil without one.
	Checkpoint *CheckpointConfig `json:"checkpoint,omitempty"`
	// Network is the fast network the node was launched on (node.network);
	// nil for the standard network.
	Network *NetworkConfig `json:"network,omitempty"`
	// Data is training.data (DataConfig).
	Data []DataConfig `json:"data,omitempty"`
	// PeerPort is training.peer_port: the port a node serves its staged
	// copies to peers of its zone on; 0 (or an older daemon) lets the
	// agent pick (its own PeerPort option, else a free port).
	PeerPort int `json:"peer_port,omitempty"`
}

// NetworkConfig tells the agent which fast path its node has, so it sets
// the NCCL/libfabric environment for it (docs/agent.md, "Networking").
type NetworkConfig struct {
	// Fabric is providers.NetworkInfo.Fabric: "efa", "gpudirect-tcpx",
	// "gpudirect-tcpxo", "rdma".
	Fabric string `json:"fabric"`
	// Interfaces is how many fabric interfaces the node was launched with.
	Interfaces int `json:"interfaces"`
	// Group is the placement group (AWS) or resource policy (GCE) the
	// node was asked into; "" for none.
	Group string `json:"group,omitempty"`
}

// InProcess reports whether membership changes are handed to the running
// workers instead of restarting them.
func (tc TrainingConfig) InProcess() bool { return tc.Elastic == ElasticInProcess }

// CheckpointConfig is training.checkpoint as agents get it.
type CheckpointConfig struct {
	Dir   string `json:"dir"`
	Store string `json:"store,omitempty"`
	Keep  int    `json:"keep"`
	// Access: "signed" (URLs from the daemon) or "node" (own credentials).
	Access string `json:"access,omitempty"`
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

// DrainedRequest reports that a draining node is done: its workers
// stopped (or left the job in process) and its newest checkpoint is in
// the store, so the daemon ends its drain now rather than at the
// deadline.
type DrainedRequest struct {
	Reason string `json:"reason,omitempty"`
	// CheckpointStep is the step its workers confirmed they saved; -1
	// when they confirmed none.
	CheckpointStep int64 `json:"checkpoint_step"`
	// FlushError says why the newest checkpoint could not be stored;
	// "" when it is (or there was none).
	FlushError string `json:"flush_error,omitempty"`
}

// DoneRequest reports that the training job ended (any node may send it;
// the first one wins).
type DoneRequest struct {
	Success bool   `json:"success"`
	Step    int64  `json:"step,omitempty"`
	Detail  string `json:"detail,omitempty"`
}
