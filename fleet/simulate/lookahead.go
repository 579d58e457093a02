package simulate

import (
	"math"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
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

// lookahead replays one window with the lookahead planner; horizon is how
// far ahead it knows the trace, every how often it plans again (at least
// one tick). It returns the work left undone at the deadline too (0: the
// job finished in time).
func (op *optimizer) lookahead(offers []*sim.Offer, start time.Time, job Job, gang int, odPrice float64, horizon, every time.Duration) (optimumResult, time.Duration, error) {
	var res optimumResult
	if job.Work <= 0 {
		res.Feasible = true
		return res, 0, nil
	}
	gr, err := op.tables(offers, start, job, gang, odPrice)
	if err != nil || !gr.ok {
		return res, 0, err
	}
	g := offers[0].Series.Tick
	hT := int(horizon / g)
	r := max(int(every/g), 1)
	pl := &op.la
	pl.gen++ // a new window: C and n mean other things
	if len(pl.cache) > 1<<16 {
		clear(pl.cache)
	}
	H, W := gr.H, gr.W
	t, p, s := 0, 0, stateIdle
	next := 0
	lastMode := -1 // mode of the previous segment, for migrations
	segEnd := -1   // last work tick of the current warm segment
	addHours := func(m int, h float64) {
		if m == 0 {
			res.OnDemandHours += h
		} else {
			res.SpotHours += h
		}
	}
	// endSegment closes the warm segment on mode m whose last work tick
	// was segEnd: a spot run whose capacity is gone at the next tick was
	// preempted.
	endSegment := func(m int) {
		if m > 0 && segEnd >= 0 && !op.avail[m][segEnd+1] {
			res.Preemptions++
		}
	}
	begin := func(m int) {
		res.Restarts++
		addHours(m, job.Changeover.Hours())
		if lastMode >= 0 && lastMode != m {
			res.Migrations++
		}
		lastMode = m
	}
	for p < W && t < H {
		if t >= next || t > pl.k {
			op.plan(gr, t, min(t+hT, H-1))
			next = t + r
		}
		a := op.choose(gr, t, p, s)
		frac := 1.0
		if p+1 == W {
			frac = gr.last
		}
		switch {
		case a.mode < 0: // wait, or stop
			if s != stateIdle {
				endSegment(s - 1)
			}
			s = stateIdle
			t++
		case a.mode == s-1: // keep working
			m := a.mode
			if !op.avail[m][t] {
				// Not while the planner knows tick t (t ≤ k); kept so
				// that no plan ever works on capacity that is gone.
				next = t
				continue
			}
			res.Cost += op.step[m][t] * frac
			addHours(m, gr.tickH)
			segEnd = t
			t, p = t+1, p+1
		default: // start, or switch from a warm mode
			m, c := a.mode, a.c
			if s != stateIdle {
				endSegment(s - 1)
			}
			begin(m)
			res.Cost += op.change[m][t]
			if int(op.run[m][t]) < c+1 {
				// The capacity goes during the changeover: its money is
				// spent, the job is idle again when it goes.
				res.Preemptions++
				t += int(op.run[m][t])
				s, next = stateIdle, t
				continue
			}
			res.Cost += op.step[m][t+c] * frac
			addHours(m, gr.tickH)
			segEnd = t + c
			t, p, s = t+c+1, p+1, m+1
		}
	}
	res.Feasible = true
	var undone time.Duration
	if p < W {
		undone = time.Duration((float64(W-p-1) + gr.last) * float64(g))
	}
	return res, undone, nil
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
func (op *optimizer) choose(gr grid, t, p, s int) action {
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
	return a
}
