package controller

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/state"
)

// The deployment's spot market history: what every fleet has seen of the
// spot market (placement.ObserveSpot), merged per offering and kept in
// meta, so that a new fleet starts from what earlier fleets saw instead
// of from the prior (placement.CarrySpot). Each fleet keeps its own
// history in its runtime as before; this is only the hand-over.

const MarketHistoryKey = "market/spot"

// marketFresh is how old the deployment's history may be for a new fleet
// to take over the current state of each offering (up since when): a few
// reconcile ticks. Older, the new fleet's first look starts it.
const marketFresh = 2 * time.Minute

// MarketHistory is the value under MarketHistoryKey.
type MarketHistory struct {
	// At is the last time a fleet's look was folded in.
	At   time.Time            `json:"at"`
	Spot []placement.SpotSeen `json:"spot"`
}

func LoadMarketHistory(tx state.Tx) (MarketHistory, error) {
	var h MarketHistory
	_, err := state.ReadMetaJSON(tx, MarketHistoryKey, "market history", &h)
	return h, err
}

// seedSpotHistory gives a fleet that has no persisted runtime yet (a new
// fleet) the deployment's market history to start from.
func (c *Controller) seedSpotHistory(ctx context.Context, rt *Runtime, now time.Time) {
	if rt.saved != nil || len(rt.Fallback.Spot) > 0 {
		return
	}
	h, err := state.Read(ctx, c.store, LoadMarketHistory)
	if err != nil {
		c.log.Warn("load market history; the fleet starts from the prior", "err", err)
		return
	}
	rt.Fallback.Spot = placement.CarrySpot(h.Spot, h.At, now, marketFresh)
}

// noteSpotHistory folds a fleet's history into the deployment's when a
// pass changed it (prev → next): per offering, the better informed of
// the two wins (more ended runs, then more up time), ties going to the
// fleet's fresher look.
func (c *Controller) noteSpotHistory(ctx context.Context, prev, next []placement.SpotSeen, now time.Time) {
	if len(next) == 0 || (placement.FallbackState{Spot: prev}).Equal(placement.FallbackState{Spot: next}) {
		return
	}
	err := c.store.Update(ctx, func(tx state.Tx) error {
		h, err := LoadMarketHistory(tx)
		if err != nil {
			c.log.Warn("market history unreadable; starting it afresh", "err", err)
			h = MarketHistory{}
		}
		h.Spot = mergeSpotHistory(h.Spot, next, now)
		h.At = now
		b, err := json.Marshal(h)
		if err != nil {
			return err
		}
		return tx.SetMeta(MarketHistoryKey, b)
	})
	if err != nil && ctx.Err() == nil {
		c.log.Warn("save market history; retried at the next change", "err", err)
	}
}

// mergeSpotHistory merges a fleet's history (from) into the deployment's
// (into), by offering key; the result is sorted by key and carries no
// Carried* marks (those belong to a fleet).
func mergeSpotHistory(into, from []placement.SpotSeen, now time.Time) []placement.SpotSeen {
	byKey := map[string]placement.SpotSeen{}
	for _, s := range into {
		byKey[s.Key] = s
	}
	info := func(s placement.SpotSeen) (int, float64) {
		return s.Ends, s.UpSeconds + s.UpFor(now).Seconds()
	}
	for _, s := range from {
		if old, ok := byKey[s.Key]; ok {
			oe, ou := info(old)
			ne, nu := info(s)
			if oe > ne || (oe == ne && ou > nu) {
				continue
			}
		}
		byKey[s.Key] = s
	}
	out := make([]placement.SpotSeen, 0, len(byKey))
	for _, s := range byKey {
		s.CarriedEnds, s.CarriedUpSeconds = 0, 0
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b placement.SpotSeen) int {
		switch {
		case a.Key < b.Key:
			return -1
		case a.Key > b.Key:
			return 1
		}
		return 0
	})
	return out
}

// SpotOutlook is what `fleetd offerings` and plans rank by beyond the
// records: the deployment's market history as a new fleet would start
// from it.
func SpotOutlook(ctx context.Context, st state.Store, now time.Time) placement.Outlook {
	out := placement.Outlook{Now: now, Lead: placement.DefaultNoticeLead}
	_ = st.View(ctx, func(tx state.Tx) error {
		h, err := LoadMarketHistory(tx)
		if err == nil {
			out.Spot = placement.CarrySpot(h.Spot, h.At, now, marketFresh)
		}
		return nil
	})
	return out
}
