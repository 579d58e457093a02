// Package allocator decides, each pass, how many nodes every fleet of a
// daemon gets: within the projects' quotas and borrowing ceilings, their
// budgets, the pool (max_gpus) and what the clouds can supply; which
// fleets wait in the queue and why; and which nodes a shrinking fleet
// gives up. docs/projects.md explains the rule.
//
// It is pure: no I/O, no clock (Input.Now is the time), no state of its
// own (what it must remember between passes comes back in the Input:
// each fleet's current nodes and last change). The daemon feeds it its
// fleets and the budget ledger's states; `fleetd sim -workload` feeds it
// simulated ones, so both run this same code.
package allocator

import (
	"slices"
	"time"

	"github.com/fleetd/fleetd/fleet/budget"
)

// Curve is a fleet's measured throughput per node count (samples/s, or
// goodput where the caller knows statistical efficiency). The
// autoscaler's fitted autoscale.Model is one (CurveFromPoints builds it
// from a tracker's points); false means the curve cannot say at n.
type Curve interface {
	Throughput(nodes int) (float64, bool)
}

// Params tune the decision; zero fields take the defaults.
type Params struct {
	// Horizon is how long an allocation is expected to hold at most: a
	// change's cost (the stall of the fleet it resizes) is spread over
	// it, or over the fleet's own mean time between resizes so far
	// (Fleet.Resizes) when that is shorter.
	Horizon time.Duration `json:"horizon"`
	// Hysteresis: the nodes a fleet already runs count this much more
	// than nodes it would gain, so small throughput differences (noise)
	// move nothing.
	Hysteresis float64 `json:"hysteresis"`
	// MinInterval: a fleet resized less than this long ago keeps its
	// nodes unless another project's guarantee needs them.
	MinInterval time.Duration `json:"min_interval"`
	// RestartChangeover and InProcessChangeover are a resize's stall
	// when the fleet does not say (Change.Changeover).
	RestartChangeover   time.Duration `json:"restart_changeover"`
	InProcessChangeover time.Duration `json:"in_process_changeover"`
	// RestoreGBPerSec is how fast a restarted worker loads its
	// checkpoint: a restart's stall grows with the checkpoint.
	RestoreGBPerSec float64 `json:"restore_gb_per_sec"`
	// AgingEvery: a queued fleet's priority rises by one per this wait.
	AgingEvery time.Duration `json:"aging_every"`
	// ReserveAfter: a queued fleet that has waited this long holds its
	// place: fleets behind it in its project no longer start past it.
	ReserveAfter time.Duration `json:"reserve_after"`
	// PriorityDoubling: a fleet's goodput weighs twice as much per this
	// many priority points.
	PriorityDoubling float64 `json:"priority_doubling"`
	// Fairness sets the generalized (power) mean of the fleets' speedups
	// that the allocation maximizes, as Pollux's fitness does, through
	// its exponent p = 1 − Fairness (docs/projects.md). 0, the default,
	// is total work (p = 1: a GPU goes where it adds the most); 1 is the
	// geometric mean (Σ log s: proportional fairness, which no fleet's
	// unit of throughput can tilt; `fleetd sim -workload` runs it); 2 is
	// Pollux's p = −1. Above 0, fleets whose larger sizes are not measured
	// yet (assumed linear) split the GPUs evenly and so never measure
	// them: the daemon keeps total work unless told otherwise.
	Fairness float64 `json:"fairness"`
}

// power is the exponent of the mean the allocation maximizes.
func (p Params) power() float64 { return 1 - p.Fairness }

// Defaults.
const (
	DefaultHorizon             = 30 * time.Minute
	DefaultHysteresis          = 0.1
	DefaultMinInterval         = 5 * time.Minute
	DefaultRestartChangeover   = time.Minute
	DefaultInProcessChangeover = 10 * time.Second
	DefaultRestoreGBPerSec     = 0.5
	DefaultAgingEvery          = 10 * time.Minute
	DefaultReserveAfter        = 30 * time.Minute
	DefaultPriorityDoubling    = 10
)

// WithDefaults fills zero fields.
func (p Params) WithDefaults() Params {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&p.Horizon, DefaultHorizon)
	def(&p.MinInterval, DefaultMinInterval)
	def(&p.RestartChangeover, DefaultRestartChangeover)
	def(&p.InProcessChangeover, DefaultInProcessChangeover)
	def(&p.AgingEvery, DefaultAgingEvery)
	def(&p.ReserveAfter, DefaultReserveAfter)
	if p.Hysteresis <= 0 {
		p.Hysteresis = DefaultHysteresis
	}
	if p.RestoreGBPerSec <= 0 {
		p.RestoreGBPerSec = DefaultRestoreGBPerSec
	}
	if p.PriorityDoubling <= 0 {
		p.PriorityDoubling = DefaultPriorityDoubling
	}
	return p
}

// Budget is where a project's or a fleet's budget stands (the ledger's
// budget.Status) and what it allows.
type Budget struct {
	// State is the ledger's; "" is budget.OK.
	State budget.State `json:"state,omitempty"`
	// PerHour is the $/h cap (0: none): nodes are added only while the
	// allocation's $/h stays within it.
	PerHour float64 `json:"per_hour,omitempty"`
	// OnExhausted applies in state budget.Exhausted ("" is pause).
	OnExhausted budget.Action `json:"on_exhausted,omitempty"`
	// Reason is the ledger's words for the state.
	Reason string `json:"reason,omitempty"`
}

// Project is one project as the allocator sees it.
type Project struct {
	Name      string `json:"name"`
	QuotaGPUs int    `json:"quota_gpus"`
	MaxGPUs   int    `json:"max_gpus"`
	Priority  int    `json:"priority,omitempty"`
	// Unlimited: the implicit default project; its fleets are sized as
	// without projects, outside the pool.
	Unlimited bool   `json:"unlimited,omitempty"`
	Budget    Budget `json:"budget"`
}

// Node is one of a fleet's live nodes.
type Node struct {
	ID string `json:"id"`
	// Rank0 marks the node holding rank 0 (the master): it goes last.
	Rank0        bool      `json:"rank0,omitempty"`
	OnDemand     bool      `json:"on_demand,omitempty"`
	PricePerHour float64   `json:"price_per_hour,omitempty"`
	Since        time.Time `json:"since,omitzero"`
}

// Change is what resizing a fleet costs it.
type Change struct {
	// InProcess: the workers follow a new world size without restarting
	// (training.elastic = "in-process"); else they restart from their
	// checkpoint.
	InProcess bool `json:"in_process,omitempty"`
	// Changeover is the measured stall of a resize; 0 uses the defaults.
	Changeover time.Duration `json:"changeover,omitempty"`
	// CheckpointGB is the checkpoint a restart loads.
	CheckpointGB float64 `json:"checkpoint_gb,omitempty"`
}

// Fleet is one fleet as the allocator sees it.
type Fleet struct {
	// Name is unique among the input's fleets.
	Name    string `json:"name"`
	Project string `json:"project"`
	// GPUsPerNode: 0 is a CPU-only fleet (outside the pool).
	GPUsPerNode int `json:"gpus_per_node"`
	MinNodes    int `json:"min_nodes"`
	MaxNodes    int `json:"max_nodes"`
	// Want is the most nodes the fleet would use (its autoscaler's choice
	// or desired_nodes); 0 means MaxNodes.
	Want int `json:"want,omitempty"`
	// Current is its live nodes; Running says it was admitted (it holds
	// its min_nodes, or is getting them back after interruptions): the
	// caller sets it once a decision said run and keeps it (persisted)
	// until the fleet ends or pauses. A fleet neither running nor paused
	// is in the queue.
	Current int  `json:"current"`
	Running bool `json:"running"`
	// Paused: paused until `fleetd resume`, or, when PausedByBudget,
	// until no budget of it is exhausted any more (a raised budget): then
	// it queues to start again.
	Paused         bool   `json:"paused,omitempty"`
	PausedByBudget bool   `json:"paused_by_budget,omitempty"`
	Nodes          []Node `json:"nodes,omitempty"`
	// Priority orders the queue and weights the fleet's goodput.
	Priority int `json:"priority,omitempty"`
	// Arrival is when it was applied (or resumed): its place in the queue.
	Arrival time.Time `json:"arrival"`
	// Curve is its measured throughput; nil: not measured yet (linear
	// scaling is assumed, and the reasons say so).
	Curve            Curve   `json:"-"`
	PricePerNodeHour float64 `json:"price_per_node_hour,omitempty"`
	Change           Change  `json:"change"`
	// LastChange is when its size last changed (MinInterval).
	LastChange time.Time `json:"last_change,omitzero"`
	// CapacityNodes is the most nodes the clouds can supply it now, its
	// live ones included; 0: no known limit.
	CapacityNodes int    `json:"capacity_nodes,omitempty"`
	Budget        Budget `json:"budget"`
	// ServedGPUHours is the GPU-hours it has held since it was applied.
	// Resizes is how many times its live size changed since Arrival
	// (each a restart or an in-process handover, interruptions
	// included): a fleet resized often gets less from another resize,
	// as it holds each size less long (Params.Horizon).
	Resizes int `json:"resizes,omitempty"`
	// Sizes, when set, are the only node counts the fleet may be given
	// (ascending), e.g. the counts that place without fragments on
	// machines of several GPUs (AlignedSizes); nil: every count between
	// its bounds.
	Sizes []int `json:"sizes,omitempty"`
}

// AlignedSizes are the counts of 1-GPU workers that fit machines of
// perMachine GPUs without fragments, up to most: powers of two within
// one machine (they pack like a buddy allocator), whole machines beyond
// (Pollux's truncated search space, which keeps a distributed job on
// whole nodes).
func AlignedSizes(perMachine, most int) []int {
	var out []int
	for n := 1; n <= min(perMachine, most); n *= 2 {
		out = append(out, n)
	}
	if out != nil && out[len(out)-1] != perMachine && perMachine <= most {
		out = append(out, perMachine)
	}
	for n := 2 * perMachine; n <= most; n += perMachine {
		out = append(out, n)
	}
	return out
}

// allowed reports whether the fleet may run at n nodes.
func (f *Fleet) allowed(n int) bool {
	if len(f.Sizes) == 0 || n == 0 {
		return true
	}
	_, ok := slices.BinarySearch(f.Sizes, n)
	return ok
}

// Input is everything one decision looks at.
type Input struct {
	Now time.Time `json:"now"`
	// PoolGPUs is the daemon's max_gpus (the sum of the quotas by default).
	PoolGPUs int       `json:"pool_gpus"`
	Projects []Project `json:"projects"`
	Fleets   []Fleet   `json:"fleets"`
	Params   Params    `json:"params"`
}

// Action is what a fleet is to do.
type Action string

const (
	// Run at Allocation.To nodes (starting, growing, shrinking or holding).
	Run Action = "run"
	// Queue: wait; it cannot get its min_nodes now.
	Queue Action = "queue"
	// Pause: checkpoint, release every node, keep the fleet (budget).
	Pause Action = "pause"
	// Stop: end the fleet, checkpoints kept (budget, on_exhausted = "stop").
	Stop Action = "stop"
	// Paused: stays paused until resumed.
	Paused Action = "paused"
)

// Allocation is one fleet's decision.
type Allocation struct {
	Fleet   string `json:"fleet"`
	Project string `json:"project"`
	Action  Action `json:"action"`
	// From is its live nodes, To its target.
	From int `json:"from"`
	To   int `json:"to"`
	// Remove names the nodes to drain when To < From, in order (never the
	// rank-0 node while another can go). Empty when the input listed no
	// nodes: then the rule is the same (Removal).
	Remove []string `json:"remove,omitempty"`
	// Kind is a keyword: start, grow, shrink, reclaim, hold, budget-cap,
	// budget-exhausted, queued, paused, unlimited, no-project.
	Kind string `json:"kind"`
	// Reason says why, for humans.
	Reason string `json:"reason"`
}

// QueueEntry is a waiting fleet.
type QueueEntry struct {
	Fleet   string `json:"fleet"`
	Project string `json:"project"`
	// Position is 1-based over the whole queue, in the order fleets start.
	Position int `json:"position"`
	// Priority is the fleet's with its project's and aging added.
	Priority int           `json:"priority"`
	Waiting  time.Duration `json:"waiting"`
	// Reserved: it has waited ReserveAfter; nothing behind it in its
	// project starts first.
	Reserved bool   `json:"reserved,omitempty"`
	Reason   string `json:"reason"`
}

// ProjectUse is a project's GPUs after the decision.
type ProjectUse struct {
	Name      string `json:"name"`
	QuotaGPUs int    `json:"quota_gpus"`
	MaxGPUs   int    `json:"max_gpus"`
	// UsedGPUs is what its fleets are allocated; Borrowed the part above
	// its quota; Lent the part of its quota other projects use.
	UsedGPUs     int     `json:"used_gpus"`
	BorrowedGPUs int     `json:"borrowed_gpus"`
	LentGPUs     int     `json:"lent_gpus"`
	Queued       int     `json:"queued"`
	PerHour      float64 `json:"per_hour"`
	Budget       Budget  `json:"budget"`
}

// Decision is one pass's outcome.
type Decision struct {
	Now      time.Time    `json:"now"`
	PoolGPUs int          `json:"pool_gpus"`
	UsedGPUs int          `json:"used_gpus"`
	Fleets   []Allocation `json:"fleets"`
	Queue    []QueueEntry `json:"queue,omitempty"`
	Projects []ProjectUse `json:"projects"`
}

// Fleet returns the named fleet's allocation.
func (d *Decision) Fleet(name string) (Allocation, bool) {
	for _, a := range d.Fleets {
		if a.Fleet == name {
			return a, true
		}
	}
	return Allocation{}, false
}
