package simulate

import (
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/sim"
)

// The simulated job's datasets (training.data) are charged like the daemon
// would pay for them: a streamed dataset's reads per hour of training from
// the region the job runs in, a staged one's copy per node launched unless
// a node of its zone is already running (the replacement copies from that
// peer), at the egress table's price from the data's region.

// dataCost is the fleet's data priced for the sim's market (one cloud
// under the sim provider's name); nil without data.
func (r *runner) dataCost() *placement.DataCost {
	d := placement.DataCostFor(r.fl)
	if d != nil {
		d.CloudOf = map[string]string{sim.Name: r.job.Cloud}
	}
	return d
}

// chargeStage bills a launched node's staged copies.
func (r *runner) chargeStage(o providers.Offering) {
	if r.data == nil {
		return
	}
	peer := false
	for _, n := range r.nodes {
		if n.State == state.NodeRunning && n.Offering.Zone == o.Zone && n.Offering.Provider == o.Provider {
			peer = true
			break
		}
	}
	for _, e := range r.data.Estimate(o) {
		if e.StageUSD <= 0 {
			continue
		}
		if peer {
			r.logf("data %s staged from a peer in %s: no transfer charge", e.Source, o.Zone)
			continue
		}
		r.res.DataCost += e.StageUSD
		r.logf("data %s staged from %s to %s: $%.2f", e.Source, e.From, e.To, e.StageUSD)
	}
}

// chargeStream bills hours of training's streamed reads, from where the
// job's first running node is.
func (r *runner) chargeStream(hours float64) {
	if r.data == nil || hours <= 0 {
		return
	}
	for _, n := range r.nodes {
		if n.State != state.NodeRunning {
			continue
		}
		for _, e := range r.data.Estimate(n.Offering) {
			r.res.DataCost += e.HourUSD * hours
		}
		return
	}
}
