// Package api is fleetd's HTTP API: the server handlers (over a small
// Backend interface the daemon implements), auth middleware, and the client
// the CLI uses. The JSON types here are the wire schema (docs/api.md).
package api

import (
	"fmt"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// APIVersion is bumped on incompatible changes of the /v1 schema.
const APIVersion = "v1"

// ApplyRequest carries a spec file as written; the daemon parses it itself
// so what it stores is exactly what the user wrote.
type ApplyRequest struct {
	Filename string            `json:"filename"`
	Source   string            `json:"source"`
	Vars     map[string]string `json:"vars,omitempty"`
	// BaseDir is the spec's directory on the CLI's machine; Files are the
	// files its file() calls read there and Env the env() values it used,
	// so the daemon's parse sees exactly what the CLI saw.
	BaseDir string            `json:"base_dir,omitempty"`
	Files   map[string]string `json:"files,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// SkipCheck skips apply's preflight (`fleetd apply -skip-check`).
	SkipCheck bool `json:"skip_check,omitempty"`
}

// CheckRequest is the body of POST /v1/check: a spec, and whether to run
// only the cheap checks apply runs.
type CheckRequest struct {
	ApplyRequest
	Quick bool `json:"quick,omitempty"`
}

// ProviderCheck is the preflight of one provider block of one fleet.
type ProviderCheck struct {
	Fleet    string                  `json:"fleet"`
	Provider string                  `json:"provider"`
	Results  []providers.CheckResult `json:"results"`
	// Note says why there are no results (the provider has no preflight,
	// or could not be started).
	Note string `json:"note,omitempty"`
}

// CheckReport is the response of POST /v1/check, and what a refused
// apply carries in Error.Preflight.
type CheckReport struct {
	// OK is false when any result failed.
	OK        bool            `json:"ok"`
	Providers []ProviderCheck `json:"providers"`
}

// PreflightError is returned by Apply when the preflight found a problem:
// nothing was stored and nothing launched.
type PreflightError struct{ Report CheckReport }

func (e *PreflightError) Error() string {
	n := 0
	for _, p := range e.Report.Providers {
		for _, r := range p.Results {
			if r.Status == providers.CheckFailed {
				n++
			}
		}
	}
	return fmt.Sprintf("preflight check failed (%d problem(s)); nothing was applied. Fix them, or apply with -skip-check", n)
}

// UnreachableError is returned by Plan and Apply when a fleet's nodes
// would be handed a daemon URL they cannot reach (a loopback daemon and
// an aws, gcp or external provider): nothing was applied. The API answers
// 422 with Error() as the message.
type UnreachableError struct {
	Fleet     string
	Providers []string // the provider blocks whose nodes cannot reach URL
	URL       string   // the daemon URL nodes would be given
	Reason    string   // why they cannot: "a loopback address", …
	At        string   // FILE:LINE of the first such provider block, if known
	Fix       string   // how to fix it
}

func (e *UnreachableError) Error() string {
	at := ""
	if e.At != "" {
		at = " (" + e.At + ")"
	}
	return fmt.Sprintf("fleet %q uses provider %s%s, but its nodes would be given the daemon URL %s: %s, which they cannot reach from their own machines; nothing was applied. Fix: %s",
		e.Fleet, strings.Join(e.Providers, ", "), at, e.URL, e.Reason, e.Fix)
}

// NoAgentError is returned by Plan and Apply when none of a fleet's
// candidate offerings runs on an architecture the daemon has an agent
// binary for: its nodes would boot and fail the agent download forever.
type NoAgentError struct {
	Fleet     string
	Arches    []string // the architectures of the candidate offerings, none served
	Offerings []string // a few of the candidate instance types, for the message
	Have      []string // the architectures the daemon does serve
	Looked    []string // the directories the daemon looked in
	Fix       string
}

func (e *NoAgentError) Error() string {
	have := "none"
	if len(e.Have) > 0 {
		have = "linux/" + strings.Join(e.Have, ", linux/")
	}
	return fmt.Sprintf("fleet %q can only run on linux/%s (%s), but the daemon has no agent binary for it (looked in %s; it has %s); nothing was applied. Fix: %s",
		e.Fleet, strings.Join(e.Arches, ", linux/"), strings.Join(e.Offerings, ", "), strings.Join(e.Looked, ", "), have, e.Fix)
}

// Diagnostic is one spec problem, with its position.
type Diagnostic struct {
	Severity string `json:"severity"` // error | warning
	Summary  string `json:"summary"`
	Detail   string `json:"detail,omitempty"`
	Filename string `json:"filename,omitempty"`
	Line     int    `json:"line,omitempty"`
	Column   int    `json:"column,omitempty"`
}

// Error is the body of every non-2xx response.
type Error struct {
	Error       string       `json:"error"`
	Diagnostics []Diagnostic `json:"diagnostics,omitempty"`
	// Rendered is the diagnostics as text with source snippets, for humans.
	Rendered string `json:"rendered,omitempty"`
	// Preflight is the failed preflight that refused an apply.
	Preflight *CheckReport `json:"preflight,omitempty"`
}

// PlanAction is what apply would do to one fleet.
type PlanAction string

const (
	ActionCreate  PlanAction = "create"
	ActionUpdate  PlanAction = "update"
	ActionNoop    PlanAction = "no-op"
	ActionDestroy PlanAction = "destroy"
)

// PlannedOffering is one offering the fleet would launch on.
type PlannedOffering struct {
	Key          string  `json:"key"`
	Provider     string  `json:"provider"`
	Region       string  `json:"region"`
	Zone         string  `json:"zone"`
	InstanceType string  `json:"instance_type"`
	CapacityType string  `json:"capacity_type"`
	PricePerHour float64 `json:"price_per_hour"`
	Nodes        int     `json:"nodes"`
}

// FleetPlan is the plan for one fleet in an applied file.
type FleetPlan struct {
	Fleet        string            `json:"fleet"`
	Action       PlanAction        `json:"action"`
	Changes      []string          `json:"changes,omitempty"` // human-readable field changes
	MinNodes     int               `json:"min_nodes"`
	MaxNodes     int               `json:"max_nodes"`
	TargetNodes  int               `json:"target_nodes"`
	CurrentNodes int               `json:"current_nodes"`
	Launch       int               `json:"launch"`
	Terminate    int               `json:"terminate"`
	Offerings    []PlannedOffering `json:"offerings,omitempty"`
	CostPerHour  float64           `json:"cost_per_hour,omitempty"`
	Notes        []string          `json:"notes,omitempty"`
	// Scaling is the autoscaler's current decision and model for an
	// existing fleet (docs/autoscale.md).
	Scaling *ScalingInfo `json:"scaling,omitempty"`
}

// Plan is the response of POST /v1/plan and the first part of apply.
type Plan struct {
	Fleets []FleetPlan `json:"fleets"`
}

// ApplyResponse is the response of POST /v1/fleets.
type ApplyResponse struct {
	Plan   Plan           `json:"plan"`
	Fleets []FleetSummary `json:"fleets"`
}

// NodeInfo is one node as shown by the API.
type NodeInfo struct {
	ID            string          `json:"id"`
	State         state.NodeState `json:"state"`
	Reason        string          `json:"reason,omitempty"`
	Provider      string          `json:"provider"`
	Region        string          `json:"region"`
	Zone          string          `json:"zone"`
	InstanceType  string          `json:"instance_type"`
	CapacityType  string          `json:"capacity_type"`
	PricePerHour  float64         `json:"price_per_hour"`
	InstanceID    string          `json:"instance_id,omitempty"`
	Address       string          `json:"address,omitempty"`
	Round         int64           `json:"round,omitempty"`
	AgeSeconds    float64         `json:"age_seconds"`
	LastHeartbeat *time.Time      `json:"last_heartbeat,omitempty"`
	CreatedAt     time.Time       `json:"created_at"`
	// From the rendezvous, for a node whose agent is a member:
	// RendezvousState is its view (assigned, waiting, standby, excluded),
	// Workers and WorkerRound what its last heartbeat said of its workers.
	// Round is then the round it is assigned in, and LastHeartbeat its
	// agent's last heartbeat.
	RendezvousState string `json:"rendezvous_state,omitempty"`
	Workers         string `json:"workers,omitempty"`
	WorkerRound     int    `json:"worker_round,omitempty"`
	// Network is the fast path the node was launched on ("efa ×32,
	// placement group fleetd-bert-k3x9-us-east-1a"); empty on the
	// standard network. Workers says whether its agent found the devices.
	Network string `json:"network,omitempty"`
	// Staging is the node agent's latest report per staged data block
	// (training.data mode "stage"): bytes, rate, ETA, where from.
	Staging []StagingReport `json:"staging,omitempty"`
}

// FleetSummary is one fleet in list and status responses.
type FleetSummary struct {
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
	// Incarnation identifies this life of the fleet name (apply to
	// destroy); events and logs of earlier ones are kept under theirs.
	Incarnation string `json:"incarnation,omitempty"`
	Destroying  bool   `json:"destroying,omitempty"`
	// Project is the fleet's project (docs/projects.md); absent when its
	// stored spec is unreadable.
	Project      string         `json:"project,omitempty"`
	MinNodes     int            `json:"min_nodes"`
	MaxNodes     int            `json:"max_nodes"`
	TargetNodes  int            `json:"target_nodes"`
	NodesByState map[string]int `json:"nodes_by_state"`
	CostPerHour  float64        `json:"cost_per_hour"`
	// SpendUSD is what the fleet's instances have cost so far (price ×
	// time from launch to termination); OnDemandEquivalentUSD what the same
	// hours would have cost on demand, when known.
	SpendUSD float64 `json:"spend_usd"`
	// SpendNameTotalUSD is SpendUSD plus what the name's destroyed
	// incarnations cost (fleetd_spend_usd_total counts the same).
	SpendNameTotalUSD     float64 `json:"spend_name_total_usd,omitempty"`
	OnDemandEquivalentUSD float64 `json:"on_demand_equivalent_usd,omitempty"`
	// SavingsUSD is OnDemandEquivalentUSD − SpendUSD: what running on spot
	// saved so far. Nodes whose on-demand price is not known yet count at
	// their own price (no savings claimed for them).
	SavingsUSD float64 `json:"savings_usd"`
	// OnDemandCostPerHour is what the live nodes would cost per hour on
	// demand (same rule for unknown prices).
	OnDemandCostPerHour float64 `json:"on_demand_cost_per_hour"`
	// PricesAsOf is the oldest price date (Offering.PriceAsOf) of the
	// offerings placement currently uses for the fleet (those of its last
	// market view that fit its node) and PriceSources their distinct price
	// sources; before the daemon has listed offerings for the fleet, those
	// of the live nodes' offerings at launch. Absent when unknown.
	PricesAsOf   time.Time `json:"prices_as_of,omitzero"`
	PriceSources []string  `json:"price_sources,omitempty"`
	// Interruptions counts terminal interruption notices (not rebalance
	// recommendations) the fleet has had.
	Interruptions int `json:"interruptions"`
	// AlertCount is the number of active alerts (FleetDetail lists them).
	AlertCount int      `json:"alert_count"`
	Providers  []string `json:"providers"`
	// Rendezvous is the current round; nil before the first.
	Rendezvous *RendezvousInfo `json:"rendezvous,omitempty"`
	// Checkpoint is the fleet's checkpoint store as its agents report it;
	// nil without a training.checkpoint block.
	Checkpoint *CheckpointStatus `json:"checkpoint,omitempty"`
	// Completed is set once the training job ended; Succeeded is its
	// outcome and CompletedDetail what the reporting agent said of it.
	Completed       bool      `json:"completed,omitempty"`
	Succeeded       bool      `json:"succeeded,omitempty"`
	CompletedDetail string    `json:"completed_detail,omitempty"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
	// Training is the job's progress as its workers report it
	// (FLEETD_PROGRESS); nil before the fleet's first reconcile pass.
	Training *TrainingInfo `json:"training,omitempty"`
	// Scaling says why the fleet has its target size; nil before the
	// fleet's first reconcile pass.
	Scaling *ScalingInfo `json:"scaling,omitempty"`
	// Allocation is the allocator's decision (docs/projects.md); nil
	// while the daemon runs no projects.
	Allocation *AllocationInfo `json:"allocation,omitempty"`
}

// TrainingInfo is a fleet's training progress.
type TrainingInfo struct {
	// Source is "reports" (the workers' FLEETD_PROGRESS reports) or
	// "round-timing" (none yet: progress is the rendezvous' measure,
	// WorkDoneSeconds of training time at max_nodes); Note says more.
	Source          string  `json:"source"`
	Note            string  `json:"note,omitempty"`
	WorkDoneSeconds float64 `json:"work_done_seconds,omitempty"`
	// Of the latest report: its round and size, the job's step and
	// samples so far, the loss and the total steps when the workers say,
	// and the round's throughput.
	Round            int        `json:"round,omitempty"`
	Nodes            int        `json:"nodes,omitempty"`
	WorldSize        int        `json:"world_size,omitempty"`
	Step             int64      `json:"step"`
	Samples          float64    `json:"samples"`
	Loss             *float64   `json:"loss,omitempty"`
	TotalSteps       int64      `json:"total_steps,omitempty"`
	SamplesPerSecond float64    `json:"samples_per_second"`
	StepsPerSecond   float64    `json:"steps_per_second"`
	ReportedAt       *time.Time `json:"reported_at,omitempty"`
	// ETA is when the job reaches TotalSteps at the current step rate.
	ETA        *time.Time `json:"eta,omitempty"`
	ETASeconds float64    `json:"eta_seconds,omitempty"`
	// History is the throughput over time (GET /v1/fleets/{name} only).
	History []TrainingPoint `json:"history,omitempty"`
}

// TrainingPoint is one sample of a fleet's training over time.
type TrainingPoint struct {
	At               time.Time `json:"at"`
	Round            int       `json:"round"`
	Nodes            int       `json:"nodes"`
	WorldSize        int       `json:"world_size"`
	Step             int64     `json:"step"`
	SamplesPerSecond float64   `json:"samples_per_second"`
	Loss             *float64  `json:"loss,omitempty"`
}

// ScalingInfo is the autoscaler's decision (docs/autoscale.md).
type ScalingInfo struct {
	// Policy is placement.scale ("goodput" or "max").
	Policy string `json:"policy"`
	Target int    `json:"target"`
	// Reason is a keyword (pinned, max, fixed, starting, no-reports,
	// measuring, holding, goodput, exploring, deadline, deadline-late);
	// Explain the sentence ("6 nodes: 4.1k samples/s at $2.10/h; 8 would
	// add 6% throughput for 33% more cost").
	Reason  string `json:"reason"`
	Explain string `json:"explain"`
	// Options and Model (GET /v1/fleets/{name} and plan only) are every
	// size as the decision saw it and the fitted scaling model.
	Options []ScaleOption `json:"options,omitempty"`
	Model   *ScaleModel   `json:"model,omitempty"`
}

// ScaleOption is one fleet size as the autoscaler judged it.
type ScaleOption struct {
	Nodes int `json:"nodes"`
	// SamplesPerSecond is measured (Measured) or predicted; 0 unknown.
	// Low and High bound it (the optimistic bound decides exploration).
	SamplesPerSecond float64 `json:"samples_per_second,omitempty"`
	Low              float64 `json:"low,omitempty"`
	High             float64 `json:"high,omitempty"`
	Measured         bool    `json:"measured,omitempty"`
	MeasuredSeconds  float64 `json:"measured_seconds,omitempty"`
	CostPerHour      float64 `json:"cost_per_hour"`
	// Useful is the fraction of time that makes progress given the
	// expected interruptions; CostPerMillionSamples the expected cost per
	// million samples of progress.
	Useful                float64 `json:"useful"`
	CostPerMillionSamples float64 `json:"cost_per_million_samples,omitempty"`
	FinishSeconds         float64 `json:"finish_seconds,omitempty"`
	Note                  string  `json:"note,omitempty"`
}

// ScaleModel is the fitted scaling model: node-seconds per sample
// y(N) = N/X(N) = A + B·(N−1).
type ScaleModel struct {
	Formula string  `json:"formula"`
	A       float64 `json:"a"`
	B       float64 `json:"b"`
	Sizes   []int   `json:"sizes"`
	Points  int     `json:"points"`
	Sigma   float64 `json:"sigma"`
	// Fixed: one size seen, B unknown.
	Fixed bool `json:"fixed,omitempty"`
	// CeilingSamplesPerSecond is 1/B, the throughput no size exceeds.
	CeilingSamplesPerSecond float64 `json:"ceiling_samples_per_second,omitempty"`
}

// FleetDetail is the response of GET /v1/fleets/{name}.
type FleetDetail struct {
	FleetSummary
	Filename   string         `json:"filename"`
	Source     string         `json:"source"`
	Nodes      []NodeInfo     `json:"nodes"`
	Recoveries []RecoveryInfo `json:"recoveries"`
	Alerts     []AlertInfo    `json:"alerts"`
	// RecentInterruptions are the latest notices of any kind, oldest first.
	RecentInterruptions []InterruptionInfo `json:"recent_interruptions"`
}

// InterruptionInfo is one interruption notice the fleet took.
type InterruptionInfo struct {
	Node   string    `json:"node"`
	Kind   string    `json:"kind"`   // spot-interruption, rebalance, preempted, ...
	Source string    `json:"source"` // agent/imds, provider/aws, ...
	At     time.Time `json:"at"`
	// Seq is the notice's event in the event log.
	Seq uint64 `json:"seq"`
}

// RendezvousInfo is the fleet's current rendezvous round.
type RendezvousInfo struct {
	Round     int    `json:"round"`
	State     string `json:"state"` // open | closed | finished
	Nodes     int    `json:"nodes"`
	WorldSize int    `json:"world_size"`
	Master    string `json:"master,omitempty"`
}

// RecoveryInfo is one measured recovery: round-reformed (notice → the
// survivors' next rendezvous round closed: the daemon decided the new
// membership), training-resumed (notice → the survivors' workers report
// progress again, having loaded their checkpoint; LostSteps is then how
// many steps they recompute) or replacement-joined (launch requested →
// agent registered).
type RecoveryInfo struct {
	Kind            string    `json:"kind"`
	Node            string    `json:"node,omitempty"`
	DurationSeconds float64   `json:"duration_seconds"`
	At              time.Time `json:"at"`
	LostSteps       *int64    `json:"lost_steps,omitempty"`
}

// AlertInfo is a condition operators should look at.
type AlertInfo struct {
	Kind    string `json:"kind"`
	Subject string `json:"subject,omitempty"`
	Message string `json:"message"`
}

// Status is the response of GET /v1/status.
type Status struct {
	APIVersion string         `json:"api_version"`
	Version    string         `json:"version"`
	DaemonID   string         `json:"daemon_id"`
	StartedAt  time.Time      `json:"started_at"`
	Time       time.Time      `json:"time"`
	Fleets     []FleetSummary `json:"fleets"`
	// LastEventSeq is the newest event's seq: follow the event log from
	// here (GET /v1/events/stream?since=LastEventSeq) to see what changes.
	LastEventSeq uint64 `json:"last_event_seq"`
	// Server is the cluster member that answered and Leader the one that
	// made the answer (a follower forwards to it); both empty for a single
	// server.
	Server string `json:"server,omitempty"`
	Leader string `json:"leader,omitempty"`
}

// ClusterInfo is the response of GET /v1/cluster, answered by every
// server itself.
type ClusterInfo struct {
	// Server is the server that answered; Leader the current leader ("" while
	// an election is under way); IsLeader whether they are the same.
	Server    string `json:"server"`
	Leader    string `json:"leader,omitempty"`
	LeaderURL string `json:"leader_url,omitempty"`
	IsLeader  bool   `json:"is_leader"`
}

// EventsResponse is the response of GET /v1/events.
type EventsResponse struct {
	Events []state.Event `json:"events"`
	// Next is the `since` to pass to get the following events.
	Next uint64 `json:"next"`
}

// TokenRequest is the body of POST /v1/tokens.
type TokenRequest struct {
	Role string `json:"role"`           // "read" or "operate"
	Name string `json:"name,omitempty"` // for humans: who or what uses it
	// Project limits the token to one project's fleets; "" is every
	// project.
	Project string `json:"project,omitempty"`
}

// TokenInfo describes a scoped token; it never carries the secret.
type TokenInfo struct {
	ID        string    `json:"id"`
	Name      string    `json:"name,omitempty"`
	Role      string    `json:"role"`
	Project   string    `json:"project,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// TokenCreated is the answer of POST /v1/tokens: the only time the secret
// is shown.
type TokenCreated struct {
	TokenInfo
	Token string `json:"token"`
}

// CheckpointStatus is a fleet's checkpoint store (training.checkpoint)
// as its agents report it.
type CheckpointStatus struct {
	Dir    string `json:"dir"`
	Store  string `json:"store,omitempty"`
	Keep   int    `json:"keep"`
	Access string `json:"access,omitempty"`
	// LastStep is the newest checkpoint complete in the store (-1: none
	// known yet), uploaded at LastAt, AgeSeconds ago, Bytes large.
	LastStep   int64     `json:"last_step"`
	LastAt     time.Time `json:"last_at,omitzero"`
	AgeSeconds float64   `json:"age_seconds,omitempty"`
	Bytes      int64     `json:"bytes,omitempty"`
	// UploadMiBps and RestoreMiBps are the last measured transfers.
	UploadMiBps  float64 `json:"upload_mib_per_s,omitempty"`
	RestoreMiBps float64 `json:"restore_mib_per_s,omitempty"`
	// Uploading and Restoring are transfers in progress (one node each).
	Uploading *CheckpointTransfer `json:"uploading,omitempty"`
	Restoring *CheckpointTransfer `json:"restoring,omitempty"`
	// LastRestore is the last restore a node made at start.
	LastRestore *CheckpointRestore `json:"last_restore,omitempty"`
	// Error is the last failure until a later success (also an alert).
	Error     string    `json:"error,omitempty"`
	ErrorKind string    `json:"error_kind,omitempty"`
	ErrorNode string    `json:"error_node,omitempty"`
	ErrorAt   time.Time `json:"error_at,omitzero"`
	// Moves is what moving the job away from the store's location would
	// cost, as placement prices it (docs/placement.md, "Moving a job"):
	// one row per kind of destination. Absent while the checkpoint's size
	// is unknown or the store is not in a cloud.
	Moves []CheckpointMove `json:"moves,omitempty"`
}

// CheckpointMove prices restoring the checkpoint somewhere else.
type CheckpointMove struct {
	// To is "aws:*" (another region of the store's cloud) or a cloud.
	To string `json:"to"`
	// PerGB is the egress price from the store to To; EgressUSD is that
	// times the checkpoint's size times the fleet's target nodes (each
	// node restores the whole checkpoint).
	PerGB     float64 `json:"egress_per_gb"`
	EgressUSD float64 `json:"egress_usd"`
	// RestoreSeconds is one node's restore at the measured (or default)
	// throughput.
	RestoreSeconds float64 `json:"restore_seconds"`
	// Source and AsOf say where the egress prices come from.
	Source string `json:"source"`
	AsOf   string `json:"as_of"`
}

// CheckpointRestore is a node's restore of a checkpoint before its workers started.
type CheckpointRestore struct {
	Node  string    `json:"node"`
	Step  int64     `json:"step"`
	MiBps float64   `json:"mib_per_s,omitempty"`
	At    time.Time `json:"at"`
}
