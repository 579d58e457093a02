package fleet

import (
	"slices"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// priceInfo is where the prices of one provider's offerings for a fleet
// come from and the date of the oldest.
type priceInfo struct {
	sources []string
	oldest  time.Time
}

// notePrices remembers, after a provider's offerings were listed for a
// fleet's pass, the price sources and the oldest price date of those that
// fit the fleet's node: the prices placement decides with now. Status
// shows them rather than the prices each live node was launched at, which
// only age.
func (d *Daemon) notePrices(fleet, provider string, fl *spec.Fleet, offs []providers.Offering) {
	var pi priceInfo
	fits := false
	for _, o := range offs {
		if fl != nil && placement.Exclusion(fl, o) != "" {
			continue
		}
		fits = true
		if o.PriceSource != "" && !slices.Contains(pi.sources, o.PriceSource) {
			pi.sources = append(pi.sources, o.PriceSource)
		}
		if !o.PriceAsOf.IsZero() && (pi.oldest.IsZero() || o.PriceAsOf.Before(pi.oldest)) {
			pi.oldest = o.PriceAsOf
		}
	}
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	if d.stats.prices == nil {
		d.stats.prices = map[string]map[string]priceInfo{}
	}
	if !fits {
		delete(d.stats.prices[fleet], provider)
		return
	}
	if d.stats.prices[fleet] == nil {
		d.stats.prices[fleet] = map[string]priceInfo{}
	}
	d.stats.prices[fleet][provider] = pi
}

// currentPrices puts into a summary the sources and oldest date of the
// prices placement uses for the fleet, when the daemon has listed
// offerings for it; before that the summary keeps those of its live
// nodes' launches (notePriceAge).
func (d *Daemon) currentPrices(s *api.FleetSummary) {
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	byProvider := d.stats.prices[s.Name]
	if len(byProvider) == 0 {
		return
	}
	provs := make([]string, 0, len(byProvider))
	for p := range byProvider {
		provs = append(provs, p)
	}
	slices.Sort(provs)
	s.PriceSources, s.PricesAsOf = nil, time.Time{}
	for _, p := range provs {
		pi := byProvider[p]
		for _, src := range pi.sources {
			if !slices.Contains(s.PriceSources, src) {
				s.PriceSources = append(s.PriceSources, src)
			}
		}
		if !pi.oldest.IsZero() && (s.PricesAsOf.IsZero() || pi.oldest.Before(s.PricesAsOf)) {
			s.PricesAsOf = pi.oldest
		}
	}
}
