package autoscale

import (
	"math"
	"testing"
	"time"
)

// TestNetworkFirstGuess: with only max_nodes measured, the network's
// first guess decides whether a smaller size is worth trying. On a fast
// fabric the all-reduce of 1.4 GB costs little, so half the nodes would
// give about half the throughput: not worth a changeover. On a slow
// network the same job spends most of its step in sync, so fewer nodes
// may cost less per sample. Without a prior the autoscaler always tries.
func TestNetworkFirstGuess(t *testing.T) {
	const batch, grad = 32.0, 1.4e9 // samples per node per step; bytes all-reduced per step
	measured := func(x float64) *Tracker {
		tr := history([2]float64{8, x})
		tr.Latest.StepsPerSec = x / (8 * batch)
		return tr
	}
	settled := State{Target: 8, ChangedAt: t0.Add(-time.Hour)}
	for _, c := range []struct {
		name   string
		x      float64
		prior  NetworkPrior
		want   int
		reason string
	}{
		{"no prior: try half", 512, NetworkPrior{}, 4, "exploring"},
		{"fast fabric: stay", 512, NetworkPrior{GradientBytes: grad, BandwidthGbps: 3200}, 8, "goodput"},
		{"slow network: try half", 256, NetworkPrior{GradientBytes: grad, BandwidthGbps: 25}, 4, "exploring"},
		{"prior cannot explain the measurement: as without one", 2000, NetworkPrior{GradientBytes: grad, BandwidthGbps: 25}, 4, "exploring"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(Input{Now: t0, Min: 2, Max: 8, State: settled, Tracker: measured(c.x), Network: c.prior})
			if d.Target != c.want || d.Reason != c.reason {
				t.Fatalf("target %d (%s), want %d (%s): %s", d.Target, d.Reason, c.want, c.reason, d.Explain)
			}
		})
	}
}

// TestNetworkPriorByHand checks the step-time model against numbers
// worked by hand: 1.4 GB over 25 Gbps is 0.448 s per full exchange; a
// ring of 8 moves 7/4 of it per node, 0.784 s; of a measured 1 s step at
// 8 nodes, 0.216 s is compute, and 4 nodes then take 0.216 + 0.672 s.
func TestNetworkPriorByHand(t *testing.T) {
	p := NetworkPrior{GradientBytes: 1.4e9, BandwidthGbps: 25}
	if got := p.syncSeconds(8); math.Abs(got-0.784) > 1e-9 {
		t.Errorf("sync at 8 nodes %.6f s, want 0.784", got)
	}
	x, lo, hi, ok := p.guess(8, 256, 32, 4) // 8 nodes × 32 samples in 1 s
	if want := 128 / (0.216 + 0.672); !ok || math.Abs(x-want) > 1e-9 {
		t.Errorf("guess at 4 nodes %.4f (%v), want %.4f", x, ok, want)
	}
	// Bounds: sync hidden (linear: 128/s), and the largest factor that
	// leaves compute 10 % of the step (0.9/0.784).
	f := 0.9 / 0.784
	if want := 128 / (1 - f*0.784 + f*0.672); math.Abs(lo-128) > 1e-9 || math.Abs(hi-want) > 1e-9 {
		t.Errorf("bounds at 4 nodes [%.4f, %.4f], want [128, %.4f]", lo, hi, want)
	}
	if _, _, _, ok := p.guess(8, 256, 32, 1); !ok {
		t.Error("no guess for 1 node")
	}
	if _, _, _, ok := (NetworkPrior{GradientBytes: 1.4e9}).guess(8, 256, 32, 4); ok {
		t.Error("a guess without a bandwidth")
	}
}
