package placement

import (
	"math"
	"sort"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// MarketPriorHours is the prior on how long a spot offering's capacity
// stays up: one end per MarketPriorHours of up time, before (and blended
// with) what the daemon observed. Spot GPU capacity is typically in AWS's
// ">20 % interruptions" band; 8 h keeps a few observed short runs from
// being drowned by the prior, and one long run from making an offering
// look permanent.
const MarketPriorHours = 8.0

// DefaultNoticeLead is the node time an interruption bills without
// progress: the cloud's notice lead (AWS's two-minute warning; GCP gives
// 30 s), during which the node only drains.
const DefaultNoticeLead = 2 * time.Minute

// SpotSeen is what the daemon has observed of one spot offering's
// capacity: whether it was launchable at the last look, since when, and
// how its earlier up-runs ended. The fleet keeps one per spot offering in
// its persisted FallbackState, so it survives restarts. Only offerings
// whose provider reports availability (Offering.Available ≥ 0) are
// tracked.
type SpotSeen struct {
	Key string `json:"key"`
	Up  bool   `json:"up"`
	// Since is the first observation of the current state.
	Since time.Time `json:"since"`
	// First: the state has not changed since the first observation, so
	// it began at Since or earlier.
	First bool `json:"first,omitempty"`
	// Ends counts observed ends of up-runs (capacity gone, our own
	// instance interrupted included); UpSeconds is the up time of the
	// runs that ended, seen without having to run there.
	Ends      int     `json:"ends,omitempty"`
	UpSeconds float64 `json:"up_seconds,omitempty"`
	// CarriedEnds and CarriedUpSeconds are the part of Ends and UpSeconds
	// the fleet started from (CarrySpot: what earlier fleets of the
	// deployment saw). ExpectedRun uses all of it; ChangeRate only what
	// this fleet saw.
	CarriedEnds      int     `json:"carried_ends,omitempty"`
	CarriedUpSeconds float64 `json:"carried_up_seconds,omitempty"`
}

// known reports whether the offering's current state has been observed;
// a carried entry whose state went stale has not (CarrySpot).
func (s SpotSeen) known() bool { return !s.Since.IsZero() }

func (s SpotSeen) equal(o SpotSeen) bool {
	return s.Key == o.Key && s.Up == o.Up && s.Since.Equal(o.Since) && s.First == o.First &&
		s.Ends == o.Ends && s.UpSeconds == o.UpSeconds && s.CarriedEnds == o.CarriedEnds && s.CarriedUpSeconds == o.CarriedUpSeconds
}

// UpFor is how long the offering has been seen launchable at now; 0 when
// it is down.
func (s SpotSeen) UpFor(now time.Time) time.Duration {
	if !s.Up || now.Before(s.Since) {
		return 0
	}
	return now.Sub(s.Since)
}

// ObserveSpot folds one look at the market into the fleet's history and
// returns it (prev itself when nothing changed). offs is the market;
// running holds the offering keys of the fleet's own live spot nodes
// without an interruption notice: their capacity is up although the
// market shows it as taken. Offerings the fleet cannot use are ignored;
// an offering missing from offs keeps its last state.
func ObserveSpot(prev []SpotSeen, f *spec.Fleet, offs []providers.Offering, running map[string]bool, now time.Time) []SpotSeen {
	up := map[string]bool{}
	for _, o := range Filter(f, offs) {
		if o.CapacityType != providers.Spot || o.Available < 0 {
			continue
		}
		k := o.Key()
		up[k] = up[k] || o.Available > 0 || running[k]
	}
	changed := false
	out := make([]SpotSeen, 0, max(len(prev), len(up)))
	for _, s := range prev {
		u, ok := up[s.Key]
		delete(up, s.Key)
		if ok && !s.known() {
			// Carried history: the first look starts its state.
			s.Up, s.Since, s.First = u, now, true
			changed = true
		} else if ok && u != s.Up {
			if s.Up {
				s.Ends++
				s.UpSeconds += max(now.Sub(s.Since), 0).Seconds()
			}
			s.Up, s.Since, s.First = u, now, false
			changed = true
		}
		out = append(out, s)
	}
	for k, u := range up {
		out = append(out, SpotSeen{Key: k, Up: u, Since: now, First: true})
		changed = true
	}
	if !changed {
		return prev
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// CarrySpot is the history a new fleet starts from: what earlier fleets
// of the deployment saw of the spot market (h, last folded in at `at`),
// as seen at now. Ended up-runs carry over as they are (CarriedEnds,
// CarriedUpSeconds) and tell ExpectedRun how long each offering's
// capacity tends to stay up; the current state carries over only while
// nothing can have been missed since at — within `fresh` (the caller's
// cadence of looks) — else the new fleet's first look starts it afresh.
func CarrySpot(h []SpotSeen, at, now time.Time, fresh time.Duration) []SpotSeen {
	if len(h) == 0 {
		return nil
	}
	out := make([]SpotSeen, len(h))
	stale := now.Sub(at) > fresh || now.Before(at)
	for i, s := range h {
		if stale || !s.known() {
			s.Up, s.Since, s.First = false, time.Time{}, false
		}
		s.CarriedEnds, s.CarriedUpSeconds = s.Ends, s.UpSeconds
		out[i] = s
	}
	return out
}

// SeenOf returns the history of the offering key, if any.
func SeenOf(h []SpotSeen, key string) (SpotSeen, bool) {
	i := sort.Search(len(h), func(i int) bool { return h[i].Key >= key })
	if i < len(h) && h[i].Key == key {
		return h[i], true
	}
	return SpotSeen{}, false
}

// ExpectedRun is how much longer a spot run started on o now is expected
// to last before its capacity goes (an interruption):
//
//	m = (H + H₀) / (E + 1)      mean length of o's up-runs
//	ExpectedRun = m + (a + m·[first]) / 2
//
// with H the up hours of the E up-runs observed to end and H₀ =
// MarketPriorHours. Spot capacity that has been up longer tends to stay
// up longer (up-runs are heavy-tailed), hence the age a of the current
// run; half of it, as the measured mean remaining life grows slower than
// the age (docs/placement.md). A run already up at the first look began
// earlier, by a mean run as far as anyone knows. Offerings whose
// availability is not reported fall back to the daemon's own history:
// m from the record's interruptions over its run hours, age unknown.
func ExpectedRun(o providers.Offering, seen []SpotSeen, rec state.OfferingRecord, now time.Time) time.Duration {
	return Outlook{Now: now, Spot: seen}.ExpectedRun(o, rec)
}

// RunForecast tells how much longer the spot capacity of the offering
// key stays up from now; false when it does not know. Only fleetd sim's
// foresight policy has one (the trace's own future): it bounds what a
// better prediction of interruptions could gain.
type RunForecast func(key string, now time.Time) (time.Duration, bool)

// ExpectedRun is the package's ExpectedRun for o with what the outlook
// knows: its Forecast when it has one for o, else the market history.
func (out Outlook) ExpectedRun(o providers.Offering, rec state.OfferingRecord) time.Duration {
	if out.Forecast != nil {
		if d, ok := out.Forecast(o.Key(), out.Now); ok {
			return d
		}
	}
	seen, now := out.Spot, out.Now
	var m, age float64
	if s, ok := SeenOf(seen, o.Key()); ok {
		m = (s.UpSeconds/3600 + MarketPriorHours) / float64(s.Ends+1)
		age = s.UpFor(now).Hours()
		if s.First || !s.known() {
			age += m
		}
	} else {
		m = (max(rec.RunSeconds, 0)/3600 + MarketPriorHours) / float64(max(rec.Interruptions, 0)+1)
		age = m
	}
	return hours(m + age/2)
}

// ChangeRate is how often, per hour of running, the fleet's spot runs are
// expected to end: observed ends over observed up hours of every tracked
// offering, with the prior. Without market history it is the daemon's
// own interruptions over its spot run hours.
func ChangeRate(seen []SpotSeen, recs map[string]state.OfferingRecord, now time.Time) float64 {
	ends, up := 0.0, 0.0
	for _, s := range seen {
		// Only what this fleet saw: the slack value it feeds was measured
		// on the market of the job's own time (docs/placement.md), and a
		// carried history mixes calm and flapping weeks.
		ends += float64(max(s.Ends-s.CarriedEnds, 0))
		up += max(s.UpSeconds-s.CarriedUpSeconds, 0)/3600 + s.UpFor(now).Hours()
	}
	if len(seen) == 0 {
		for _, r := range recs {
			if strings.HasSuffix(r.Key, "/"+string(providers.Spot)) {
				ends += float64(max(r.Interruptions, 0))
				up += max(r.RunSeconds, 0) / 3600
			}
		}
	}
	return (ends + 1) / (up + MarketPriorHours)
}

func hours(h float64) time.Duration {
	if h >= math.MaxInt64/float64(time.Hour) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(h * float64(time.Hour))
}
