package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/providers"
)

// priceNotes say per provider where the offerings' prices come from and
// how old they are, e.g. "prices aws: on-demand from AWS Price List API,
// 3m old; spot from DescribeSpotPriceHistory, 2h10m old": the age is that
// of the oldest price of the group, from its PriceAsOf.
func priceNotes(offs []providers.Offering, now time.Time) []string {
	type group struct {
		n      int
		oldest time.Time
	}
	by := map[string]map[providers.CapacityType]map[string]*group{} // provider, capacity, source
	for _, o := range offs {
		src := o.PriceSource
		if src == "" {
			src = "unstated source"
		}
		if by[o.Provider] == nil {
			by[o.Provider] = map[providers.CapacityType]map[string]*group{}
		}
		if by[o.Provider][o.CapacityType] == nil {
			by[o.Provider][o.CapacityType] = map[string]*group{}
		}
		g := by[o.Provider][o.CapacityType][src]
		if g == nil {
			g = &group{}
			by[o.Provider][o.CapacityType][src] = g
		}
		g.n++
		if !o.PriceAsOf.IsZero() && (g.oldest.IsZero() || o.PriceAsOf.Before(g.oldest)) {
			g.oldest = o.PriceAsOf
		}
	}
	provs := make([]string, 0, len(by))
	for p := range by {
		provs = append(provs, p)
	}
	sort.Strings(provs)
	var out []string
	for _, p := range provs {
		var parts []string
		for _, ct := range []providers.CapacityType{providers.OnDemand, providers.Spot} {
			srcs := make([]string, 0, len(by[p][ct]))
			for s := range by[p][ct] {
				srcs = append(srcs, s)
			}
			sort.Strings(srcs)
			var descs []string
			for _, s := range srcs {
				descs = append(descs, s+priceAge(by[p][ct][s].oldest, now))
			}
			if len(descs) > 0 {
				parts = append(parts, fmt.Sprintf("%s from %s", ct, strings.Join(descs, " and ")))
			}
		}
		if len(parts) > 0 {
			out = append(out, fmt.Sprintf("prices %s: %s", p, strings.Join(parts, "; ")))
		}
	}
	return out
}

// priceAge is ", 3m old" for a price dated asOf, or "" when undated; a
// price older than two days also shows its date.
func priceAge(asOf, now time.Time) string {
	if asOf.IsZero() {
		return ""
	}
	d := now.Sub(asOf)
	if d < 0 {
		d = 0
	}
	if d >= 48*time.Hour {
		return fmt.Sprintf(", %s (%d days) old", asOf.UTC().Format("2006-01-02"), int(d/(24*time.Hour)))
	}
	return ", " + age(d) + " old"
}

// offeringsOf is the offerings of an offerings view.
func offeringsOf(v fleet.OfferingsView) []providers.Offering {
	out := make([]providers.Offering, len(v.Offerings))
	for i, o := range v.Offerings {
		out[i] = o.Offering
	}
	return out
}
