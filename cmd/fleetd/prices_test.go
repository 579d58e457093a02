package main

import (
	"slices"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
)

func TestPriceNotes(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	off := func(prov string, ct providers.CapacityType, src string, asOf time.Time) providers.Offering {
		return providers.Offering{Provider: prov, CapacityType: ct, PriceSource: src, PriceAsOf: asOf}
	}
	tests := []struct {
		name string
		offs []providers.Offering
		want []string
	}{
		{"none", nil, nil},
		{"aws fresh", []providers.Offering{
			off("aws", providers.Spot, "DescribeSpotPriceHistory", now.Add(-2*time.Hour)),
			off("aws", providers.Spot, "DescribeSpotPriceHistory", now.Add(-10*time.Minute)),
			off("aws", providers.OnDemand, "AWS Price List API", now.Add(-3*time.Minute)),
		}, []string{"prices aws: on-demand from AWS Price List API, 3m0s old; spot from DescribeSpotPriceHistory, 2h0m0s old"}},
		{"fallback and override", []providers.Offering{
			off("aws", providers.OnDemand, "bundled table (AWS Price List API: AccessDeniedException)", time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC)),
			off("aws", providers.OnDemand, "on_demand_prices override", time.Time{}),
			off("gcp", providers.Spot, "", time.Time{}),
		}, []string{
			"prices aws: on-demand from bundled table (AWS Price List API: AccessDeniedException), 2024-06-01 (907 days) old and on_demand_prices override",
			"prices gcp: spot from unstated source",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := priceNotes(tt.offs, now); !slices.Equal(got, tt.want) {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}
