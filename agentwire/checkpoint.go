package agentwire

import "time"

// The checkpoint part of the node-facing agent API, shared by the daemon
// (fleet/api aliases these) and the agent (agent/ckpt reports in them).
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
