package stats

import (
	"slices"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
)

// TestStatusPriceAge: a fleet's status names the sources and age of the
// prices placement decides with now (its last market view, offerings that
// fit its node), not those its live nodes were launched at; before any
// market view it keeps the launch-time ones.
func TestStatusPriceAge(t *testing.T) {
	d := New(nil)
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	launched := api.FleetSummary{Name: "bert", PriceSources: []string{"AWS Price List API"}, PricesAsOf: now.Add(-72 * time.Hour)}
	fl := &spec.Fleet{Name: "bert", Node: spec.Node{GPUs: 8, Spot: true}, Providers: []spec.Provider{{Name: "aws"}, {Name: "gcp"}}}
	off := func(provider string, gpus int, ct providers.CapacityType, src string, asOf time.Time) providers.Offering {
		return providers.Offering{Provider: provider, InstanceType: "x", GPUs: gpus, CapacityType: ct, PriceSource: src, PriceAsOf: asOf}
	}
	steps := []struct {
		name     string
		provider string
		offs     []providers.Offering
		sources  []string
		asOf     time.Time
	}{
		{name: "no market view yet: launch-time prices", sources: launched.PriceSources, asOf: launched.PricesAsOf},
		{name: "aws listed", provider: "aws", offs: []providers.Offering{
			off("aws", 8, providers.OnDemand, "AWS Price List API", now.Add(-2*time.Hour)),
			off("aws", 8, providers.Spot, "DescribeSpotPriceHistory", now.Add(-10*time.Minute)),
			off("aws", 1, providers.OnDemand, "bundled table", now.Add(-4000*time.Hour)), // does not fit: not used
		}, sources: []string{"AWS Price List API", "DescribeSpotPriceHistory"}, asOf: now.Add(-2 * time.Hour)},
		{name: "gcp listed too", provider: "gcp", offs: []providers.Offering{
			off("gcp", 8, providers.Spot, "Cloud Billing Catalog API", now.Add(-5*time.Hour)),
		}, sources: []string{"AWS Price List API", "DescribeSpotPriceHistory", "Cloud Billing Catalog API"}, asOf: now.Add(-5 * time.Hour)},
		{name: "nothing of gcp fits any more", provider: "gcp", offs: []providers.Offering{off("gcp", 4, providers.Spot, "Cloud Billing Catalog API", now)},
			sources: []string{"AWS Price List API", "DescribeSpotPriceHistory"}, asOf: now.Add(-2 * time.Hour)},
	}
	for _, st := range steps {
		if st.provider != "" {
			d.Prices("bert", st.provider, fl, st.offs)
		}
		s := launched
		s.PriceSources = slices.Clone(launched.PriceSources)
		d.CurrentPrices(&s)
		if !slices.Equal(s.PriceSources, st.sources) || !s.PricesAsOf.Equal(st.asOf) {
			t.Errorf("%s: prices from %q as of %v; want %q as of %v", st.name, s.PriceSources, s.PricesAsOf, st.sources, st.asOf)
		}
	}
	// Another fleet is not affected.
	other := api.FleetSummary{Name: "other", PriceSources: []string{"bundled table"}}
	d.CurrentPrices(&other)
	if !slices.Equal(other.PriceSources, []string{"bundled table"}) {
		t.Errorf("another fleet's prices changed to %q", other.PriceSources)
	}
}
