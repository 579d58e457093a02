package simulate

import (
	"slices"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/sim"
)

// warmHistory is the spot market history a deployment that had watched
// the market since the trace began would bring to a job starting at
// start: placement.ObserveSpot folded over every change of spot
// capacity (up or down) of mkt's offerings before start, as the daemon
// folds each look it takes, then carried into the job's fleet
// (placement.CarrySpot).
func warmHistory(fl *spec.Fleet, mkt *sim.Market, start time.Time) []placement.SpotSeen {
	var times []time.Time
	for _, o := range mkt.Offers {
		end := min(tickIndex(o, start), len(o.Series.Avail)-1)
		up := o.CapacityAt(0) > 0
		times = append(times, o.TickStart(0))
		for i := 1; i <= end; i++ {
			if u := o.CapacityAt(i) > 0; u != up {
				up = u
				times = append(times, o.TickStart(i))
			}
		}
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	times = slices.CompactFunc(times, func(a, b time.Time) bool { return a.Equal(b) })
	var h []placement.SpotSeen
	offs := make([]providers.Offering, len(mkt.Offers))
	for _, t := range times {
		if !t.Before(start) {
			break
		}
		for i, o := range mkt.Offers {
			offs[i] = o.Spot
			offs[i].PricePerHour = o.SpotPrice(t)
			offs[i].Available = o.Capacity(t)
		}
		h = placement.ObserveSpot(h, fl, offs, nil, t)
	}
	// Carried as the daemon carries history into a new fleet: complete up
	// to start, so the current runs' states stand.
	return placement.CarrySpot(h, start, start, 0)
}

// tickIndex is the index of the tick of o's series that holds t; before
// the series it is -1.
func tickIndex(o *sim.Offer, t time.Time) int {
	d := t.Sub(o.Series.Start)
	if d < 0 {
		return -1
	}
	return int(d / o.Series.Tick)
}
