package api

import (
	"time"

	"github.com/fleetd/fleetd/agentwire"
)

// The agent API's bodies live in agentwire, which the agent imports too
// (it must not import fleet/); these names keep the daemon's code as is.
type (
	RegisterRequest  = agentwire.RegisterRequest
	RegisterResponse = agentwire.RegisterResponse
	TrainingConfig   = agentwire.TrainingConfig
	CheckpointConfig = agentwire.CheckpointConfig
	NoticeRequest    = agentwire.NoticeRequest
	LogsRequest      = agentwire.LogsRequest
	DoneRequest      = agentwire.DoneRequest
)

// Agent API (per-node token): the on-VM agent registers, reports notices and
// ships worker log tails. Paths: /v1/agent/{fleet}/{node}/{register,notice,logs}.

// LogLine is one stored log line.
type LogLine struct {
	// Incarnation is the fleet incarnation the node belonged to: a
	// re-created fleet's logs never mix with its predecessor's.
	Incarnation string    `json:"incarnation,omitempty"`
	Node        string    `json:"node"`
	Round       int64     `json:"round"`
	Rank        int       `json:"rank"`
	Time        time.Time `json:"time"`
	Line        string    `json:"line"`
}

// InterruptRequest injects an interruption (local and sim providers, tests,
// game days): POST /v1/fleets/{name}/nodes/{node}/interrupt.
type InterruptRequest struct {
	Kind string        `json:"kind,omitempty"` // default spot-interruption
	Lead time.Duration `json:"lead,omitempty"` // default: the provider's notice lead
}

// Checkpoint store calls of the agent API (docs/checkpoints.md): with
// access = "signed" the daemon lists, deletes and signs URLs for exactly
// the keys a node asks, and only keys of the checkpoint layout
// (manifests/step-N.json, data/step-N/PATH) under the fleet's store.
// Paths: /v1/agent/{fleet}/{node}/checkpoint/{sign,list,delete,report}.

// CheckpointSignRequest asks for URLs to read (GET) or write (PUT) keys.
type CheckpointSignRequest struct {
	Method string   `json:"method"`
	Keys   []string `json:"keys"`
}

// CheckpointSignResponse has one URL per key, all valid until ExpiresAt.
type CheckpointSignResponse struct {
	URLs      map[string]string `json:"urls"`
	ExpiresAt time.Time         `json:"expires_at"`
}

// CheckpointListRequest lists "", "manifests/" or "data/step-N/".
type CheckpointListRequest struct {
	Prefix string `json:"prefix"`
}

// CheckpointObject is a listed object.
type CheckpointObject struct {
	Key  string `json:"key"`
	Size int64  `json:"size"`
}

// CheckpointListResponse is the listing.
type CheckpointListResponse struct {
	Objects []CheckpointObject `json:"objects"`
}

// CheckpointDeleteRequest deletes keys of checkpoints beyond keep.
type CheckpointDeleteRequest struct {
	Keys []string `json:"keys"`
}

// CheckpointStoreError is the body of a refused store call: Kind is
// unreachable, not-found, denied, corrupt or failed.
type CheckpointStoreError struct {
	Kind  string `json:"kind"`
	Error string `json:"error"`
}

// CheckpointTransfer is an upload or restore in progress on a node.
type CheckpointTransfer struct {
	Node       string    `json:"node,omitempty"`
	Step       int64     `json:"step"`
	DoneBytes  int64     `json:"done_bytes"`
	TotalBytes int64     `json:"total_bytes"`
	StartedAt  time.Time `json:"started_at"`
}

// CheckpointNodeStatus is a node's checkpoint manager state (agent/ckpt.Status).
type CheckpointNodeStatus struct {
	Store        string              `json:"store,omitempty"`
	Dir          string              `json:"dir"`
	LastStep     int64               `json:"last_step"`
	LastAt       time.Time           `json:"last_at,omitzero"`
	LastBytes    int64               `json:"last_bytes,omitempty"`
	LocalStep    int64               `json:"local_step"`
	Uploading    *CheckpointTransfer `json:"uploading,omitempty"`
	Restoring    *CheckpointTransfer `json:"restoring,omitempty"`
	UploadMiBps  float64             `json:"upload_mib_per_s,omitempty"`
	RestoreMiBps float64             `json:"restore_mib_per_s,omitempty"`
	RestoredStep int64               `json:"restored_step"`
	Error        string              `json:"error,omitempty"`
	ErrorKind    string              `json:"error_kind,omitempty"`
	ErrorAt      time.Time           `json:"error_at,omitzero"`
	Uploads      int                 `json:"uploads"`
	Failures     int                 `json:"failures"`
}

// CheckpointEvent is something that happened to a node's checkpoints
// (agent/ckpt.Event): uploaded, upload-failed, restored, restore-failed,
// corrupt, pruned.
type CheckpointEvent struct {
	Kind      string    `json:"kind"`
	Step      int64     `json:"step"`
	Bytes     int64     `json:"bytes,omitempty"`
	MiBps     float64   `json:"mib_per_s,omitempty"`
	Seconds   float64   `json:"seconds,omitempty"`
	ErrorKind string    `json:"error_kind,omitempty"`
	Detail    string    `json:"detail,omitempty"`
	At        time.Time `json:"at"`
}

// CheckpointReport is what an agent sends at its heartbeat interval when
// its checkpoint state changed.
type CheckpointReport struct {
	Status CheckpointNodeStatus `json:"status"`
	Events []CheckpointEvent    `json:"events,omitempty"`
}
