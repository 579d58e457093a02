package simulate

import (
	"context"
	"math"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/sim"
)

// The lookahead planner measures how much foresight the optimum's lead
// rests on. It replays a window as a planner that knows the trace exactly
// for the next L (its lookahead) and beyond that only what a policy knows
// now: at every re-plan it solves the optimum's DP (same discretisation
// and cost model) from its current state over the ticks it knows, and
// values what is left at the end of them by a stationary tail — the rest
// of the work on the cheapest spot up now, at today's price, ended at the
// rate the window has shown so far, with on-demand once the slack is spent
// (spotTail). It takes the plan's first actions and meets the trace as it
// is; a start whose capacity goes during its changeover (past what the
// planner knew) makes it plan again.
//
// L ≥ the deadline is the optimum itself. Between, the cost as L grows
// tells how far ahead a policy would have to see every zone's capacity
// and price to come within a given distance of the optimum. No policy
// can see ahead: like fleetd-foresight this is a measuring tool.
//
// The tail must not depend on the state at the horizon: a tail that
// assumed each zone stays as it is there ("persistence") made the plan
// chase whatever looked cheap at the horizon, waiting as the horizon
// moved: 1.03–1.08× on the V100 trace at 9 zones and 60 h, the worse
// the further it saw (docs/sim.md).

// lookaheadPlanner holds one window's scenario tables and values (reused
// across windows through the optimizer).
type lookaheadPlanner struct {
	avail  [][]bool    // [mode][tick − t0]
	run    [][]int32   // [mode][tick − t0], one entry more
	step   [][]float64 // [mode][tick − t0]
	change [][]float64 // [mode][tick − t0]
	val    []float64   // [(t − t0)·B + (p − lo(t))]·S + state
	// After k: each mode's availability and prices at k (a warm mode
	// up at k goes on at its price), and the tail's spot.
	upT                []bool
	stepT, changeT     []float64
	t0, k, b           int
	typ                int // the tail's spot mode (−1: none)
	stepTyp, changeTyp float64
	nu                 float64 // spot run ends per hour, seen so far
	gen                int     // changes with nu and with the window
	cache              map[tailKey]tailVal
}

// lookahead replays one window with the lookahead planner (pol.Planner)
// on the same market and job model as the reconciler-driven policies.
func (s *Setup) lookahead(op *optimizer, pol Policy, start time.Time) (Result, error) {
	return op.lookahead(s.market, start, s.Job, max(s.Fleet.MaxNodes, 1), s.onDemandPrice(), pol.Name, pol.Lookahead, lookaheadReplan(pol.Lookahead))
}

// lookahead replays one window with the lookahead planner: horizon is
// how far ahead it knows the trace, every how often it plans again (at
// least every tick). The planner decides at tick boundaries in the DP's
// terms — wait, keep working, start or switch to a mode (a gang of gang
// nodes on on-demand, or on spot in one zone) — and its decisions are
// carried out on the simulated market (providers/sim) under the job model
// of the reconciler-driven runs (runner): the gang's instances are billed
// from launch to deletion at the trace's prices, join after the launch
// latency and work from changeover + restore after the launch; a switch
// keeps the old gang working until the new one joins; a capacity drop
// ends the gang's work at the tick boundary (its instances are deleted);
// each node's restore is charged its egress. So its cost is measured as
// the policies' costs are, not on the DP's relaxed tables; the planner
// plans on pessimistic tables (tables) so that its plans fit in time.
func (op *optimizer) lookahead(mkt *sim.Market, start time.Time, job Job, gang int, od float64, name string, horizon, every time.Duration) (Result, error) {
	res := Result{Policy: name, Start: start}
	gr, err := op.tables(mkt.Offers, start, job, gang, od*float64(gang), true)
	if err != nil {
		return res, err
	}
	g := mkt.Offers[0].Series.Tick
	x := &laExec{job: job, gang: gang, now: start, res: &res, cur: laGang{mode: -1}}
	x.prov = sim.New(sim.Options{Now: func() time.Time { return x.now }, Trace: mkt.Trace, Market: mkt})
	x.offerings = make([]providers.Offering, len(mkt.Offers)+1)
	cheapest := mkt.Offers[0]
	for k, o := range mkt.Offers {
		x.offerings[k+1] = o.Spot
		if o.Meta.OnDemandPrice < cheapest.Meta.OnDemandPrice {
			cheapest = o
		}
	}
	x.offerings[0] = cheapest.OnDemand
	deadline, hardEnd := start.Add(job.Deadline), start.Add(job.Deadline+job.Work)
	hT := int(horizon / g)
	r := max(int(every/g), 1)
	pl := &op.la
	pl.gen++ // a new window: C and n mean other things
	if len(pl.cache) > 1<<16 {
		clear(pl.cache)
	}
	next := 0
	for t := 0; ; t++ {
		T := start.Add(time.Duration(t) * g)
		if x.advance(T); x.finished || !T.Before(hardEnd) {
			break
		}
		x.notices()
		if x.cur.ids != nil && x.cur.productive.After(T) {
			continue // in its changeover: the start is committed
		}
		// The planner's state: whole ticks of work done (it may be ahead
		// of the plan, never behind: the tables are pessimistic).
		p := min(int(x.done/g), gr.W-1)
		s := stateIdle
		if x.cur.ids != nil {
			s = x.cur.mode + 1
		}
		// Past the planner's grid (late, or the work never fitted): keep
		// what works, else on-demand.
		a := action{mode: max(s-1, 0)}
		if gr.ok && t < gr.H {
			if t >= next || t > pl.k {
				op.plan(gr, t, min(t+hT, gr.H-1))
				next = t + r
			}
			var v float64
			if a, v = op.choose(gr, t, p, s); math.IsInf(v, 1) {
				a = action{mode: 0} // no plan fits: on-demand
			}
		}
		switch {
		case a.mode < 0:
			x.stop()
		case a.mode == s-1:
		default:
			if !x.begin(a.mode) {
				next = t + 1 // no capacity after all: plan again
			}
		}
	}
	x.advance(x.now) // nothing left to do: delete what is left
	x.teardown()
	u := x.prov.Usage()
	res.Cost = u.Cost() + res.EgressCost
	res.SpotCost, res.OnDemandCost = u.SpotCost, u.OnDemandCost
	res.SpotHours, res.OnDemandHours = u.SpotHours, u.OnDemandHours
	res.Preemptions = u.Preemptions
	end := x.now
	if x.finished {
		end = x.finishedAt
	}
	res.Elapsed, res.Done = end.Sub(start), x.done
	res.Missed = !x.finished || x.finishedAt.After(deadline)
	return res, nil
}

// laGang is a gang of instances on one mode (0 on-demand, k+1 spot offer k).
type laGang struct {
	ids  []string
	mode int
	// productive is when it starts working (cur); until is when it stops
	// (old: the new gang joins).
	productive, until time.Time
}

// laExec carries out the lookahead planner's decisions on the market.
type laExec struct {
	prov       *sim.Provider
	offerings  []providers.Offering // by mode
	job        Job
	gang       int
	now        time.Time
	cur, old   laGang
	lastMode   int
	started    bool
	done       time.Duration
	finished   bool
	finishedAt time.Time
	res        *Result
}

// advance lets the job work until to (the current gang from its
// productive time, the old one until its until), ending the old gang at
// its until and everything when the work is done.
func (x *laExec) advance(to time.Time) {
	for !x.finished && x.now.Before(to) {
		a, b := x.now, to
		working := false
		switch {
		case x.old.ids != nil:
			b = minTime(b, x.old.until)
			working = true
		case x.cur.ids != nil && !x.cur.productive.After(a):
			working = true
		case x.cur.ids != nil && x.cur.productive.Before(b):
			b = x.cur.productive
		}
		if working {
			if left := x.job.Work - x.done; b.Sub(a) >= left {
				x.done, x.finished, x.finishedAt = x.job.Work, true, a.Add(left)
				x.now = x.finishedAt
				x.teardown()
				return
			}
			x.done += b.Sub(a)
		}
		x.now = b
		if x.old.ids != nil && !x.old.until.After(x.now) {
			x.end(&x.old)
		}
	}
	x.now = maxTime(x.now, to)
}

// notices ends the gangs of which an instance got a capacity notice now:
// the gang cannot work without it.
func (x *laExec) notices() {
	insts, _ := x.prov.List(context.Background(), providers.Config{}, nil)
	hit := map[string]bool{}
	for _, in := range insts {
		if in.Interruption != nil {
			hit[in.ID] = true
		}
	}
	for _, gg := range []*laGang{&x.cur, &x.old} {
		for _, id := range gg.ids {
			if hit[id] {
				x.end(gg)
				break
			}
		}
	}
}

// begin launches a gang on mode m now (after the old one stops, if any
// works): false when the market has no capacity for it.
func (x *laExec) begin(m int) bool {
	o := x.offerings[m]
	created, err := x.prov.Create(context.Background(), providers.Config{}, providers.LaunchRequest{Offering: o, Count: x.gang})
	if err != nil {
		return false
	}
	if x.cur.ids != nil {
		x.end(&x.old)
		x.old = x.cur
		x.old.until = x.now.Add(x.job.LaunchLatency)
		if x.cur.productive.After(x.now) {
			x.end(&x.old) // not working yet: nothing to keep
		}
	}
	x.cur = laGang{mode: m, productive: x.now.Add(x.job.Changeover + x.job.restoreTime())}
	for _, in := range created {
		x.cur.ids = append(x.cur.ids, in.ID)
		cost, cross, _, _ := x.job.restoreEgress(o)
		x.res.EgressCost += cost
		if cross {
			x.res.CrossRegionRestores++
		}
	}
	x.res.Restarts++
	if x.started && x.lastMode != m {
		x.res.Migrations++
	}
	x.started, x.lastMode = true, m
	return true
}

// stop ends the current gang now.
func (x *laExec) stop() { x.end(&x.cur) }

// end deletes a gang's instances now.
func (x *laExec) end(gg *laGang) {
	for _, id := range gg.ids {
		_ = x.prov.Delete(context.Background(), providers.Config{}, id)
	}
	*gg = laGang{mode: -1}
}

func (x *laExec) teardown() {
	x.end(&x.old)
	x.end(&x.cur)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// action is what the planner does at one tick: mode −1 waits (or stops),
// the current warm mode keeps working, any other mode starts with a
// changeover of c ticks.
type action struct{ mode, c int }

// plan solves the DP from tick t0 over the ticks the planner knows
// (through k), valued by the tail after k.
func (op *optimizer) plan(gr grid, t0, k int) {
	pl := &op.la
	H, W, M, S := gr.H, gr.W, gr.M, gr.S
	pl.t0, pl.k, pl.b = t0, k, H-W+1
	// Tables over [t0, end): the trace through k, then k's state and
	// price (only a changeover that reaches past k reads them: whether
	// it is expected to get through, and at what price).
	end := min(k+gr.c0+gr.ticksPerChange+2, gr.span)
	n := end - t0
	pl.avail = grow2(pl.avail, M, n)
	pl.run = grow2(pl.run, M, n+1)
	pl.step = grow2(pl.step, M, n)
	pl.change = grow2(pl.change, M, n)
	pl.upT = grow1(pl.upT, M)
	pl.stepT = grow1(pl.stepT, M)
	pl.changeT = grow1(pl.changeT, M)
	price := func(m, j int) float64 { return op.price[m][min(j, k)] }
	// The rate at which the window's spot runs have ended so far, with
	// fleetd's prior of one end per MarketPriorHours.
	ends, up := 1.0, placement.MarketPriorHours
	for m := 1; m < M; m++ {
		for j := range t0 {
			if op.avail[m][j] {
				up += gr.tickH
				if !op.avail[m][j+1] {
					ends++
				}
			}
		}
	}
	if nu := ends / up; nu != pl.nu {
		pl.nu = nu
		pl.gen++ // the tail's cached tails are for another rate
	}
	// The tail's spot: the cheapest mode up now, at today's price, not
	// the state at k, which a plan would chase as the horizon moves.
	pl.typ = -1
	for m := 1; m < M; m++ {
		if op.avail[m][t0] && (pl.typ < 0 || op.price[m][t0] < op.price[pl.typ][t0]) {
			pl.typ = m
		}
	}
	if pl.typ > 0 {
		pl.stepTyp = op.price[pl.typ][t0] * gr.tickH * gr.gang
		pl.changeTyp = op.price[pl.typ][t0] * gr.coH * gr.gang
	}
	for m := range M {
		pl.upT[m] = op.avail[m][k]
		pk := price(m, k)
		pl.stepT[m] = pk * gr.tickH * gr.gang
		pl.changeT[m] = pk * gr.coH * gr.gang
		for i := range n {
			j := t0 + i
			pl.avail[m][i] = op.avail[m][min(j, k)]
			pl.step[m][i] = min(price(m, j), price(m, j+1)) * gr.tickH * gr.gang
			c := math.Inf(1)
			for x := j; x < j+gr.ticksPerChange; x++ {
				c = min(c, price(m, x))
			}
			pl.change[m][i] = c * gr.coH * gr.gang
		}
		runLengths(pl.avail[m], pl.run[m])
		if pl.upT[m] {
			// Up for ever after k: every run reaching the end goes on.
			for i := n - 1; i >= 0 && pl.avail[m][i]; i-- {
				pl.run[m][i] = int32(H + gr.span)
			}
		}
	}
	layers := k - t0 + 1
	pl.val = grow1(pl.val, layers*pl.b*S)
	for t := k; t >= t0; t-- {
		lo := max(0, W-(H-t))
		for p := lo; p < W && p <= t; p++ {
			row := pl.val[((t-t0)*pl.b+p-lo)*S:][:S]
			frac := 1.0
			if p+1 == W {
				frac = gr.last
			}
			wait := op.value(gr, t+1, p, stateIdle)
			// A start (from idle, c0) or a switch (from a warm mode, c1)
			// to each mode; the best two switches serve every source.
			best := wait
			b1, b2, m1 := math.Inf(1), math.Inf(1), -1
			for m := range M {
				v0 := op.startValue(gr, t, p, m, gr.c0, frac)
				best = min(best, v0)
				v1 := v0
				if gr.c1 != gr.c0 {
					v1 = op.startValue(gr, t, p, m, gr.c1, frac)
				}
				switch {
				case v1 < b1:
					b1, b2, m1 = v1, b1, m
				case v1 < b2:
					b2 = v1
				}
			}
			row[stateIdle] = best
			for m := range M {
				v := wait
				if m1 == m {
					v = min(v, b2)
				} else {
					v = min(v, b1)
				}
				if pl.avail[m][t-t0] {
					v = min(v, pl.step[m][t-t0]*frac+op.value(gr, t+1, p+1, m+1))
				}
				row[m+1] = v
			}
		}
	}
}

// startValue is the value of starting mode m at tick t with p ticks done
// and a changeover of c ticks (+Inf when its capacity is not expected to
// last through it, or the first work tick comes after the deadline).
func (op *optimizer) startValue(gr grid, t, p, m, c int, frac float64) float64 {
	pl := &op.la
	i := t - pl.t0
	if t+c+1 > gr.H || int(pl.run[m][i]) < c+1 {
		return math.Inf(1)
	}
	if m > 0 && t+c > pl.k && !spotSafe(gr, t, c, gr.W-p) {
		return math.Inf(1) // its changeover reaches past what the planner knows
	}
	return pl.change[m][i] + pl.step[m][i+c]*frac + op.value(gr, t+c+1, p+1, m+1)
}

// spotTail is the expected cost of the rest of the job (left ticks of
// work) on spot from tick t after a changeover of c ticks (not charged
// here), with a tick of work costing step and a changeover change, when
// spot runs end at the rate ν the window has shown so far: each end
// costs a changeover of money and c1 ticks of slack; once the slack above
// a last restart on on-demand is spent, the rest runs on on-demand. With
// n the ends the free slack pays for and C the hours of work, the work
// left for on-demand is E[(C − T₍ₙ₊₁₎)⁺] = C·P(N ≥ n+1) − (n+1)/ν·P(N ≥
// n+2), N ~ Poisson(ν·C) (T₍ₖ₎ the k-th end).
func (op *optimizer) spotTail(gr grid, t, left, c int, step, change float64) float64 {
	pl := &op.la
	if !spotSafe(gr, t, c, left) {
		return math.Inf(1)
	}
	C := (float64(left-1) + gr.last) * gr.tickH
	free := gr.H - t - c - left - gr.c0 // ticks above a last restart on on-demand
	n := free / max(gr.c1, 1)
	od, last := op.odWork(left, n, C)
	ends := min(pl.nu*C, float64(n))
	return (C-od)/gr.tickH*step + od/gr.tickH*pl.stepT[0] + ends*change + last*pl.changeT[0]
}

// tailKey indexes spotTail's cache: the work left and the ends the slack
// pays for.
type tailKey struct{ left, n int }

// tailVal is a cached E[work on on-demand] and P(N ≥ n+1), for one rate.
type tailVal struct {
	od, last float64
	gen      int
}

// odWork is spotTail's expected work on on-demand and the chance that
// it comes to that, cached per rate (the sums are the planner's cost).
func (op *optimizer) odWork(left, n int, C float64) (float64, float64) {
	pl := &op.la
	k := tailKey{left, n}
	if v, ok := pl.cache[k]; ok && v.gen == pl.gen {
		return v.od, v.last
	}
	mu := pl.nu * C
	last := placement.PoissonTail(mu, n+1)
	od := C*last - float64(n+1)/pl.nu*placement.PoissonTail(mu, n+2)
	od = min(max(od, 0), C)
	if pl.cache == nil {
		pl.cache = map[tailKey]tailVal{}
	}
	pl.cache[k] = tailVal{od, last, pl.gen}
	return od, last
}

// spotSafe tells whether a spot start at tick t with a changeover of c
// ticks and left ticks of work may be planned without knowing the
// capacity through it: if it goes at the changeover's last tick, the job
// is idle there and a start on on-demand still finishes in time. (A run
// that goes later leaves a switch of c1 ≤ c0 ticks.)
func spotSafe(gr grid, t, c, left int) bool { return t+c+gr.c0+left <= gr.H }

// value is the planner's cost to finish from state s at tick t with p
// ticks of work done: 0 when done, +Inf when the work no longer fits,
// the DP's value through k and the tail's after it.
func (op *optimizer) value(gr grid, t, p, s int) float64 {
	if p >= gr.W {
		return 0
	}
	pl := &op.la
	lo := max(0, gr.W-(gr.H-t))
	if t > gr.H || p < lo || p > t {
		return math.Inf(1)
	}
	if t <= pl.k {
		return pl.val[((t-pl.t0)*pl.b+p-lo)*gr.S+s]
	}
	// After k the planner knows only what a policy knows now: the
	// cheapest spot up now, at its price, preempted at the rate seen so
	// far in the window (spotTail); on-demand is always there.
	left := gr.W - p
	rest := float64(left-1) + gr.last
	best := math.Inf(1)
	c := gr.c0
	if s != stateIdle {
		c = gr.c1
		if m := s - 1; m == 0 && t+left <= gr.H {
			best = rest * pl.stepT[0]
		} else if m > 0 && pl.upT[m] {
			best = op.spotTail(gr, t, left, 0, pl.stepT[m], pl.changeT[m])
		}
	}
	if s-1 != 0 && t+c+left <= gr.H {
		best = min(best, pl.changeT[0]+rest*pl.stepT[0])
	}
	if pl.typ > 0 && s-1 != pl.typ {
		best = min(best, pl.changeTyp+op.spotTail(gr, t, left, c, pl.stepTyp, pl.changeTyp))
	}
	return best
}

// choose is the planner's action at tick t, from the last plan: the
// cheapest, preferring work now over work later when they cost the same.
func (op *optimizer) choose(gr grid, t, p, s int) (action, float64) {
	pl := &op.la
	frac := 1.0
	if p+1 == gr.W {
		frac = gr.last
	}
	const eps = 1e-9
	best, a := math.Inf(1), action{mode: -1}
	consider := func(v float64, b action) {
		if v < best && (math.IsInf(best, 1) || v < best-eps*max(1, math.Abs(best))) {
			best, a = v, b
		}
	}
	if s != stateIdle && pl.avail[s-1][t-pl.t0] {
		consider(pl.step[s-1][t-pl.t0]*frac+op.value(gr, t+1, p+1, s), action{mode: s - 1})
	}
	c := gr.c0
	if s != stateIdle {
		c = gr.c1
	}
	for m := range gr.M {
		if m != s-1 {
			consider(op.startValue(gr, t, p, m, c, frac), action{mode: m, c: c})
		}
	}
	consider(op.value(gr, t+1, p, stateIdle), action{mode: -1})
	return a, best
}
