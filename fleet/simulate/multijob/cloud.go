package multijob

import (
	"fmt"
	"sort"
	"time"

	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/autoscale"
	fplacement "github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers/sim"
	"github.com/fleetd/fleetd/rendezvous"
)

// Cloud is the cloud setting: every GPU is a 1-GPU node bought from a
// spot market replayed from a trace (providers/sim's format), with the
// daemon's on-demand fallback, per-project $/h budgets, and spot
// preemptions when a zone's capacity drops (docs/sim.md).
type Cloud struct {
	Trace *sim.Trace
	// Offset is where the workload's time 0 falls after the trace's start.
	Offset time.Duration
	// Scale: one available instance of a series stands for Scale nodes
	// (the sim provider's capacity_scale; the bundled trace is 0/1).
	Scale int
	// OnDemandPrice is an on-demand node's $/h (default 3.06, p3.2xlarge).
	OnDemandPrice float64
	// SpotPrice is the $/h of series without prices (default 0.918, 30 %
	// of on-demand).
	SpotPrice float64
	// BudgetPerHour caps each project's $/h (0: none). A project is an
	// application: its jobs share its quota and budget.
	BudgetPerHour float64
	// FallbackAfter is the daemon's on_demand_fallback_after (default
	// spec.DefaultFallbackAfter): a job below its min_nodes (1) this long
	// with no spot capacity buys on-demand nodes up to min_nodes.
	FallbackAfter time.Duration
}

// Defaults of the cloud setting.
const (
	DefaultOnDemandPrice = 3.06
	DefaultCapacityScale = 8
)

func (c Cloud) withDefaults() Cloud {
	if c.Scale < 1 {
		c.Scale = DefaultCapacityScale
	}
	if c.OnDemandPrice <= 0 {
		c.OnDemandPrice = DefaultOnDemandPrice
	}
	if c.SpotPrice <= 0 {
		c.SpotPrice = 0.3 * c.OnDemandPrice
	}
	if c.FallbackAfter <= 0 {
		c.FallbackAfter = spec.DefaultFallbackAfter
	}
	return c
}

// node is one bought node: series index, or -1 for on-demand.
type node struct {
	job    *jobState
	series int
	bought time.Duration
}

// market is the trace's spot market during one run.
type market struct {
	c      Cloud
	start  time.Time
	used   []int // spot nodes per series
	nodes  []*node
	fleet  *spec.Fleet
	fb     map[*jobState]*fplacement.FallbackState
	capDec map[*jobState]fplacement.Decision
	now    time.Duration
}

func newMarket(c Cloud) (*market, error) {
	if c.Trace == nil || len(c.Trace.Series) == 0 {
		return nil, fmt.Errorf("cloud setting: no spot trace")
	}
	c = c.withDefaults()
	fl := &spec.Fleet{MinNodes: 1, MaxNodes: 1 << 20}
	fl.Node.Spot = true
	fl.Placement.Fallback, fl.Placement.FallbackAfter = spec.FallbackAfter, c.FallbackAfter
	return &market{c: c, start: c.Trace.Start.Add(c.Offset), used: make([]int, len(c.Trace.Series)), fleet: fl,
		fb: map[*jobState]*fplacement.FallbackState{}, capDec: map[*jobState]fplacement.Decision{}}, nil
}

func (m *market) tick(s *sim.Series) int {
	i := int(m.start.Add(m.now).Sub(s.Start) / s.Tick)
	return min(max(i, 0), len(s.Avail)-1)
}

func (m *market) capacity(i int) int {
	s := m.c.Trace.Series[i]
	return int(s.Avail[m.tick(s)]) * m.c.Scale
}

func (m *market) price(i int) float64 {
	if i < 0 {
		return m.c.OnDemandPrice
	}
	s := m.c.Trace.Series[i]
	if s.Price != nil {
		return s.Price[min(m.tick(s), len(s.Price)-1)]
	}
	if s.Meta.SpotPrice > 0 {
		return s.Meta.SpotPrice
	}
	return m.c.SpotPrice
}

// freeSpot is the spot nodes that can be bought now, cheapest series first.
func (m *market) freeSpot() (order []int, free int) {
	for i := range m.used {
		if f := m.capacity(i) - m.used[i]; f > 0 {
			order = append(order, i)
			free += f
		}
	}
	sort.SliceStable(order, func(a, b int) bool { return m.price(order[a]) < m.price(order[b]) })
	return order, free
}

// ladder is what the next k nodes would cost per hour, cheapest first:
// free spot, then on-demand (the autoscaler's Prices).
func (m *market) ladder(k int) []float64 {
	order, _ := m.freeSpot()
	var out []float64
	for _, i := range order {
		for f := m.capacity(i) - m.used[i]; f > 0 && len(out) < k; f-- {
			out = append(out, m.price(i))
		}
	}
	for len(out) < k {
		out = append(out, m.c.OnDemandPrice)
	}
	return out
}

// preempt takes back the spot nodes above each series' capacity, the
// most recently bought first (as a provider reclaims its newest
// instances first is unknown; this keeps long runs intact).
func (m *market) preempt(res *Result) {
	for i := range m.used {
		over := m.used[i] - m.capacity(i)
		for k := len(m.nodes) - 1; k >= 0 && over > 0; k-- {
			n := m.nodes[k]
			if n.series != i {
				continue
			}
			m.remove(k)
			n.job.gpus--
			n.job.preempted++
			res.Preemptions++
			over--
		}
	}
}

func (m *market) remove(k int) {
	n := m.nodes[k]
	if n.series >= 0 {
		m.used[n.series]--
	}
	m.nodes = append(m.nodes[:k], m.nodes[k+1:]...)
}

// fallback runs the daemon's on-demand fallback (fplacement.DecideCapacity)
// for every live job before the policy decides.
func (m *market) fallback(live []*jobState) {
	_, free := m.freeSpot()
	for _, j := range live {
		st := m.fb[j]
		if st == nil {
			st = &fplacement.FallbackState{}
			m.fb[j] = st
		}
		od := 0
		for _, n := range m.nodes {
			if n.job == j && n.series < 0 {
				od++
			}
		}
		d, next := fplacement.DecideCapacity(fplacement.FallbackInput{Fleet: m.fleet, State: *st, Now: m.start.Add(m.now),
			Live: j.gpus, OnDemandLive: od, SpotViable: free >= 1, SpotOffered: free >= 1})
		*st, m.capDec[j] = next, d
	}
}

// capacityNodes is what the clouds can supply a job now: its nodes, the
// free spot ones and what its fallback allows on-demand (the allocator's
// CapacityNodes; 0 is no limit).
func (m *market) capacityNodes(j *jobState) int {
	d := m.capDec[j]
	if d.OnDemand && d.OnDemandLimit < 0 {
		return 0
	}
	_, free := m.freeSpot()
	c := j.gpus + free
	if d.OnDemand {
		c += d.OnDemandLimit
	}
	return max(c, 1)
}

// projectRate is the $/h a project's nodes cost now.
func (m *market) projectRate(app string) float64 {
	r := 0.0
	for _, n := range m.nodes {
		if n.job.App == app {
			r += m.price(n.series)
		}
	}
	return r
}

// realize buys and releases nodes so every job holds what the policy
// asked (j.gpus) as far as the market, the fallback and the budgets
// allow, and sets j.gpus to what it holds.
func (m *market) realize(live []*jobState) {
	held := map[*jobState]int{}
	for _, n := range m.nodes {
		held[n.job]++
	}
	// Nodes of finished jobs go; then releases: on-demand nodes first,
	// then the priciest spot ones.
	for k := len(m.nodes) - 1; k >= 0; k-- {
		if m.nodes[k].job.done {
			m.remove(k)
		}
	}
	for _, j := range live {
		for held[j] > j.gpus {
			worst := -1
			for k, n := range m.nodes {
				if n.job != j {
					continue
				}
				if worst < 0 || m.worse(n, m.nodes[worst]) {
					worst = k
				}
			}
			m.remove(worst)
			held[j]--
		}
	}
	for _, j := range live {
		want := j.gpus
		d := m.capDec[j]
		od := d.OnDemandLimit
		for held[j] < want {
			order, _ := m.freeSpot()
			series := -1
			if len(order) > 0 && d.Spot {
				series = order[0]
			} else if !d.OnDemand || od == 0 {
				break
			}
			if b := m.c.BudgetPerHour; b > 0 && m.projectRate(j.App)+m.price(series) > b*(1+1e-9) {
				break
			}
			if series < 0 {
				od--
			} else {
				m.used[series]++
			}
			m.nodes = append(m.nodes, &node{job: j, series: series, bought: m.now})
			held[j]++
		}
		j.gpus = held[j]
	}
	m.swap(live)
}

// swap replaces a job's on-demand nodes by free spot ones once spot is
// back, as the daemon's reconciler does (its fallback does not keep
// on-demand): the job restarts on its new nodes (a changeover).
func (m *market) swap(live []*jobState) {
	for _, j := range live {
		if !m.capDec[j].Spot || m.capDec[j].KeepOnDemand {
			continue
		}
		for k := 0; k < len(m.nodes); k++ {
			n := m.nodes[k]
			if n.job != j || n.series >= 0 {
				continue
			}
			order, _ := m.freeSpot()
			if len(order) == 0 {
				return
			}
			n.series, n.bought, j.swapped = order[0], m.now, true
			m.used[order[0]]++
		}
	}
}

// worse: a is released before b (on-demand first, then the pricier).
func (m *market) worse(a, b *node) bool {
	if (a.series < 0) != (b.series < 0) {
		return a.series < 0
	}
	return m.price(a.series) > m.price(b.series)
}

// bill charges an interval of the nodes held.
func (m *market) bill(iv time.Duration, res *Result) {
	for _, n := range m.nodes {
		c := m.price(n.series) * iv.Hours()
		n.job.cost += c
		res.Cost += c
		if n.series < 0 {
			res.OnDemandHours += iv.Hours()
		}
	}
}

// perFleet is today's fleetd without projects: every job a fleet of its
// own, sized alone by the goodput autoscaler (fleet/autoscale.Decide)
// from its measured throughput and the market's prices, with no pool
// between them; only the market and the budgets limit it.
type perFleet struct {
	cfg Config
	m   *market
	st  map[*jobState]*fleetScaler
}

type fleetScaler struct {
	tr    autoscale.Tracker
	state autoscale.State
	round int
	size  int
	since time.Duration // when the round's training began (after the stall)
}

// PerFleetParams are the autoscaler's timings here: those of fleetd
// sim's single-fleet runs (a size judged after 10 minutes, sizes
// changed at most every 30).
var PerFleetParams = autoscale.Params{MeasureFor: 10 * time.Minute, MinInterval: 30 * time.Minute}

func (p *perFleet) decide(now time.Duration, live []*jobState) {
	t := epoch0.Add(now)
	for _, j := range live {
		s := p.st[j]
		if s == nil {
			s = &fleetScaler{}
			p.st[j] = s
		}
		if j.gpus != s.size {
			s.round++
			s.size, s.since = j.gpus, now+j.stall
		}
		if j.gpus > 0 && now > s.since {
			// The workers' progress reports: samples/s at the running size.
			x := j.app.Throughput(j.gpus, p.cfg.PerNode, j.Batch)
			step := int64(j.progress)
			s.tr.Observe(t, autoscale.Round{Number: s.round, Closed: true, Nodes: j.gpus, WorldSize: j.gpus, ClosedAt: epoch0.Add(s.since)},
				&autoscale.Report{ReceivedAt: t, Progress: rendezvous.Progress{Round: s.round, Nodes: j.gpus, WorldSize: j.gpus, Step: step, FirstStep: step,
					SamplesPerSec: x, RateSeconds: (now - s.since).Seconds(), Reports: 3}})
		}
		hi := max(1, int(j.Batch/j.app.MinLocal))
		in := autoscale.Input{Now: t, Policy: autoscale.Goodput, Min: 1, Max: hi, State: s.state, Tracker: &s.tr,
			Round:  autoscale.Round{Number: s.round, Closed: true, Nodes: j.gpus, WorldSize: j.gpus, ClosedAt: epoch0.Add(s.since)},
			Prices: p.m.ladder(hi), Changeover: p.cfg.Changeover, Params: PerFleetParams}
		d := autoscale.Decide(in)
		s.state = d.State
		j.gpus = d.Target
	}
}

// projects are the cloud setting's projects: one per application of the
// workload (sorted), the pool's GPUs split evenly as their quotas (the
// first ones get the remainder), each may borrow up to the whole pool,
// each with the budget's $/h cap.
func (m *market) projects(cfg Config) ([]allocator.Project, func(*jobState) string) {
	var names []string
	seen := map[string]bool{}
	for _, j := range cfg.Jobs {
		if !seen[j.App] {
			seen[j.App] = true
			names = append(names, j.App)
		}
	}
	sort.Strings(names)
	pool := cfg.Nodes * cfg.PerNode
	var out []allocator.Project
	for i, n := range names {
		q := pool / len(names)
		if i < pool%len(names) {
			q++
		}
		out = append(out, allocator.Project{Name: n, QuotaGPUs: q, MaxGPUs: pool, Budget: allocator.Budget{PerHour: m.c.BudgetPerHour}})
	}
	return out, func(j *jobState) string { return j.App }
}
