package placement

import (
	"math"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// Overpriced returns the fleet's spot offerings whose Score exceeds the
// best spot Score of the market by more than premium (PriceWaiter). The
// best is taken over offerings with room for min_nodes now (or a live
// node of the fleet, keep) and offerings whose capacity the market
// history saw go less than MarketPriorHours ago: capacity likely back
// before long, worth waiting for while the slack is free. Offerings in keep are never
// returned; premium ≤ 0 returns nothing.
func Overpriced(f *spec.Fleet, offs []providers.Offering, recs map[string]state.OfferingRecord, m Model, out Outlook, premium float64, keep map[string]bool) map[string]bool {
	if premium <= 0 {
		return nil
	}
	recent := time.Duration(MarketPriorHours * float64(time.Hour))
	best := math.Inf(1)
	score := map[string]float64{}
	for _, o := range Filter(f, offs) {
		if o.CapacityType != providers.Spot {
			continue
		}
		k := o.Key()
		sc := m.EvaluateIn(o, recs[k], spec.StrategyLowestPrice, out).Score
		score[k] = sc
		// Up means room for the job's min_nodes (it waits for a
		// placement, not an instance); the fleet's own nodes' offerings
		// are up whatever the market shows.
		likely := o.Available < 0 || o.Available >= max(f.MinNodes, 1) || keep[k]
		if s, ok := SeenOf(out.Spot, k); ok && !s.Up && s.known() && !s.First && out.Now.Sub(s.Since) < recent {
			likely = true
		}
		if likely {
			best = min(best, sc)
		}
	}
	var over map[string]bool
	for k, sc := range score {
		if !keep[k] && sc > best*(1+premium) {
			if over == nil {
				over = map[string]bool{}
			}
			over[k] = true
		}
	}
	return over
}
