package simulate

import (
	"math"
	"slices"
	"sort"
	"time"

	"github.com/fleetd/fleetd/providers/sim"
)

// The fluid bound is a lower bound on the cost of every simulated run
// that finishes its work by the deadline, whatever the fleet's size, the
// job's shape (Shape) or the policy. The DP of optimum.go is tighter but
// assumes an all-or-nothing gang of max_nodes in one zone at full rate:
// an elastic run that works on fewer nodes, or a goodput-shaped job that
// gets more progress per dollar on fewer nodes, can cost less than it.
//
// The argument (docs/sim.md, "The optimum"). In a run, progress accrues
// at rate(a) = X(a)/X(max_nodes) only while a closed round of a ≥
// min_nodes nodes is past its restart, and every node of that round is a
// billed instance. At any instant the instances billed cost at least the
// a cheapest node prices the market offers then: on-demand at the lowest
// on-demand price, unlimited; spot in each zone at its tick's price, at
// most as many as can be running there — the zone's capacity, plus the
// instances noticed at a capacity drop within the last notice lead, which
// still run. Hence a run's cost is at least ∫ c_t(a(t)) dt over its
// productive instants, with ∫ rate(a(t)) dt ≥ work, all of them at least
// changeover + restore after the window's start (a node is billed from
// launch, joins after the launch latency and works the rest of the
// changeover plus the restore after its round closes). Minimising that
// integral over every choice of a(t) — time-shared within each interval
// where prices and capacities are constant, which makes each interval's
// cost a convex function of its progress (the lower convex hull of the
// points (rate(n), c_t(n)), n ∈ {0} ∪ [min_nodes, max_nodes]) — is a
// fractional knapsack: take the hull segments of every interval in
// increasing order of $ per unit of progress until the work is done.
// Before its first productive instant a run also paid the first round's
// nodes (≥ min_nodes) for changeover + restore each, at least at the
// lowest price of the window: that is added.
//
// Changeovers after the first, preemptions and colocation are ignored:
// they only add cost or take time, so the bound stays below every run.

// segment is one hull segment of one interval: moving the interval's
// time from n0 to n1 nodes gains work and costs money (per hour of the
// interval, times its hours).
type segment struct {
	slope          float64 // $ per hour of work
	work, cost     float64 // hours of work at max_nodes, $
	spotH, demandH float64 // node-hours
}

// fluidBound is the bound for one window: the job, the fleet's node
// range and shape, the market's offers.
func fluidBound(offers []*sim.Offer, start time.Time, job Job, minN, maxN int, shape Shape) optimumResult {
	var res optimumResult
	work := job.Work.Hours()
	if work <= 0 {
		res.Feasible = true
		return res
	}
	maxN = max(maxN, 1)
	minN = min(max(minN, 1), maxN)
	od := math.Inf(1)
	for _, o := range offers {
		od = min(od, o.Meta.OnDemandPrice)
	}
	warm := job.Changeover + job.restoreTime()
	from, end := start.Add(warm), start.Add(job.Deadline)
	if !from.Before(end) {
		return res
	}
	// Break points: every change of a zone's capacity or price, and the
	// end of each change's notice lead (noticed instances still run).
	cuts := []time.Time{from, end}
	pmin := od
	for _, o := range offers {
		pmin = min(pmin, o.SpotPrice(start))
		for b := o.NextChange(start.Add(-o.NoticeLead)); !b.IsZero() && b.Before(end); b = o.NextChange(b) {
			pmin = min(pmin, o.SpotPrice(b))
			for _, c := range []time.Time{b, b.Add(o.NoticeLead)} {
				if c.After(from) && c.Before(end) {
					cuts = append(cuts, c)
				}
			}
		}
	}
	sort.Slice(cuts, func(i, j int) bool { return cuts[i].Before(cuts[j]) })
	cuts = slices.CompactFunc(cuts, func(a, b time.Time) bool { return a.Equal(b) })

	type pool struct {
		price float64
		n     int
		spot  bool
	}
	pools := make([]pool, 0, len(offers)+1)
	var segs []segment
	cum := make([]float64, maxN+1)   // $/h of the n cheapest nodes
	spotN := make([]float64, maxN+1) // how many of them are spot
	for i := 0; i+1 < len(cuts); i++ {
		a, b := cuts[i], cuts[i+1]
		h := b.Sub(a).Hours()
		mid := a.Add(b.Sub(a) / 2)
		pools = pools[:0]
		for _, o := range offers {
			if c := runningBound(o, mid); c > 0 {
				pools = append(pools, pool{o.SpotPrice(mid), c, true})
			}
		}
		pools = append(pools, pool{od, maxN, false})
		sort.Slice(pools, func(i, j int) bool { return pools[i].price < pools[j].price })
		n := 0
		for _, p := range pools {
			for k := 0; k < p.n && n < maxN; k++ {
				n++
				cum[n], spotN[n] = cum[n-1]+p.price, spotN[n-1]
				if p.spot {
					spotN[n]++
				}
			}
		}
		// Lower convex hull of (rate(n), cum[n]) from (0, 0).
		hull := []int{0}
		for n := minN; n <= maxN; n++ {
			r := shape.rate(n, maxN)
			if last := hull[len(hull)-1]; last > 0 && shape.rate(last, maxN) >= r {
				continue // no more progress for more money
			}
			for len(hull) >= 2 {
				p, q := hull[len(hull)-2], hull[len(hull)-1]
				rp, rq := shape.rate(p, maxN), shape.rate(q, maxN)
				// q is above the line from p to n: drop it.
				if (cum[q]-cum[p])*(r-rp) >= (cum[n]-cum[p])*(rq-rp) {
					hull = hull[:len(hull)-1]
					continue
				}
				break
			}
			hull = append(hull, n)
		}
		for k := 1; k < len(hull); k++ {
			p, q := hull[k-1], hull[k]
			dr := shape.rate(q, maxN) - shape.rate(p, maxN)
			dc := cum[q] - cum[p]
			segs = append(segs, segment{slope: dc / dr, work: dr * h, cost: dc * h,
				spotH: (spotN[q] - spotN[p]) * h, demandH: float64(q-p)*h - (spotN[q]-spotN[p])*h})
		}
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].slope < segs[j].slope })
	left := work
	for _, s := range segs {
		f := min(1, left/s.work)
		res.Cost += f * s.cost
		res.SpotHours += f * s.spotH
		res.OnDemandHours += f * s.demandH
		if left -= f * s.work; left <= 1e-12 {
			res.Feasible = true
			break
		}
	}
	if !res.Feasible {
		return optimumResult{}
	}
	res.Cost += float64(minN) * warm.Hours() * pmin
	res.Restarts = 1
	return res
}

// runningBound is how many spot instances can be running in o's zone at
// t: its capacity, plus those noticed at drops within the last notice
// lead (they run until the notice's deadline). One change in that span
// leaves at most the capacity before it; with several, each change's
// capacity is added (loose, still a bound).
func runningBound(o *sim.Offer, t time.Time) int {
	c := o.Capacity(t)
	if o.NoticeLead <= 0 {
		return c
	}
	before := o.Capacity(t.Add(-o.NoticeLead))
	b := o.NextChange(t.Add(-o.NoticeLead))
	if b.IsZero() || b.After(t) {
		return c
	}
	if b2 := o.NextChange(b); b2.IsZero() || b2.After(t) {
		return max(c, before)
	}
	sum := before
	for ; !b.IsZero() && !b.After(t); b = o.NextChange(b) {
		sum += o.Capacity(b)
	}
	return sum
}
