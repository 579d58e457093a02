package api

import (
	"time"

	"github.com/fleetd/fleetd/agentwire"
)

// The agent API's bodies live in agentwire, which the agent imports too
// (it must not import fleet/); these names keep the daemon's code as is.
type (
	RegisterRequest    = agentwire.RegisterRequest
	RegisterResponse   = agentwire.RegisterResponse
	TrainingConfig     = agentwire.TrainingConfig
	CheckpointConfig   = agentwire.CheckpointConfig
	NoticeRequest      = agentwire.NoticeRequest
	LogsRequest        = agentwire.LogsRequest
	DoneRequest        = agentwire.DoneRequest
	DrainedRequest     = agentwire.DrainedRequest
	DataConfig         = agentwire.DataConfig
	StagingReport      = agentwire.StagingReport
	PeerStagingRequest = agentwire.PeerStagingRequest
	PeerStaging        = agentwire.PeerStaging
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

// The checkpoint wire types are agentwire's: the agent sends and reads
// the same ones.
type (
	CheckpointSignRequest   = agentwire.CheckpointSignRequest
	CheckpointSignResponse  = agentwire.CheckpointSignResponse
	CheckpointListRequest   = agentwire.CheckpointListRequest
	CheckpointObject        = agentwire.CheckpointObject
	CheckpointListResponse  = agentwire.CheckpointListResponse
	CheckpointDeleteRequest = agentwire.CheckpointDeleteRequest
	CheckpointStoreError    = agentwire.CheckpointStoreError
	CheckpointTransfer      = agentwire.CheckpointTransfer
	CheckpointNodeStatus    = agentwire.CheckpointNodeStatus
	CheckpointEvent         = agentwire.CheckpointEvent
	CheckpointReport        = agentwire.CheckpointReport
)
