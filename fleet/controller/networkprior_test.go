package controller

import (
	"testing"

	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

func TestNetworkPrior(t *testing.T) {
	node := func(st state.NodeState, fabric bool, gbps float64) state.Node {
		n := state.Node{State: st, Network: providers.NetworkRequest{Fabric: fabric}}
		n.Offering.Network = providers.NetworkInfo{Fabric: providers.FabricEFA, Interfaces: 4, BandwidthGbps: gbps}
		return n
	}
	withGrad := &spec.Fleet{Training: spec.Training{GradientMB: 1400}}
	for _, c := range []struct {
		name  string
		fl    *spec.Fleet
		nodes []state.Node
		want  autoscale.NetworkPrior
	}{
		{"the slowest live node's bandwidth", withGrad,
			[]state.Node{node(state.NodeRunning, true, 3200), node(state.NodeRunning, true, 400), node(state.NodeTerminated, true, 100)},
			autoscale.NetworkPrior{GradientBytes: 1.4e9, BandwidthGbps: 400}},
		{"no gradient size: no prior", &spec.Fleet{}, []state.Node{node(state.NodeRunning, true, 3200)}, autoscale.NetworkPrior{}},
		{"a live node on the standard network: no prior", withGrad,
			[]state.Node{node(state.NodeRunning, true, 3200), node(state.NodeRunning, false, 3200)}, autoscale.NetworkPrior{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := networkPrior(c.fl, c.nodes); got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}
