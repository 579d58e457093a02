package placement

import (
	"sort"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// Ranked is one line of the market view (`fleetd offerings`).
type Ranked struct {
	Candidate
	Group           string  `json:"group"`
	PricePerGPUHour float64 `json:"price_per_gpu_hour"`
	Interruptions   int     `json:"interruptions"`
	RunHours        float64 `json:"run_hours"`
	// UnavailableUntil and UnavailableReason come from the unavailable-
	// offerings cache; the reason stays after expiry until a launch succeeds.
	UnavailableUntil  time.Time `json:"unavailable_until,omitzero"`
	UnavailableReason string    `json:"unavailable_reason,omitempty"`
	// Excluded says why the offering cannot be launched now; "" when it can.
	Excluded string `json:"excluded,omitempty"`
}

// Rank returns every offering with its figures: the launchable ones first
// in the fleet's strategy order, then the excluded ones (by reason, key).
func Rank(f *spec.Fleet, offs []providers.Offering, recs map[string]state.OfferingRecord, now time.Time, m Model) []Ranked {
	m = m.withDefaults()
	s := strategyOf(f)
	c := colocateOf(f)
	out := make([]Ranked, 0, len(offs))
	for _, o := range offs {
		rec := recs[o.Key()]
		r := Ranked{
			Candidate:         m.Evaluate(o, rec, s),
			Group:             GroupKey(o, c),
			PricePerGPUHour:   o.PricePerGPUHour(),
			Interruptions:     rec.Interruptions,
			RunHours:          rec.RunSeconds / 3600,
			UnavailableReason: rec.UnavailableReason,
		}
		if rec.UnavailableUntil.After(now) {
			r.UnavailableUntil = rec.UnavailableUntil
		}
		switch {
		case Exclusion(f, o) != "":
			r.Excluded = Exclusion(f, o)
		case !Available(rec, now):
			r.Excluded = "unavailable until " + rec.UnavailableUntil.UTC().Format(time.RFC3339)
		case o.Available == 0:
			r.Excluded = "no capacity"
		}
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.Excluded == "") != (b.Excluded == "") {
			return a.Excluded == ""
		}
		if a.Excluded != "" {
			if a.Excluded != b.Excluded {
				return a.Excluded < b.Excluded
			}
			return a.Offering.Key() < b.Offering.Key()
		}
		return less(a.Candidate, b.Candidate, s)
	})
	return out
}
