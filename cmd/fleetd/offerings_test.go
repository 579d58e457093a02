package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/providers"
)

// TestEmptyOfferingsNote: an empty `fleetd offerings` table says why —
// no offerings at all, or every one excluded, by reason, most common
// first.
func TestEmptyOfferingsNote(t *testing.T) {
	tests := []struct {
		name     string
		n        int
		excluded map[string]int
		want     []string
	}{
		{"market empty", 0, nil, []string{"no offerings from the fleet's providers"}},
		{"all excluded", 18, map[string]int{`GPU type V100 not in ["A100"]`: 9, "spot: on_demand_fallback never": 9},
			[]string{"all 18 are excluded (-all lists them)", `9 × GPU type V100 not in ["A100"]; 9 × spot`}},
		{"many reasons", 5, map[string]int{"a": 2, "b": 1, "c": 1, "d": 1}, []string{"2 × a; 1 × b; 1 × c; 1 more reasons"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := emptyOfferingsNote(tt.n, tt.excluded)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("note %q lacks %q", got, w)
				}
			}
		})
	}
}

// TestOfferingsTableNetwork: the human offerings table shows each
// offering's network when a fast path is on offer, and keeps its usual
// columns when none is.
func TestOfferingsTableNetwork(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	off := func(typ string, price float64, n providers.NetworkInfo, excluded string) placement.Ranked {
		r := placement.Ranked{Excluded: excluded, PricePerGPUHour: price / 8}
		r.Offering = providers.Offering{Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: typ,
			CapacityType: providers.Spot, PricePerHour: price, Available: -1, Network: n}
		r.Score = r.PricePerGPUHour
		return r
	}
	p5 := providers.NetworkInfo{Fabric: providers.FabricEFA, Interfaces: 32, BandwidthGbps: 3200}
	views := []fleet.OfferingsView{
		{Fleet: "llm", Offerings: []placement.Ranked{off("p5.48xlarge", 31.5, p5, ""), off("g5.48xlarge", 5.1, providers.NetworkInfo{}, "network: no fast path on g5.48xlarge (node.network = \"fast\")")}},
		{Fleet: "small", Offerings: []placement.Ranked{off("g5.xlarge", 0.4, providers.NetworkInfo{}, "")}},
	}
	var b bytes.Buffer
	printOfferings(&b, views, true, now)
	checkGolden(t, "offerings_network.golden", b.Bytes())
}
