package multijob

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/fleetd/fleetd/fleet/allocator"
)

// Config is one simulation.
type Config struct {
	Apps map[string]*App
	Jobs []Job
	// Nodes x PerNode GPUs is the fixed pool.
	Nodes, PerNode int
	// Interval is how often the policy decides (Pollux: 60 s).
	Interval time.Duration
	// Changeover is a resize's stall: the job's workers restart from its
	// checkpoint. Default allocator.DefaultRestartChangeover (the
	// daemon's default for restarting fleets); `fleetd sim -workload`
	// uses PolluxChangeover in the fixed pool.
	Changeover time.Duration
	// Params tune the fleetd policies' allocator (zero: its defaults,
	// except Fairness, which defaults to 1, the geometric mean).
	Params allocator.Params
	// Limit ends a run whose jobs have not all finished (default 30 days).
	Limit time.Duration
	// Placement puts a job's GPUs on the fixed pool's nodes: "packed"
	// (the default: as few nodes as the count allows, as if the pool never
	// fragmented) or "nodes" (each node's free GPUs tracked; see place).
	Placement string
	// Cloud, when set, is the cloud setting: the pool's GPUs are 1-GPU
	// nodes bought from a spot market (cloud.go); Nodes x PerNode is then
	// the daemon's max_gpus, split among the projects (one per
	// application) as their quotas.
	Cloud *Cloud
}

// Policies are the policies Run knows.
var Policies = []string{"fifo", "tiresias", "optimus", "fleetd", "fleetd-adaptive"}

// CloudPolicies are the policies of the cloud setting: the fixed pool's
// and per-fleet (every job sized alone by its autoscaler).
var CloudPolicies = append(append([]string{}, Policies...), "per-fleet")

// JobResult is one job's outcome (times from the workload's start).
type JobResult struct {
	Name     string        `json:"name"`
	App      string        `json:"app"`
	Arrival  time.Duration `json:"arrival"`
	Start    time.Duration `json:"start"`
	End      time.Duration `json:"end"`
	Done     bool          `json:"done"`
	Restarts int           `json:"restarts"`
	// Preemptions is its spot nodes taken back; Cost its nodes' $ (the
	// cloud setting).
	Preemptions int     `json:"preemptions,omitempty"`
	Cost        float64 `json:"cost,omitempty"`
	// GPUs is its allocation over time: each change (the last, 0, at its end).
	GPUs []Step `json:"gpus,omitempty"`
}

// Step is a job's GPU count from At on.
type Step struct {
	At   time.Duration `json:"at"`
	GPUs int           `json:"gpus"`
}

// JCT is the job's completion time, arrival to end.
func (r JobResult) JCT() time.Duration { return r.End - r.Arrival }

// Result is one policy's run.
type Result struct {
	Policy     string        `json:"policy"`
	Jobs       []JobResult   `json:"jobs"`
	AvgJCT     time.Duration `json:"avg_jct"`
	P90JCT     time.Duration `json:"p90_jct"`
	P99JCT     time.Duration `json:"p99_jct"`
	Makespan   time.Duration `json:"makespan"`
	Unfinished int           `json:"unfinished"`
	Restarts   int           `json:"restarts"`
	// GPUHours is the GPUs held over time, changeovers included.
	GPUHours float64 `json:"gpu_hours"`
	// The cloud setting: the nodes' $ (spot at the trace's prices,
	// on-demand at its price), per finished job, the on-demand node-hours
	// and the spot nodes preempted.
	Cost          float64 `json:"cost,omitempty"`
	CostPerJob    float64 `json:"cost_per_job,omitempty"`
	OnDemandHours float64 `json:"on_demand_hours,omitempty"`
	Preemptions   int     `json:"preemptions,omitempty"`
}

// jobState is a job during a run.
type jobState struct {
	Job
	app      *App
	progress float64
	gpus     int
	batch    float64
	admitted bool
	started  bool
	start    time.Duration
	end      time.Duration
	done     bool
	stall    time.Duration
	changed  time.Duration
	restarts int
	// preempted counts its spot nodes taken back; cost its nodes' $.
	preempted int
	cost      float64
	// swapped: the market replaced some of its nodes (a restart).
	swapped  bool
	timeline []Step
	// service is the GPU time it has held (Tiresias' attained service).
	service   time.Duration
	target    float64
	maxBatch  float64
	batchMemo map[[2]int]float64
	// on is the GPUs it holds per node of the fixed pool (node index).
	on map[int]int
}

// PolluxChangeover is the stall every reallocation costs a job, under every
// policy, in the simulator that produced Pollux's published averages
// (petuum/adaptdl osdi21-artifact, simulator/simulator.py,
// Job.reallocate: rescale_time = 30). The fixed-pool setting, which is
// compared with those averages, uses it so that both runs pay the same.
const PolluxChangeover = 30 * time.Second

// decider is a policy: each interval it sets every live job's gpus and
// batch (the jobs are in arrival order).
type decider interface {
	decide(now time.Duration, live []*jobState)
}

// Run simulates the workload under a policy.
func Run(cfg Config, policy string) (Result, error) {
	if cfg.Nodes < 1 || cfg.PerNode < 1 {
		return Result{}, fmt.Errorf("pool %dx%d: want at least one node of one GPU", cfg.Nodes, cfg.PerNode)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Changeover <= 0 {
		cfg.Changeover = allocator.DefaultRestartChangeover
	}
	if cfg.Limit <= 0 {
		cfg.Limit = 30 * 24 * time.Hour
	}
	if cfg.Params.Fairness == 0 {
		// The geometric mean: every job here is measured at every size
		// (the application models), so the even split of unmeasured
		// fleets that keeps the daemon at total work does not arise.
		cfg.Params.Fairness = 1
	}
	pool := cfg.Nodes * cfg.PerNode
	var m *market
	if cfg.Cloud != nil {
		var err error
		if m, err = newMarket(*cfg.Cloud); err != nil {
			return Result{}, err
		}
		// Every GPU is a node of its own (the trace's 1-GPU instances).
		cfg.PerNode, cfg.Nodes = 1, pool
	}
	var d decider
	switch policy {
	case "fifo":
		d = fifo{pool: pool}
	case "optimus":
		d = optimus{pool: pool, perNode: cfg.PerNode}
	case "tiresias":
		d = tiresias{pool: pool, threshold: TiresiasThreshold}
	case "fleetd", "fleetd-adaptive":
		d = &fleetd{cfg: cfg, pool: pool, adaptive: policy == "fleetd-adaptive", m: m}
	case "per-fleet":
		if m == nil {
			return Result{}, fmt.Errorf("policy per-fleet: only in the cloud setting (fleets sized alone have no pool to share)")
		}
		d = &perFleet{cfg: cfg, m: m, st: map[*jobState]*fleetScaler{}}
	default:
		want := Policies
		if m != nil {
			want = CloudPolicies
		}
		return Result{}, fmt.Errorf("policy %q: want one of %v", policy, want)
	}
	jobs := make([]*jobState, len(cfg.Jobs))
	for i, j := range cfg.Jobs {
		a := cfg.Apps[j.App]
		if a == nil {
			return Result{}, fmt.Errorf("job %s: no model of application %q", j.Name, j.App)
		}
		if policy == "fleetd-adaptive" {
			a = a.Adapting() // its chosen batches accumulate above the app's limit
		}
		jobs[i] = &jobState{Job: j, app: a, target: a.Target(), batch: j.Batch, maxBatch: max(a.MaxBatch, j.Batch), batchMemo: map[[2]int]float64{}}
	}
	sort.SliceStable(jobs, func(i, k int) bool { return jobs[i].Arrival < jobs[k].Arrival })
	res := Result{Policy: policy}
	var pl *nodePool
	switch cfg.Placement {
	case "", "packed":
	case "nodes":
		if m == nil {
			pl = &nodePool{free: make([]int, cfg.Nodes), per: cfg.PerNode}
			for i := range pl.free {
				pl.free[i] = cfg.PerNode
			}
		}
	default:
		return Result{}, fmt.Errorf("placement %q: want packed or nodes", cfg.Placement)
	}
	iv := cfg.Interval
	left := len(jobs)
	var now time.Duration
	for left > 0 && now <= cfg.Limit {
		var live []*jobState
		for _, j := range jobs {
			if !j.done && j.Arrival <= now {
				live = append(live, j)
			}
		}
		if len(live) == 0 {
			// Idle: jump to the first interval at or after the next arrival.
			for _, j := range jobs {
				if !j.done {
					now = max(now, (j.Arrival+iv-1)/iv*iv)
					break
				}
			}
			continue
		}
		before := make([]int, len(live))
		for i, j := range live {
			before[i] = j.gpus
		}
		if m != nil {
			m.now = now
			m.preempt(&res)
			m.fallback(live)
		}
		d.decide(now, live)
		held := 0
		for _, j := range live {
			held += j.gpus
		}
		if held > pool && policy != "per-fleet" {
			return Result{}, fmt.Errorf("policy %s gave the jobs %d GPUs at %s, more than the pool's %d", policy, held, now, pool)
		}
		if m != nil {
			m.realize(live)
			m.bill(iv, &res)
		}
		if pl != nil {
			pl.place(policy, live, before)
		}
		for i, j := range live {
			if j.gpus == before[i] && !j.swapped {
				continue
			}
			j.swapped = false
			j.changed = now
			if j.gpus > 0 {
				// Every (re)start stalls the job: its workers launch and load
				// the checkpoint.
				j.stall = cfg.Changeover
				if j.started {
					j.restarts++
				} else {
					j.started, j.start = true, now
				}
			}
		}
		for _, j := range live {
			if n := len(j.timeline); n == 0 && j.gpus > 0 || n > 0 && j.timeline[n-1].GPUs != j.gpus {
				j.timeline = append(j.timeline, Step{At: now, GPUs: j.gpus})
			}
			if j.gpus == 0 {
				continue
			}
			res.GPUHours += float64(j.gpus) * iv.Hours()
			j.service += time.Duration(j.gpus) * iv
			run := iv - min(j.stall, iv)
			j.stall -= iv - run
			if run <= 0 {
				continue
			}
			var rate float64
			if pl != nil {
				rate = j.app.GoodputOn(len(j.on), j.gpus, j.batch, j.progress)
			} else {
				rate = j.app.Goodput(j.gpus, cfg.PerNode, j.batch, j.progress)
			}
			if !(rate > 0) {
				continue
			}
			need := j.target - j.progress
			if secs := run.Seconds(); rate*secs < need {
				j.progress += rate * secs
				continue
			}
			j.done, left = true, left-1
			j.end = now + (iv - run) + time.Duration(need/rate*float64(time.Second))
			j.progress, j.gpus = j.target, 0
			if pl != nil {
				pl.release(j)
			}
			j.timeline = append(j.timeline, Step{At: j.end, GPUs: 0})
		}
		now += iv
	}
	var jcts []time.Duration
	for _, j := range jobs {
		r := JobResult{Name: j.Name, App: j.App, Arrival: j.Arrival, Start: j.start, End: j.end, Done: j.done, Restarts: j.restarts,
			Preemptions: j.preempted, Cost: j.cost, GPUs: j.timeline}
		res.Jobs = append(res.Jobs, r)
		res.Restarts += j.restarts
		if !j.done {
			res.Unfinished++
			continue
		}
		jcts = append(jcts, r.JCT())
		res.Makespan = max(res.Makespan, j.end)
	}
	if len(jcts) > 0 {
		var sum time.Duration
		for _, c := range jcts {
			sum += c
		}
		res.AvgJCT = sum / time.Duration(len(jcts))
		sort.Slice(jcts, func(i, k int) bool { return jcts[i] < jcts[k] })
		res.P90JCT = jcts[int(math.Ceil(0.9*float64(len(jcts))))-1]
		res.P99JCT = jcts[int(math.Ceil(0.99*float64(len(jcts))))-1]
		if m != nil {
			res.CostPerJob = res.Cost / float64(len(jcts))
		}
	}
	return res, nil
}

// fifo gives each job its requested GPUs (capped at the pool) in
// arrival order, at its requested batch; the head of the queue waits
// until its GPUs are free and nothing passes it.
type fifo struct{ pool int }

func (p fifo) decide(_ time.Duration, live []*jobState) {
	// A started job keeps its requested GPUs reserved, even while the
	// cloud setting's market supplies fewer (it asks again each interval).
	free := p.pool
	for _, j := range live {
		if j.admitted {
			j.gpus = min(j.Replicas, p.pool)
			free -= j.gpus
		}
	}
	for _, j := range live {
		if j.admitted {
			continue
		}
		want := min(j.Replicas, p.pool)
		if want > free {
			return
		}
		j.gpus, free, j.admitted = want, free-want, true
	}
}

// TiresiasThreshold is the attained service (GPU time) past which a job
// drops to Tiresias' second queue: the artifact's 16 GPU-hours.
const TiresiasThreshold = 16 * time.Hour

// tiresias is 2D-LAS with two priority queues (Gu et al., NSDI 2019):
// jobs that have held less than threshold GPU time come first; within a
// queue, by arrival. Each interval it goes down that order giving each
// job its requested GPUs at its requested batch where they fit,
// skipping those that do not (work-conserving), and preempts a running
// job that no longer fits (it resumes later from its checkpoint, paying
// the changeover).
type tiresias struct {
	pool      int
	threshold time.Duration
}

func (p tiresias) decide(_ time.Duration, live []*jobState) {
	order := slices.Clone(live)
	sort.SliceStable(order, func(a, b int) bool {
		return order[a].service < p.threshold && order[b].service >= p.threshold
	})
	free := p.pool
	for _, j := range order {
		j.gpus = 0
		if want := min(j.Replicas, p.pool); want <= free {
			j.gpus, free = want, free-want
		}
	}
}

// optimus is Optimus+Oracle (Peng et al., EuroSys 2018, with each job's
// remaining work known exactly, as Pollux evaluates it): at requested
// batch sizes, every job in arrival order gets one GPU while any is
// free, then each further GPU goes to the job whose remaining time it
// shortens most, until none shortens any.
type optimus struct{ pool, perNode int }

func (p optimus) decide(_ time.Duration, live []*jobState) {
	left := func(j *jobState, n int) float64 {
		if n <= 0 {
			return math.Inf(1)
		}
		return (j.target - j.progress) / j.app.Goodput(n, p.perNode, j.Batch, j.progress)
	}
	free := p.pool
	for _, j := range live {
		j.gpus = 0
		if free > 0 {
			j.gpus, free = 1, free-1
		}
	}
	for ; free > 0; free-- {
		var best *jobState
		gain := 0.0
		for _, j := range live {
			if j.gpus == 0 || j.gpus >= max(1, min(p.pool, int(j.Batch/j.app.MinLocal))) {
				continue
			}
			if g := left(j, j.gpus) - left(j, j.gpus+1); g > gain {
				best, gain = j, g
			}
		}
		if best == nil {
			return
		}
		best.gpus++
	}
}

// fleetd is fleet/allocator.Decide over the jobs: one project holding
// the whole pool, every job a fleet of 1-GPU nodes (min 1) whose curve
// is its goodput at each GPU count, packed on the pool's nodes. At its
// requested batch unless adaptive: then each GPU count's batch is the
// one of most goodput (docs/sim.md).
type fleetd struct {
	cfg      Config
	pool     int
	adaptive bool
	// m is the cloud setting's market (nil: the fixed pool).
	m *market
}

var epoch0 = time.Date(2021, 7, 14, 0, 0, 0, 0, time.UTC)

func (p *fleetd) decide(now time.Duration, live []*jobState) {
	in := allocator.Input{Now: epoch0.Add(now), PoolGPUs: p.pool, Params: p.cfg.Params,
		Projects: []allocator.Project{{Name: "jobs", QuotaGPUs: p.pool, MaxGPUs: p.pool}}}
	project := func(*jobState) string { return "jobs" }
	if p.m != nil {
		in.Projects, project = p.m.projects(p.cfg)
	}
	for _, j := range live {
		f := allocator.Fleet{Name: j.Name, Project: project(j), GPUsPerNode: 1, MinNodes: 1, MaxNodes: p.maxGPUs(j),
			Current: j.gpus, Running: j.admitted, Arrival: epoch0.Add(j.Arrival),
			Curve: curve{p: p, j: j}, Change: allocator.Change{Changeover: p.cfg.Changeover}, Resizes: j.restarts}
		if p.m != nil {
			f.CapacityNodes = p.m.capacityNodes(j)
			f.PricePerNodeHour = p.m.ladder(1)[0]
		}
		if j.started {
			f.LastChange = epoch0.Add(j.changed)
		}
		if p.m == nil && p.cfg.Placement == "nodes" && p.cfg.PerNode > 1 {
			f.Sizes = allocator.AlignedSizes(p.cfg.PerNode, f.MaxNodes)
		}
		in.Fleets = append(in.Fleets, f)
	}
	dec := allocator.Decide(in)
	for _, j := range live {
		a, ok := dec.Fleet(j.Name)
		if !ok || a.Action != allocator.Run {
			continue
		}
		j.admitted, j.gpus = true, a.To
		j.batch = p.batch(j, a.To)
	}
}

// maxGPUs: a job's per-GPU batch stays within the measured ones.
func (p *fleetd) maxGPUs(j *jobState) int {
	m := j.Batch
	if p.adaptive {
		m = j.maxBatch
	}
	return max(1, min(p.pool, int(m/j.app.MinLocal)))
}

// batch is the global batch the job runs at on n GPUs: the requested
// one, or (adaptive) the one of most goodput on a grid of quarter
// powers of two between M0 and the largest validated batch; a per-GPU
// share above what one micro-batch holds accumulates, as AdaptDL's
// search allows (memoized per epoch, as the noise scale changes per
// epoch).
func (p *fleetd) batch(j *jobState, n int) float64 {
	if !p.adaptive || n <= 0 {
		return j.Batch
	}
	key := [2]int{n, int(j.progress / j.app.EpochSize)}
	if b, ok := j.batchMemo[key]; ok {
		return b
	}
	a := j.app
	lo, hi := max(a.M0, float64(n)*a.MinLocal), j.maxBatch
	best, bestG := j.Batch, -1.0
	for k := 0; ; k++ {
		m := a.M0 * math.Exp2(float64(k)/4)
		if m > hi*(1+1e-9) {
			break
		}
		if m < lo*(1-1e-9) {
			continue
		}
		if g := a.Goodput(n, p.cfg.PerNode, m, j.progress); g > bestG {
			best, bestG = m, g
		}
	}
	if bestG < 0 {
		best = min(max(j.Batch, lo), hi)
	}
	j.batchMemo[key] = best
	return best
}

// curve is a job's goodput per GPU count, as the allocator reads it.
type curve struct {
	p *fleetd
	j *jobState
}

func (c curve) Throughput(n int) (float64, bool) {
	if n < 1 {
		return 0, false
	}
	g := c.j.app.Goodput(n, c.p.cfg.PerNode, c.p.batch(c.j, n), c.j.progress)
	return g, g > 0
}

// nodePool is the fixed pool's free GPUs per node, of per GPUs each.
type nodePool struct {
	free []int
	per  int
}

// place releases the GPUs of every job whose count changed and places
// them again. The gang baselines take GPUs as the published simulator's
// Tiresias does (tiresias.py: from the node with the most free GPUs,
// node after node), which spreads a job over nodes when the pool is
// fragmented; fleetd's policies take the node that fits the job with
// the fewest GPUs to spare (best fit) and spread only when no node
// holds the job.
func (p *nodePool) place(policy string, live []*jobState, before []int) {
	var moved []*jobState
	for i, j := range live {
		if j.gpus == before[i] && (j.gpus == 0 || len(j.on) > 0) {
			continue
		}
		p.release(j)
		if j.gpus > 0 {
			moved = append(moved, j)
		}
	}
	bestFit := policy == "fleetd" || policy == "fleetd-adaptive"
	if bestFit {
		// Largest first: the classic order for fitting bins.
		sort.SliceStable(moved, func(a, b int) bool { return moved[a].gpus > moved[b].gpus })
	}
	for _, j := range moved {
		j.on = map[int]int{}
		need := j.gpus
		if bestFit && need <= p.per {
			if n := p.defragment(need, live, moved); n >= 0 {
				p.free[n] -= need
				j.on[n] = need
				continue
			}
		}
		for need > 0 {
			n := p.pick(need, bestFit)
			take := min(need, p.free[n])
			p.free[n] -= take
			j.on[n] += take
			need -= take
		}
	}
}

// defragment makes one node hold need GPUs when none does but moving
// jobs that sit whole on one node elsewhere would free it (fleetd's
// policies only): the moved jobs restart (a changeover each), which is
// cheaper than a job split over nodes for as long as it holds its size.
// It returns the node, or -1 when none can be freed that way (or one
// already fits: then pick finds it).
func (p *nodePool) defragment(need int, live, moving []*jobState) int {
	for _, f := range p.free {
		if f >= need {
			return -1
		}
	}
	// The jobs that may move: placed, not changing this pass, whole on
	// one node; smallest first, so the fewest GPUs move.
	var movable []*jobState
	for _, j := range live {
		if len(j.on) == 1 && j.gpus > 0 && !slices.Contains(moving, j) {
			movable = append(movable, j)
		}
	}
	sort.SliceStable(movable, func(a, b int) bool { return movable[a].gpus < movable[b].gpus })
	nodes := make([]int, len(p.free))
	for i := range nodes {
		nodes[i] = i
	}
	// Try the fullest-free nodes first: the fewest GPUs to move.
	sort.SliceStable(nodes, func(a, b int) bool { return p.free[nodes[a]] > p.free[nodes[b]] })
	for _, n := range nodes {
		free := slices.Clone(p.free)
		var plan [][2]int // job index in movable → destination node
		for i, j := range movable {
			if free[n] >= need {
				break
			}
			if j.on[n] == 0 {
				continue
			}
			dst := -1
			for m, f := range free {
				if m != n && f >= j.gpus && (dst < 0 || f < free[dst]) {
					dst = m
				}
			}
			if dst < 0 {
				continue
			}
			free[dst] -= j.gpus
			free[n] += j.gpus
			plan = append(plan, [2]int{i, dst})
		}
		if free[n] < need {
			continue
		}
		for _, mv := range plan {
			j := movable[mv[0]]
			p.release(j)
			p.free[mv[1]] -= j.gpus
			j.on = map[int]int{mv[1]: j.gpus}
			j.swapped = true
		}
		return n
	}
	return -1
}

func (p *nodePool) release(j *jobState) {
	for n, g := range j.on {
		p.free[n] += g
	}
	j.on = nil
}

// pick is the node the next GPUs come from; the pool always has room
// (Run checks the policy stays within it). Best fit takes the node that
// holds all the job still needs with the fewest to spare; otherwise, as
// the gang baselines always do, the node with the most free GPUs.
func (p *nodePool) pick(need int, bestFit bool) int {
	best := -1
	if bestFit {
		for n, f := range p.free {
			if f >= need && (best < 0 || f < p.free[best]) {
				best = n
			}
		}
		if best >= 0 {
			return best
		}
	}
	for n, f := range p.free {
		if f > 0 && (best < 0 || f > p.free[best]) {
			best = n
		}
	}
	return best
}
