package autoscale

// NetworkPrior is what the job's gradient size and the nodes' network
// say about sizes not measured yet. A data-parallel step all-reduces the
// gradients; a ring all-reduce over n nodes sends and receives
// 2·(n−1)/n of them through each node's network, so with bandwidth W a
// step takes
//
//	T(n) = T_c + 2·(n−1)/n · G / W
//
// where T_c is the step's compute, found from the one size measured.
// DDP overlaps some of the all-reduce with the backward pass, so
// its bounds run from a sync wholly hidden behind compute to one at half
// the nominal bandwidth. Only a first guess: once two sizes are measured
// the fitted model replaces it.
type NetworkPrior struct {
	// GradientBytes is what each step all-reduces (training.gradient_mb).
	GradientBytes float64
	// BandwidthGbps is each node's node-to-node bandwidth (the offering's
	// fast-path bandwidth); 0 when unknown.
	BandwidthGbps float64
}

// syncSeconds is one step's all-reduce time over n nodes.
func (p NetworkPrior) syncSeconds(n int) float64 {
	if n < 2 {
		return 0
	}
	return 2 * float64(n-1) / float64(n) * p.GradientBytes * 8 / (p.BandwidthGbps * 1e9)
}

// MaxSyncFactor is the prior's pessimistic end: the all-reduce reaching
// only half the nominal bandwidth. Its optimistic end is a sync wholly
// hidden behind compute (factor 0: linear scaling).
const MaxSyncFactor = 2.0

// guess is the throughput at n nodes from the throughput x0 measured at
// n0 nodes with perNodeBatch samples per node per step: the estimate and
// its bounds over sync factors 0…MaxSyncFactor. False when the prior is
// unknown or cannot explain the measurement (the nominal sync alone would
// take 90 % or more of the measured step).
func (p NetworkPrior) guess(n0 int, x0, perNodeBatch float64, n int) (x, lo, hi float64, ok bool) {
	if p.GradientBytes <= 0 || p.BandwidthGbps <= 0 || n0 < 1 || x0 <= 0 || perNodeBatch <= 0 {
		return 0, 0, 0, false
	}
	step0 := float64(n0) * perNodeBatch / x0
	s0 := p.syncSeconds(n0)
	if step0-s0 < 0.1*step0 {
		return 0, 0, 0, false
	}
	at := func(f float64) float64 {
		compute := step0 - f*s0
		return float64(n) * perNodeBatch / (compute + f*p.syncSeconds(n))
	}
	fmax := MaxSyncFactor
	if s0 > 0 {
		fmax = min(fmax, 0.9*step0/s0) // compute stays at least 10 % of the step
	}
	a, b := at(0), at(fmax)
	return at(1), min(a, b), max(a, b), true
}
