package allocator

import (
	"math"
	"sort"
	"time"

	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/budget"
)

// CurveFromPoints fits the autoscaler's model to a fleet's throughput
// observations (autoscale.Tracker.Points); nil without any usable one.
func CurveFromPoints(points []autoscale.Point) Curve {
	m, ok := autoscale.Fit(points)
	if !ok {
		return nil
	}
	return m
}

// pstate is a project during one decision.
type pstate struct {
	in    Project
	known bool
	// used is the GPUs its admitted fleets hold in the tentative
	// allocation; mins the part that is their min_nodes; before what its
	// fleets held at the start of the pass.
	used, mins, before int
	// perHour is the tentative allocation's $/h.
	perHour float64
	weight  float64
	// dollars: its $/h cap, not its GPUs, limits it: growth is ranked per
	// dollar.
	dollars bool
	queued  int
	// blocked is why its queued fleets may not start past a reserved one.
	blocked string
	fleets  []*fstate
}

func (p *pstate) quota() int { return p.in.QuotaGPUs }

func (p *pstate) ceiling() int { return max(p.in.MaxGPUs, p.in.QuotaGPUs) }

// fstate is a fleet during one decision.
type fstate struct {
	in   *Fleet
	proj *pstate
	// g is the GPUs per node.
	g int
	// lo, hi bound its nodes; n is the tentative allocation.
	lo, hi, n int
	// capBy says what set hi below max_nodes ("" none).
	capBy string
	// managed: it takes part in the fill (admitted, in the pool).
	managed bool
	started bool
	// resumed: paused by a budget that is no longer exhausted.
	resumed bool
	// incumbent is its live nodes when they count as kept (a running
	// fleet), -1 otherwise (no change cost).
	incumbent int
	settling  bool
	penalty   float64
	weight    float64
	// xs[n] is the throughput at n nodes (index 0 unused); assumed says
	// some of it is extrapolated, not measured.
	xs      []float64
	assumed bool
	noGrow  string
	alloc   Allocation
}

type alloc struct {
	in       Input
	p        Params
	projects map[string]*pstate
	order    []*pstate // by name
	fleets   []*fstate
	pool     int
	queue    []QueueEntry
}

// Decide makes one pass's decision. Pure: the same input gives the same
// decision.
func Decide(in Input) Decision {
	a := &alloc{in: in, p: in.Params.WithDefaults(), projects: map[string]*pstate{}, pool: in.PoolGPUs}
	for _, p := range in.Projects {
		ps := &pstate{in: p, known: true, weight: a.weightOf(p.Priority)}
		a.projects[p.Name] = ps
		a.order = append(a.order, ps)
	}
	if a.pool <= 0 {
		for _, p := range in.Projects {
			if !p.Unlimited {
				a.pool += p.QuotaGPUs
			}
		}
	}
	for i := range in.Fleets {
		a.fleets = append(a.fleets, a.newFleet(&in.Fleets[i]))
	}
	sort.Slice(a.order, func(i, j int) bool { return a.order[i].in.Name < a.order[j].in.Name })
	a.gate()
	a.admit()
	a.markDollarLimited()
	a.fill(true)
	a.fill(false)
	return a.finish()
}

func (a *alloc) weightOf(priority int) float64 {
	return math.Exp2(float64(priority) / a.p.PriorityDoubling)
}

func (a *alloc) newFleet(f *Fleet) *fstate {
	fs := &fstate{in: f, g: max(f.GPUsPerNode, 0), weight: a.weightOf(f.Priority), incumbent: -1}
	ps := a.projects[f.Project]
	if ps == nil {
		// A project deleted while its fleets run: they keep what they hold
		// and grow no more (nothing is lost); new ones wait.
		ps = &pstate{in: Project{Name: f.Project}, weight: 1}
		a.projects[f.Project] = ps
		a.order = append(a.order, ps)
	}
	fs.proj = ps
	ps.fleets = append(ps.fleets, fs)
	top := max(f.MaxNodes, f.Current, f.MinNodes, 1)
	fs.xs = make([]float64, top+1)
	for n := 1; n <= top; n++ {
		fs.xs[n] = fs.throughput(n, top)
	}
	if f.Running && f.Current > 0 {
		fs.incumbent = f.Current
	}
	return fs
}

// throughput is the curve at n, or extrapolated linearly from the
// nearest size it knows (or plain node count without a curve).
func (f *fstate) throughput(n, top int) float64 {
	ok := func(v float64) bool { return v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) }
	c := f.in.Curve
	if c != nil {
		if v, k := c.Throughput(n); k && ok(v) {
			return v
		}
		for d := 1; d <= top; d++ {
			for _, m := range []int{n - d, n + d} {
				if m < 1 || m > top {
					continue
				}
				if v, k := c.Throughput(m); k && ok(v) {
					f.assumed = true
					return v * float64(n) / float64(m)
				}
			}
		}
	}
	f.assumed = true
	return float64(n)
}

func (f *fstate) x(n int) float64 {
	if n <= 0 {
		return 0
	}
	if n >= len(f.xs) {
		return f.xs[len(f.xs)-1] * float64(n) / float64(len(f.xs)-1)
	}
	return f.xs[n]
}

// s is the fleet's work at n nodes in GPU-equivalents: its throughput
// over one node's, times its GPUs per node. Linear scaling gives one
// per GPU, so fleets whose samples are not comparable are.
func (f *fstate) s(n int) float64 {
	return float64(max(f.g, 1)) * f.x(n) / f.x(1)
}

func (f *fstate) name() string { return f.in.Project + "/" + f.in.Name }

// price is the fleet's $/h per node.
func (f *fstate) price() float64 { return f.in.PricePerNodeHour }

// stall is how long a resize stops the fleet's training.
func (a *alloc) stall(f *Fleet) time.Duration {
	if f.Change.Changeover > 0 {
		return f.Change.Changeover
	}
	if f.Change.InProcess {
		return a.p.InProcessChangeover
	}
	return a.p.RestartChangeover + time.Duration(f.Change.CheckpointGB/a.p.RestoreGBPerSec*float64(time.Second))
}

// u is the fleet's utility at n nodes: its speedup s(n) through the
// power p of the generalized mean the allocation maximizes (log s at
// p = 0, s^p / p otherwise; s itself at p = 1). Summed over fleets, the
// greedy fill maximizes that mean; below p = 1 a GPU is worth more to a
// fleet far below its speedup than the same added work is to one
// already fast, and at p = 0 a fleet's gain is relative (Δs / s), so
// its unit of throughput does not matter.
func (a *alloc) u(f *fstate, n int) float64 {
	s, p := f.s(n), a.p.power()
	switch {
	case p == 1:
		return s
	case s <= 0:
		return math.Inf(-1)
	case p == 0:
		return math.Log(s)
	}
	return math.Pow(s, p) / p
}

// gain is the value of taking the fleet from n to m nodes: the utility
// it adds (priority-weighted), with the nodes it already runs counting
// Hysteresis more (and much more while it settles), less the resize's
// stall spread over the horizon, or plus it when the step returns to the
// live size (no resize at all).
func (a *alloc) gain(f *fstate, n, m int) float64 {
	v := f.weight * (a.u(f, m) - a.u(f, n))
	c := f.incumbent
	if c > n {
		k := min(m, c)
		v += f.weight * (a.u(f, k) - a.u(f, n)) * a.p.Hysteresis
		if f.settling {
			v += 1e6 * float64(k-n)
		}
	}
	if c > 0 {
		switch {
		case m == c && n < c:
			v += f.penalty
		case n == c && m > c:
			v -= f.penalty
		}
	}
	return v
}

// stallCost is what losing the fraction frac of its work over the time
// an allocation holds costs a fleet at n nodes: u(s) − u(s·(1−frac)) to
// first order, s^p · frac (s · frac at p = 1, frac at p = 0).
func (a *alloc) stallCost(f *fstate, n int, frac float64) float64 {
	return f.weight * math.Pow(f.s(n), a.p.power()) * frac
}

// holds is how long the fleet's next allocation is expected to hold:
// its mean time between resizes, estimated from its own since it
// arrived with one resize per Horizon as the prior ((age + Horizon) /
// (resizes + 1)), at most the Horizon. This is Pollux's restart penalty
// (its speedup factor (age − r·d) / (age + d) after r restarts of stall
// d charges (r+1)·d over the job's age) read as an expected hold time; the
// prior keeps a fleet only seconds old, with no history to go by, from
// being priced as if it changed every few seconds.
func (a *alloc) holds(f *Fleet) time.Duration {
	if f.Arrival.IsZero() {
		return a.p.Horizon
	}
	age := max(a.in.Now.Sub(f.Arrival), 0)
	return min(a.p.Horizon, (age+a.p.Horizon)/time.Duration(max(f.Resizes, 0)+1))
}

// gate applies what is decided before any GPU is shared out: paused
// fleets, budgets, unknown and unlimited projects, and each fleet's
// bounds.
func (a *alloc) gate() {
	for _, f := range a.fleets {
		in := f.in
		al := &f.alloc
		*al = Allocation{Fleet: in.Name, Project: in.Project, From: in.Current}
		pb := f.proj.in.Budget
		exhausted := in.Budget.State == budget.Exhausted || pb.State == budget.Exhausted
		f.resumed = in.Paused && in.PausedByBudget && !exhausted
		switch {
		case in.Paused && !f.resumed:
			al.Action, al.Kind = Paused, "paused"
			al.Remove = removeAll(in.Nodes)
			al.Reason = a.pausedWhy(f)
			continue
		case exhausted:
			b, whose := in.Budget, "its"
			if in.Budget.State != budget.Exhausted {
				b, whose = pb, "project "+in.Project+"'s"
			}
			al.Action, al.Kind = Pause, "budget-exhausted"
			if b.OnExhausted == budget.Stop {
				al.Action = Stop
			}
			al.Remove = removeAll(in.Nodes)
			al.Reason = a.exhaustedWhy(f, b, whose)
			continue
		}
		switch {
		case in.Budget.State == budget.Capped:
			f.noGrow = "its budget " + in.Budget.Reason
		case pb.State == budget.Capped:
			f.noGrow = "project " + in.Project + "'s budget " + pb.Reason
		}
		f.lo = max(in.MinNodes, 1)
		f.hi = max(in.MaxNodes, f.lo)
		if in.Want > 0 && in.Want < f.hi {
			f.hi, f.capBy = max(in.Want, f.lo), "want"
		}
		if in.CapacityNodes > 0 && max(in.CapacityNodes, in.Current) < f.hi {
			f.hi, f.capBy = max(in.CapacityNodes, in.Current, f.lo), "capacity"
		}
		if f.noGrow != "" && max(in.Current, f.lo) < f.hi {
			f.hi, f.capBy = max(in.Current, f.lo), "budget"
		}
		switch {
		case !f.proj.known:
			if in.Running && in.Current > 0 {
				// Kept as is, outside every quota: the pool still counts it.
				f.lo, f.hi, f.n, f.managed = in.Current, in.Current, in.Current, true
				f.proj.used += in.Current * f.g
				f.proj.mins += in.Current * f.g
				al.Action, al.Kind = Run, "no-project"
				al.Reason = a.noProjectWhy(f)
			} else {
				al.Action, al.Kind = Queue, "no-project"
				al.Reason = "project " + in.Project + " does not exist: name one of the daemon's projects in the spec"
				a.enqueue(f, al.Reason, false)
			}
			continue
		case (f.proj.in.Unlimited || f.g == 0) && f.noGrow != "" && !in.Running:
			al.Action, al.Kind = Queue, "queued"
			a.enqueue(f, "budget: "+f.noGrow, false)
			continue
		case f.proj.in.Unlimited || f.g == 0:
			// Sized as without projects: the default project when not
			// declared, and CPU-only fleets (the pool counts GPUs).
			f.n = f.hi
			al.Action, al.Kind = Run, "unlimited"
			al.Reason = a.unlimitedWhy(f)
			continue
		}
		f.proj.before += in.Current * f.g
		if in.Running {
			f.managed, f.n = true, f.lo
			f.proj.used += f.lo * f.g
			f.proj.mins += f.lo * f.g
			f.proj.perHour += float64(f.lo) * f.price()
			f.settling = in.Current > 0 && !in.LastChange.IsZero() && a.in.Now.Sub(in.LastChange) < a.p.MinInterval
			if f.incumbent > 0 {
				f.penalty = a.stallCost(f, f.incumbent, min(a.stall(in).Hours()/a.holds(in).Hours(), 1))
			}
		}
	}
}

// markDollarLimited finds the projects whose $/h cap binds before their
// GPUs do: what their fleets want costs more than the cap allows.
func (a *alloc) markDollarLimited() {
	for _, p := range a.order {
		if p.in.Budget.PerHour <= 0 {
			continue
		}
		want := 0.0
		for _, f := range p.fleets {
			if f.managed {
				want += float64(f.hi) * f.price()
			}
		}
		p.dollars = want > p.in.Budget.PerHour
	}
}

// chunk is growing one fleet from its tentative n to m nodes.
type chunk struct {
	f            *fstate
	m            int
	value        float64
	perGPU       float64
	score        float64 // by the project's measure: per GPU or per dollar
	gpus         int
	dollarsAdded float64
}

// best finds the fleet's most valuable growth within room GPUs.
func (a *alloc) best(f *fstate, room int) (chunk, bool) {
	var out chunk
	found := false
	p := f.proj
	for m := f.n + 1; m <= f.hi; m++ {
		dg := (m - f.n) * f.g
		if dg > room {
			break
		}
		added := float64(m-f.n) * f.price()
		if m > max(f.in.Current, f.lo) {
			// Nodes beyond its live ones are added only within the $/h caps.
			if cap := p.in.Budget.PerHour; cap > 0 && p.perHour+added > cap*(1+1e-9) {
				break
			}
			if cap := f.in.Budget.PerHour; cap > 0 && float64(m)*f.price() > cap*(1+1e-9) {
				break
			}
		}
		if !f.in.allowed(m) {
			continue
		}
		v := a.gain(f, f.n, m)
		// A fleet keeps the nodes it runs unless another fleet takes them
		// (or its autoscaler wants fewer): even a node that adds nothing
		// is the autoscaler's to give up, on cost. Growth must add.
		keeping := f.incumbent > 0 && m <= f.incumbent
		if v <= 0 && !keeping {
			continue
		}
		c := chunk{f: f, m: m, value: v, perGPU: v / float64(dg), gpus: dg, dollarsAdded: added}
		c.score = c.perGPU
		if p.dollars && added > 0 {
			c.score = v / added
		}
		if !found || c.score > out.score*(1+1e-12) {
			out, found = c, true
		}
	}
	return out, found
}

// fill shares out GPUs: guarantees first (each project up to its quota),
// then lending (up to each project's max_gpus) from what is left of the
// pool. Each step takes the single most valuable growth: within a
// project by goodput per GPU (per dollar when its budget binds), across
// projects by goodput per GPU weighted by project priority.
func (a *alloc) fill(guarantee bool) {
	for {
		used := 0
		for _, p := range a.order {
			used += p.used
		}
		free := a.pool - used
		var pick chunk
		found := false
		for _, p := range a.order {
			if !p.known || p.in.Unlimited {
				continue
			}
			limit := p.ceiling()
			if guarantee {
				limit = p.quota()
			}
			room := min(limit-p.used, free)
			if room <= 0 {
				continue
			}
			var pb chunk
			pfound := false
			for _, f := range p.fleets {
				if !f.managed || f.n >= f.hi {
					continue
				}
				if c, ok := a.best(f, room); ok && (!pfound || c.score > pb.score*(1+1e-12)) {
					pb, pfound = c, true
				}
			}
			if !pfound {
				continue
			}
			w := pb.perGPU
			if !guarantee {
				w *= p.weight
			}
			if !found || w > pick.perGPU*pickWeight(pick, guarantee)*(1+1e-12) {
				pick, found = pb, true
			}
		}
		if !found {
			return
		}
		f := pick.f
		f.proj.used += pick.gpus
		f.proj.perHour += pick.dollarsAdded
		f.n = pick.m
	}
}

func pickWeight(c chunk, guarantee bool) float64 {
	if guarantee || c.f == nil {
		return 1
	}
	return c.f.proj.weight
}

// GoodputCurve weighs a fleet's measured throughput at n nodes by the
// statistical efficiency of the global batch n nodes run, when its
// workers report their batch and gradient noise scale B
// (fleetd_elastic.AdaptiveBatch): a batch of M samples makes (B + M0) /
// (B + M) of a small batch's progress per sample (McCandlish et al.;
// Pollux's goodput). The batch is taken to grow with the nodes (a fixed
// batch per GPU, AdaptiveBatch's default), from batch at nodes now. The
// curve is scaled to match the throughput at one node, so only its shape
// changes. Without a noise scale or batch it is c.
func GoodputCurve(c Curve, noiseScale, batch float64, nodes int) Curve {
	if c == nil || !(noiseScale > 0) || !(batch > 0) || nodes < 1 || math.IsInf(noiseScale, 0) || math.IsInf(batch, 0) {
		return c
	}
	return goodputCurve{c: c, noise: noiseScale, perNode: batch / float64(nodes)}
}

type goodputCurve struct {
	c              Curve
	noise, perNode float64
}

func (g goodputCurve) Throughput(n int) (float64, bool) {
	x, ok := g.c.Throughput(n)
	if !ok || n < 1 {
		return x, ok
	}
	return x * (g.noise + g.perNode) / (g.noise + g.perNode*float64(n)), true
}
