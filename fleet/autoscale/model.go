// Package autoscale sizes a fleet by its measured training throughput and
// its price: it turns the workers' progress reports into throughput per
// fleet size (Tracker), fits a Pollux-style scaling model over the sizes it
// has seen (Fit), and chooses the size within [min_nodes, max_nodes] that
// minimises the expected cost per unit of progress, exploring an untried
// size only when the model's optimistic bound says it may pay (Decide).
//
// It is pure: no I/O, no clock of its own (every call takes the time). The
// daemon feeds it what the rendezvous and the offerings say and passes
// the chosen size to the reconciler; `fleetd sim` runs the same code in
// virtual time. docs/autoscale.md explains the model and the rules.
package autoscale

import (
	"math"
	"sort"
)

// Model is the fitted scaling model of a job on one instance type. Its
// unit is node-seconds per sample (the inverse of the per-node
// throughput): with N nodes,
//
//	y(N) = N / X(N) = A + B·(N−1)
//
// A is one node's compute time per sample; B is what each further node
// adds in communication and synchronisation per sample (Pollux's T_sync
// growing with the number of replicas, with a fixed per-replica batch).
// B = 0 is linear scaling; B > 0 bends the throughput
// X(N) = N / (A + B·(N−1)) towards its ceiling 1/B. The fit is a
// least-squares line through each observed size's mean y (a size's
// observations are averaged weighted by the seconds they measured), B
// clamped at 0 (superlinear speed-ups are noise here).
type Model struct {
	A float64 `json:"a"`
	B float64 `json:"b"`
	// Sizes are the distinct node counts observed; Points the observations.
	Sizes  []int `json:"sizes"`
	Points int   `json:"points"`
	// Sigma is the residual standard deviation of a size's mean y, with a
	// floor of NoiseFloor of the mean: two sizes fit any line exactly and
	// cannot show their own noise.
	Sigma float64 `json:"sigma"`
	// Fixed: only one size was observed, so B is unknown; the model then
	// predicts only that size.
	Fixed bool `json:"fixed,omitempty"`
	// The fit's x mean and spread, for the prediction's uncertainty.
	mx, sxx float64
}

// NoiseFloor is the least relative noise assumed in a size's measured
// throughput (rates measured over a minute of a shared cloud network
// rarely repeat better than this).
const NoiseFloor = 0.03

// Point is one observation for the fit.
type Point struct {
	Nodes   int
	Rate    float64 // samples per second
	Seconds float64 // how long it was measured: its weight within its size
}

// Fit fits the model to throughput observations; false without any
// usable one.
func Fit(points []Point) (Model, bool) {
	var usable []Point
	for _, p := range points {
		if p.Nodes < 1 || !(p.Rate > 0) || !(p.Seconds > 0) || math.IsInf(p.Rate, 0) {
			continue
		}
		usable = append(usable, p)
	}
	if len(usable) == 0 {
		return Model{}, false
	}
	by := sumBySize(usable)
	m := Model{Points: len(usable)}
	for s := range by {
		m.Sizes = append(m.Sizes, s)
	}
	sort.Ints(m.Sizes)
	k := float64(len(m.Sizes))
	var sx, sy float64
	for _, s := range m.Sizes {
		sx += float64(s - 1)
		sy += by[s].wy / by[s].w
	}
	mx, my := sx/k, sy/k
	if len(m.Sizes) == 1 {
		m.Fixed, m.A, m.mx = true, my, mx
		m.Sigma = NoiseFloor * my
		return m, true
	}
	var sxx, sxy float64
	for _, s := range m.Sizes {
		dx := float64(s-1) - mx
		sxx += dx * dx
		sxy += dx * (by[s].wy/by[s].w - my)
	}
	b := math.Max(sxy/sxx, 0)
	a := my - b*mx
	if a <= 0 {
		// So steep a line would give one node no time per sample: the
		// sizes' mean stands instead.
		a, b = my, 0
	}
	m.A, m.B, m.mx, m.sxx = a, b, mx, sxx
	var rss float64
	for _, s := range m.Sizes {
		r := by[s].wy/by[s].w - (a + b*float64(s-1))
		rss += r * r
	}
	s2 := 0.0
	if len(m.Sizes) > 2 {
		s2 = rss / (k - 2)
	}
	floor := NoiseFloor * my
	m.Sigma = math.Sqrt(math.Max(s2, floor*floor))
	return m, true
}

// sizeSum is one size's observations summed, each weighted by the seconds
// it measured (up to maxWeight): w the weights, wy the weighted y = N/X
// (node-seconds per sample); wy/w is the size's mean y.
type sizeSum struct{ w, wy float64 }

// sumBySize sums the points of each size.
func sumBySize(points []Point) map[int]*sizeSum {
	by := map[int]*sizeSum{}
	for _, p := range points {
		a := by[p.Nodes]
		if a == nil {
			a = &sizeSum{}
			by[p.Nodes] = a
		}
		w := math.Min(p.Seconds, maxWeight)
		a.w += w
		a.wy += w * float64(p.Nodes) / p.Rate
	}
	return by
}

// maxWeight caps one observation's weight (seconds): a day-long round
// must not drown the other rounds at its size.
const maxWeight = 3600

// y is the predicted node-seconds per sample at n nodes and the standard
// deviation of that prediction; ok is false where the model cannot say
// (a fixed model away from its size).
func (m Model) y(n int) (mean, sd float64, ok bool) {
	if m.Fixed {
		if len(m.Sizes) == 1 && n == m.Sizes[0] {
			return m.A, m.Sigma, true
		}
		return 0, 0, false
	}
	x := float64(n - 1)
	mean = m.A + m.B*x
	k := float64(len(m.Sizes))
	sd = m.Sigma * math.Sqrt(1/k+(x-m.mx)*(x-m.mx)/m.sxx)
	return mean, sd, mean > 0
}

// Throughput is the predicted samples per second at n nodes; false where
// the model cannot say.
func (m Model) Throughput(n int) (float64, bool) {
	y, _, ok := m.y(n)
	if !ok || n < 1 {
		return 0, false
	}
	return float64(n) / y, true
}

// Bounds are the throughput at n nodes z standard deviations either side
// of the prediction (hi is +Inf when the lower y bound reaches zero); ok
// is false where the model cannot say.
func (m Model) Bounds(n int, z float64) (lo, hi float64, ok bool) {
	y, sd, ok := m.y(n)
	if !ok || n < 1 {
		return 0, 0, false
	}
	lo, hi = float64(n)/(y+z*sd), math.Inf(1)
	if yl := y - z*sd; yl > 0 {
		hi = float64(n) / yl
	}
	return lo, hi, true
}

// Efficiency is the throughput at n nodes over n times one node's: 1 is
// linear scaling. Zero for a fixed model.
func (m Model) Efficiency(n int) float64 {
	if m.Fixed || n < 1 {
		return 0
	}
	y, _, ok := m.y(n)
	if !ok {
		return 0
	}
	return m.A / y
}

// Ceiling is the throughput the model approaches with ever more nodes
// (1/B); +Inf for linear scaling, 0 for a fixed model.
func (m Model) Ceiling() float64 {
	if m.Fixed {
		return 0
	}
	if m.B <= 0 {
		return math.Inf(1)
	}
	return 1 / m.B
}
