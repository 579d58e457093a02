package simulate

import (
	"errors"
	"math"
	"time"

	"github.com/fleetd/fleetd/providers/sim"
)

// The omniscient optimum is a dynamic program over the trace, with the
// changeover model of the simulated runs (Can't Be Late's: every start of
// an instance costs the changeover d at the new instance's price before
// any progress; stopping is free).
//
// Discretisation: time and work are counted in ticks of the trace (g).
// State (t, P, s): at the start of tick t, P ticks of work are done and
// the job is idle (s = idle) or warm on mode s (on-demand, or spot in one
// zone), i.e. past its changeover. Per tick a warm mode either runs one
// tick of work (spot needs capacity for the gang at that tick) or stops;
// a start on mode m occupies ⌊d/g⌋ ticks of changeover plus its first
// tick of work. The DP is a relaxation of the continuous-time runs, so it
// is a lower bound on every policy that meets the deadline:
//   - a changeover is charged its exact length d in money but only ⌊d/g⌋
//     ticks in time (⌊(d−L)/g⌋ when switching from a warm mode, since the
//     daemon keeps an on-demand node working while its spot replacement
//     boots for the launch latency L);
//   - a spot tick costs the lower of its own and the next tick's price,
//     because the continuous run's work unit can straddle the two;
//   - the horizon is ⌈deadline/g⌉ ticks and the last, partial tick of work
//     is charged only for its fraction.
//
// Only feasible P are visited: P ≥ W − (H − t) (the rest of the work
// still fits) and P ≤ min(t, W), a band of width ≤ slack + 1 ticks. With
// Z zones the cost is O(H · (slack+1) · (Z+1)) time and as many bytes of
// back-pointers: for 9 zones, a 60 h deadline and a 48 h job on 195 s
// ticks, 1108 × 222 × 11 ≈ 2.7 M cells, a few milliseconds.

// optimumResult is the DP's answer for one window.
type optimumResult struct {
	Cost          float64
	SpotHours     float64
	OnDemandHours float64
	Restarts      int
	Migrations    int
	Preemptions   int // spot runs that end because the zone's capacity went
	Feasible      bool
}

// optimizer holds reusable buffers (one per worker).
type optimizer struct {
	avail  [][]bool    // [mode][tick]
	run    [][]int32   // [mode][tick]: consecutive available ticks from tick
	step   [][]float64 // [mode][tick]: $ for one tick of work
	change [][]float64 // [mode][tick]: $ for a changeover starting at tick
	price  [][]float64 // [mode][tick]: $/h per node (the trace's, unclamped)
	// Ring buffers of values over (c0+2) layers × band × states.
	val    []float64
	choice []uint8 // back-pointers, per layer band
	base   []int   // offset of each layer in choice
	infs   []float64
	la     lookaheadPlanner // the lookahead planner's buffers (lookahead.go)
}

const (
	fromContinue = 255
	fromIdle     = 254
	stateIdle    = 0 // state 0 is idle, 1 is on-demand, 2.. spot offers
)

var errGrid = errors.New("optimum: the zones' series do not share one tick grid")

// solve computes the optimum for one window. offers are the zones of the
// set; gang is the number of nodes that run together (max_nodes).
func (op *optimizer) solve(offers []*sim.Offer, start time.Time, job Job, gang int, odPrice float64) (optimumResult, error) {
	var res optimumResult
	if job.Work <= 0 {
		res.Feasible = true
		return res, nil
	}
	gr, err := op.tables(offers, start, job, gang, odPrice, false)
	if err != nil || !gr.ok {
		return res, err
	}
	H, W, last, c0, c1, S, M := gr.H, gr.W, gr.last, gr.c0, gr.c1, gr.S, gr.M

	lo := func(t int) int { return max(0, W-(H-t)) }
	hi := func(t int) int { return min(t, W) }
	// Back-pointer layout: layer t holds (hi-lo+1) × S bytes.
	op.base = grow1(op.base, H+2)
	n := 0
	for t := 0; t <= H; t++ {
		op.base[t] = n
		if w := hi(t) - lo(t) + 1; w > 0 {
			n += w * S
		}
	}
	op.base[H+1] = n
	op.choice = grow1(op.choice, n)
	K := c0 + 2
	width := W + 1
	op.val = grow1(op.val, K*width*S)
	inf := math.Inf(1)
	for i := range op.val {
		op.val[i] = inf
	}
	layer := func(t int) []float64 { o := (t % K) * width * S; return op.val[o : o+width*S] }
	best, bestT, bestS := inf, -1, -1
	op.val[stateIdle] = 0
	op.choice[0] = fromIdle

	// target is a layer that transitions write into, with its band.
	type target struct {
		ok     bool
		t      int
		val    []float64
		lo, hi int
	}
	mk := func(t int) target {
		if t > H {
			return target{}
		}
		return target{ok: true, t: t, val: layer(t), lo: lo(t), hi: hi(t)}
	}
	// Per-tick copies of the mode tables, so the inner loop reads flat slices.
	availList, start0, start1 := make([]int, 0, M), make([]int, 0, M), make([]int, 0, M)
	same := c0 == c1
	op.infs = grow1(op.infs, width*S)
	infs := op.infs
	for i := range infs {
		infs[i] = inf
	}
	stepT, step0, step1, chg := make([]float64, M), make([]float64, M), make([]float64, M), make([]float64, M)

	for t := 0; t < H; t++ {
		cur := layer(t)
		n1, s0, s1 := mk(t+1), mk(t+c0+1), mk(t+c1+1)
		availList, start0, start1 = availList[:0], start0[:0], start1[:0]
		for m := range M {
			if op.avail[m][t] {
				availList = append(availList, m)
			}
			if s0.ok && int(op.run[m][t]) >= c0+1 {
				start0 = append(start0, m)
			}
			if s1.ok && int(op.run[m][t]) >= c1+1 {
				start1 = append(start1, m)
			}
			stepT[m], chg[m] = op.step[m][t], op.change[m][t]
			if s0.ok {
				step0[m] = op.step[m][t+c0]
			}
			if s1.ok {
				step1[m] = op.step[m][t+c1]
			}
		}
		plo, phi := lo(t), min(hi(t), W-1)
		for p := plo; p <= phi; p++ {
			row := cur[p*S : p*S+S]
			idle := row[stateIdle]
			b1, b2, m1, m2 := inf, inf, -1, -1
			for m := range M {
				v := row[m+1]
				switch {
				case v < b1:
					b1, b2, m1, m2 = v, b1, m, m1
				case v < b2:
					b2, m2 = v, m
				}
			}
			if idle == inf && b1 == inf {
				continue
			}
			// Stop, or stay idle.
			if p >= n1.lo && p <= n1.hi {
				v, from := idle, uint8(fromIdle)
				if b1 < idle {
					v, from = b1, uint8(m1+1)
				}
				if i := p*S + stateIdle; v < n1.val[i] {
					n1.val[i] = v
					op.choice[op.base[n1.t]+(p-n1.lo)*S+stateIdle] = from
				}
			}
			q := p + 1
			frac := 1.0
			if q == W {
				frac = last
			}
			// The target rows of this row's transitions (nil: outside the
			// target layer's band). inf + x stays inf, so unreachable
			// sources never win a comparison.
			var v1, v0, vS []float64
			var c1, c0b, cS []uint8
			if q >= n1.lo && q <= n1.hi {
				v1, c1 = n1.val[q*S:q*S+S], op.choice[op.base[n1.t]+(q-n1.lo)*S:][:S]
			}
			if s0.ok && (idle < inf || (same && b1 < inf)) && q >= s0.lo && q <= s0.hi {
				v0, c0b = s0.val[q*S:q*S+S], op.choice[op.base[s0.t]+(q-s0.lo)*S:][:S]
			}
			if s1.ok && b1 < inf && q >= s1.lo && q <= s1.hi {
				vS, cS = s1.val[q*S:q*S+S], op.choice[op.base[s1.t]+(q-s1.lo)*S:][:S]
			}
			// Keep working on an available mode.
			if v1 != nil {
				for _, m := range availList {
					s := m + 1
					if v := row[s] + stepT[m]*frac; v < v1[s] {
						v1[s], c1[s] = v, fromContinue
					}
				}
			}
			// With c0 == c1 (the usual case) a start from idle and a
			// switch from a warm mode land in the same cell: one loop.
			if same && v0 != nil {
				for _, m := range start0 {
					s := m + 1
					src, sv := m1, b1
					if m1 == m {
						src, sv = m2, b2
					}
					from := uint8(src + 1)
					if idle <= sv {
						from, sv = fromIdle, idle
					}
					if v := sv + chg[m] + step0[m]*frac; v < v0[s] {
						v0[s], c0b[s] = v, from
					}
				}
				goto done
			}
			// Start a mode from idle: c0 ticks of changeover, one of work.
			if v0 != nil {
				for _, m := range start0 {
					s := m + 1
					if v := idle + chg[m] + step0[m]*frac; v < v0[s] {
						v0[s], c0b[s] = v, fromIdle
					}
				}
			}
			// Switch to a mode from the best other warm mode.
			if vS != nil {
				for _, m := range start1 {
					s := m + 1
					src, sv := m1, b1
					if m1 == m {
						src, sv = m2, b2
					}
					if v := sv + chg[m] + step1[m]*frac; v < vS[s] {
						vS[s], cS[s] = v, uint8(src+1)
					}
				}
			}
		done:
			if q == W {
				for _, tg := range []struct {
					row []float64
					t   int
				}{{v1, n1.t}, {v0, s0.t}, {vS, s1.t}} {
					for s, v := range tg.row {
						if s > 0 && v < best {
							best, bestT, bestS = v, tg.t, s
						}
					}
				}
			}
		}
		// Layer t is done: recycle it for t+K (only its band was written).
		copy(cur[plo*S:(hi(t)+1)*S], infs)
	}
	if bestT < 0 {
		return res, nil
	}
	res.Feasible, res.Cost = true, best
	op.backtrack(&res, bestT, W, bestS, c0, c1, S, lo, gr.tickH, job.Changeover)
	return res, nil
}

// grid is the DP's discretisation of one window: H ticks to the deadline,
// W ticks of work (the last one a fraction last), changeovers of c0 ticks
// from idle and c1 from a warm mode, S states over M warm modes.
type grid struct {
	ok             bool // false: the work does not fit before the deadline
	H, W, c0, c1   int
	S, M, span     int
	last           float64
	tickH, coH     float64
	gang           float64
	ticksPerChange int // ⌈d/g⌉: the trace ticks a changeover's price covers
}

// tables fills op's per-mode, per-tick tables of the window (mode 0 is
// on-demand, mode k+1 the spot offer k): availability for the gang, run
// lengths, raw prices, the price of one tick of work and of a changeover.
// Relaxed for the optimum; pessimistic for the lookahead planner, whose
// plans meet the simulated market: the horizon is the last whole tick
// before the deadline and a changeover (with the checkpoint's restore)
// takes whole ticks rounded up, so that a plan that fits fits in time.
func (op *optimizer) tables(offers []*sim.Offer, start time.Time, job Job, gang int, odPrice float64, pessimistic bool) (grid, error) {
	var gr grid
	if len(offers) > 250 {
		return gr, errors.New("optimum: more than 250 zones") // back-pointers are bytes
	}
	g := offers[0].Series.Tick
	for _, o := range offers {
		if o.Series.Tick != g || o.Series.Start.Sub(offers[0].Series.Start)%g != 0 {
			return gr, errGrid
		}
	}
	t0 := int(start.Sub(offers[0].Series.Start) / g)
	if start.Sub(offers[0].Series.Start)%g != 0 {
		return gr, errGrid
	}
	tickH := g.Hours()
	H := int(math.Ceil(float64(job.Deadline)/float64(g) - 1e-9))
	wf := float64(job.Work) / float64(g)
	W := int(math.Ceil(wf - 1e-9))
	last := wf - float64(W-1) // fraction of the last work tick
	cf := float64(job.Changeover) / float64(g)
	c0 := int(math.Floor(cf + 1e-9))
	c1 := int(math.Floor(float64(job.Changeover-job.LaunchLatency)/float64(g) + 1e-9))
	if pessimistic {
		H = int(math.Floor(float64(job.Deadline)/float64(g) + 1e-9))
		d := job.Changeover + job.restoreTime()
		c0 = int(math.Ceil(float64(d)/float64(g) - 1e-9))
		c1 = int(math.Ceil(float64(d-job.LaunchLatency)/float64(g) - 1e-9))
	}
	c1 = max(min(c1, c0), 0)
	coH := job.Changeover.Hours()
	if H < W {
		return gr, nil // infeasible even on on-demand from the start
	}
	S := 1 + 1 + len(offers) // idle, on-demand, spot offers
	M := S - 1               // warm modes: index m ↔ state m+1
	span := H + c0 + 2
	gr = grid{ok: true, H: H, W: W, c0: c0, c1: c1, S: S, M: M, span: span, last: last,
		tickH: tickH, coH: coH, gang: float64(gang), ticksPerChange: max(int(math.Ceil(cf-1e-9)), 1)}

	// Per mode and tick: availability, run lengths, prices.
	op.avail = grow2(op.avail, M, span)
	op.run = grow2(op.run, M, span+1)
	op.step = grow2(op.step, M, span)
	op.change = grow2(op.change, M, span)
	op.price = grow2(op.price, M, span+1)
	for j := range span + 1 {
		op.price[0][j] = odPrice / float64(gang)
	}
	for j := range span {
		op.avail[0][j] = true
		op.step[0][j] = odPrice * tickH
		op.change[0][j] = odPrice * coH
	}
	for k, o := range offers {
		m := k + 1
		for j := range span + 1 {
			op.price[m][j] = o.SpotPriceAt(t0 + j)
		}
		for j := range span {
			op.avail[m][j] = o.CapacityAt(t0+j) >= gang
			p := min(o.SpotPriceAt(t0+j), o.SpotPriceAt(t0+j+1))
			op.step[m][j] = p * tickH * float64(gang)
		}
		for j := range span {
			// A changeover from tick j covers ⌈d/g⌉ ticks of the trace.
			p := math.Inf(1)
			for i := j; i < j+gr.ticksPerChange; i++ {
				p = min(p, o.SpotPriceAt(t0+i))
			}
			op.change[m][j] = p * coH * float64(gang)
		}
	}
	for m := range M {
		runLengths(op.avail[m], op.run[m])
	}
	return gr, nil
}

// runLengths sets run[j] to the number of consecutive available ticks
// from j (run has one entry more than avail).
func runLengths(avail []bool, run []int32) {
	run[len(avail)] = 0
	for j := len(avail) - 1; j >= 0; j-- {
		if avail[j] {
			run[j] = run[j+1] + 1
		} else {
			run[j] = 0
		}
	}
}

// backtrack walks the back-pointers from the final state and tallies the
// optimum's hours, restarts, migrations and forced moves (spot runs that
// end because the zone's capacity went).
func (op *optimizer) backtrack(res *optimumResult, t, p, s, c0, c1, S int, lo func(int) int, tickH float64, d time.Duration) {
	hours := func(s int, h float64) {
		if s == 1 {
			res.OnDemandHours += h
		} else {
			res.SpotHours += h
		}
	}
	var modes []int // modes of the segments, last first
	segEnd := -1    // last work tick of the segment being walked; -1: the final one
	for t > 0 {
		from := op.choice[op.base[t]+(p-lo(t))*S+s]
		if s == stateIdle {
			if from != fromIdle {
				// Warm on `from` at t-1, stopped there: its last work
				// tick was t-2.
				s, segEnd = int(from), t-2
			}
			t--
			continue
		}
		hours(s, tickH)
		if from == fromContinue {
			t, p = t-1, p-1
			continue
		}
		// This was the segment's first work tick, after a changeover.
		res.Restarts++
		hours(s, d.Hours())
		modes = append(modes, s)
		if s >= 2 && segEnd >= 0 && !op.avail[s-1][segEnd+1] {
			res.Preemptions++
		}
		if from == fromIdle {
			t, p, s, segEnd = t-c0-1, p-1, stateIdle, -1
		} else {
			t, p, s = t-c1-1, p-1, int(from)
			segEnd = t - 1
		}
	}
	for i := 0; i+1 < len(modes); i++ {
		if modes[i] != modes[i+1] {
			res.Migrations++
		}
	}
}

func grow1[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

func grow2[T any](b [][]T, rows, n int) [][]T {
	if cap(b) < rows {
		b = make([][]T, rows)
	}
	b = b[:rows]
	for i := range b {
		b[i] = grow1(b[i], n)
	}
	return b
}
