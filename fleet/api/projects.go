package api

import (
	"time"

	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/budget"
)

// AllocationInfo is the allocator's decision for a fleet
// (docs/projects.md): what it is to do and why.
type AllocationInfo struct {
	Project string `json:"project"`
	// Action is run, queue, pause, stop or paused.
	Action string `json:"action"`
	Target int    `json:"target"`
	// Kind is a keyword: start, grow, shrink, reclaim, hold, budget-cap,
	// budget-exhausted, queued, paused, unlimited, no-project.
	Kind string `json:"kind"`
	// Reason says why, e.g. "vision/resnet 6→4: its 5th and 6th node add
	// 3 % throughput; nlp/bert 2→4 gains 71 %".
	Reason string `json:"reason"`
	// QueuePosition is the fleet's place in the queue (1-based) while it
	// waits; 0 otherwise.
	QueuePosition int `json:"queue_position,omitempty"`
	// Waiting says which of its allotted nodes wait until draining nodes
	// (a reclaimed borrower's) free their GPUs; "" when none waits.
	Waiting string `json:"waiting,omitempty"`
}

// BudgetInfo is a budget and where its spend stands.
type BudgetInfo struct {
	// State is ok, warn, capped or exhausted.
	State        string  `json:"state"`
	PerHourLimit float64 `json:"per_hour_limit,omitempty"`
	TotalLimit   float64 `json:"total_limit,omitempty"`
	WarnAt       float64 `json:"warn_at"`
	OnExhausted  string  `json:"on_exhausted"`
	SpentUSD     float64 `json:"spent_usd"`
	// SpotUSD, OnDemandUSD and EgressUSD split SpentUSD by kind.
	SpotUSD     float64 `json:"spot_usd"`
	OnDemandUSD float64 `json:"on_demand_usd"`
	EgressUSD   float64 `json:"egress_usd"`
	BurnPerHour float64 `json:"burn_per_hour"`
	// RemainingUSD is TotalLimit − SpentUSD (absent without a total);
	// ExhaustsAt when it runs out at the current burn.
	RemainingUSD float64   `json:"remaining_usd,omitempty"`
	ExhaustsAt   time.Time `json:"exhausts_at,omitzero"`
	Reason       string    `json:"reason"`
}

// Project is one project in GET /v1/projects.
type Project struct {
	Name      string `json:"name"`
	QuotaGPUs int    `json:"quota_gpus"`
	MaxGPUs   int    `json:"max_gpus"`
	Priority  int    `json:"priority"`
	// Unlimited marks the undeclared default project.
	Unlimited bool `json:"unlimited,omitempty"`
	// Source says where its settings come from: "config" (daemon.hcl) or
	// "api" (an admin's change, stored; it overrides daemon.hcl).
	Source string `json:"source,omitempty"`
	// UsedGPUs are allocated to its fleets; BorrowedGPUs the part above
	// its quota; LentGPUs the part of its quota other projects use.
	UsedGPUs     int      `json:"used_gpus"`
	BorrowedGPUs int      `json:"borrowed_gpus"`
	LentGPUs     int      `json:"lent_gpus"`
	Fleets       []string `json:"fleets"`
	Queued       int      `json:"queued"`
	// Budget is nil without a budget block.
	Budget *BudgetInfo `json:"budget,omitempty"`
}

// ProjectsResponse is the response of GET /v1/projects.
type ProjectsResponse struct {
	// PoolGPUs is max_gpus (the sum of the quotas by default).
	PoolGPUs int       `json:"pool_gpus"`
	UsedGPUs int       `json:"used_gpus"`
	Projects []Project `json:"projects"`
}

// ProjectRequest is the body of PUT /v1/projects/{name}: the project's
// whole settings (admin only). MaxGPUs 0 means QuotaGPUs; a nil Budget
// means none.
type ProjectRequest struct {
	QuotaGPUs int            `json:"quota_gpus"`
	MaxGPUs   int            `json:"max_gpus,omitempty"`
	Priority  int            `json:"priority,omitempty"`
	Budget    *budget.Limits `json:"budget,omitempty"`
}

// ProjectChanged is the answer of PUT and DELETE /v1/projects/{name}.
type ProjectChanged struct {
	Name string `json:"name"`
	// Action is created, updated or deleted.
	Action    string         `json:"action"`
	QuotaGPUs int            `json:"quota_gpus"`
	MaxGPUs   int            `json:"max_gpus"`
	Priority  int            `json:"priority"`
	Budget    *budget.Limits `json:"budget,omitempty"`
}

// QueueEntry is one waiting fleet in GET /v1/queue.
type QueueEntry struct {
	Fleet    string `json:"fleet"`
	Project  string `json:"project"`
	Position int    `json:"position"`
	// Priority is the fleet's with its project's and aging added.
	Priority int       `json:"priority"`
	Since    time.Time `json:"since"`
	// Reserved: it has waited long enough that nothing behind it in its
	// project starts first.
	Reserved bool   `json:"reserved,omitempty"`
	Reason   string `json:"reason"`
}

// QueueResponse is the response of GET /v1/queue.
type QueueResponse struct {
	Queue []QueueEntry `json:"queue"`
}

// AllocationFrom is a fleet's allocator decision as the API shows it;
// position is its place in the queue (0: not waiting).
func AllocationFrom(a allocator.Allocation, position int) *AllocationInfo {
	return &AllocationInfo{Project: a.Project, Action: string(a.Action), Target: a.To, Kind: a.Kind, Reason: a.Reason, QueuePosition: position}
}

// BudgetFrom is a ledger status as the API shows it.
func BudgetFrom(st budget.Status) *BudgetInfo {
	return &BudgetInfo{
		State: string(st.State), PerHourLimit: st.Limit.PerHour, TotalLimit: st.Limit.Total,
		WarnAt: st.Limit.WarnAt, OnExhausted: string(st.Limit.OnExhausted),
		SpentUSD: st.Total, SpotUSD: st.Spent.Spot, OnDemandUSD: st.Spent.OnDemand, EgressUSD: st.Spent.Egress,
		BurnPerHour: st.PerHour, RemainingUSD: st.Remaining, ExhaustsAt: st.ExhaustsAt, Reason: st.Reason,
	}
}

// ProjectsFrom is GET /v1/projects from a decision; budgets gives a
// project's ledger status (false: no budget block).
func ProjectsFrom(d allocator.Decision, unlimited map[string]bool, priority map[string]int, budgets func(project string) (budget.Status, bool)) ProjectsResponse {
	out := ProjectsResponse{PoolGPUs: d.PoolGPUs, UsedGPUs: d.UsedGPUs, Projects: []Project{}}
	for _, u := range d.Projects {
		p := Project{Name: u.Name, QuotaGPUs: u.QuotaGPUs, MaxGPUs: u.MaxGPUs, Priority: priority[u.Name], Unlimited: unlimited[u.Name],
			UsedGPUs: u.UsedGPUs, BorrowedGPUs: u.BorrowedGPUs, LentGPUs: u.LentGPUs, Queued: u.Queued, Fleets: []string{}}
		for _, a := range d.Fleets {
			if a.Project == u.Name {
				p.Fleets = append(p.Fleets, a.Fleet)
			}
		}
		if budgets != nil {
			if st, ok := budgets(u.Name); ok {
				p.Budget = BudgetFrom(st)
			}
		}
		out.Projects = append(out.Projects, p)
	}
	return out
}

// QueueFrom is GET /v1/queue from a decision.
func QueueFrom(d allocator.Decision) QueueResponse {
	out := QueueResponse{Queue: []QueueEntry{}}
	for _, e := range d.Queue {
		out.Queue = append(out.Queue, QueueEntry{Fleet: e.Fleet, Project: e.Project, Position: e.Position, Priority: e.Priority,
			Since: d.Now.Add(-e.Waiting), Reserved: e.Reserved, Reason: e.Reason})
	}
	return out
}
