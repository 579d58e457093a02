package placement

import (
	"fmt"
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
	return RankIn(f, offs, recs, Outlook{Now: now}, m)
}

// RankIn is Rank with what the outlook knows (the market history, the
// notice lead, the slack's value), as the reconciler ranks; its Now is
// the clock.
func RankIn(f *spec.Fleet, offs []providers.Offering, recs map[string]state.OfferingRecord, ol Outlook, m Model) []Ranked {
	m = m.withDefaults()
	now := ol.Now
	s := strategyOf(f)
	c := colocateOf(f)
	data := DataCostFor(f)
	out := make([]Ranked, 0, len(offs))
	for _, o := range offs {
		rec := recs[o.Key()]
		r := Ranked{
			Candidate:         data.apply(m.EvaluateIn(o, rec, s, ol)),
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

// Explain says what a candidate is expected to cost per useful GPU-hour
// and why: its price, what interruptions add, and (spot) how long a run
// started now is expected to last.
func Explain(c Candidate) string {
	o := c.Offering
	s := fmt.Sprintf("%s: $%.3f/GPU-h + $%.3f interruptions = $%.3f per useful GPU-hour",
		o.Key(), o.PricePerGPUHour(), c.InterruptionCost, c.Score)
	if c.DataCost > 0 {
		s = fmt.Sprintf("%s: $%.3f/GPU-h + $%.3f interruptions + $%.3f data = $%.3f per useful GPU-hour",
			o.Key(), o.PricePerGPUHour(), c.InterruptionCost, c.DataCost, c.Score)
	}
	if o.CapacityType == providers.Spot && c.ExpectedRun > 0 {
		s += fmt.Sprintf(" (expected up-run %.1f h, %.3f interruptions/h)", c.ExpectedRun, c.Rate)
	}
	if o.Network.Fast() {
		s += "; network " + o.Network.String()
	}
	return s
}

// ExplainLaunch explains each offering a choice launches on, once, in
// the choice's candidate order.
func ExplainLaunch(ch Choice) []string {
	want := map[string]bool{}
	for _, o := range ch.Launch {
		want[o.Key()] = true
	}
	var out []string
	for _, c := range ch.Candidates {
		if k := c.Offering.Key(); want[k] {
			delete(want, k)
			out = append(out, Explain(c))
		}
	}
	return out
}
