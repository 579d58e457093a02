package controller

import (
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
)

// TestMergeSpotHistory: per offering the better informed history wins,
// ties go to the fleet's fresher look, and fleet-local marks are dropped.
func TestMergeSpotHistory(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0.Add(10 * time.Hour)
	seen := func(key string, ends int, upH float64, up bool, since time.Time) placement.SpotSeen {
		return placement.SpotSeen{Key: key, Ends: ends, UpSeconds: upH * 3600, Up: up, Since: since}
	}
	into := []placement.SpotSeen{
		seen("a", 5, 20, true, t0),
		seen("b", 1, 3, false, t0),
		seen("c", 2, 4, true, t0),
	}
	fresh := seen("c", 2, 4, true, t0)
	fresh.CarriedEnds, fresh.CarriedUpSeconds = 2, 4*3600
	from := []placement.SpotSeen{
		seen("a", 1, 2, true, t0.Add(9*time.Hour)), // knows less than the deployment
		seen("b", 2, 3, true, t0.Add(8*time.Hour)), // one more ended run
		fresh, // as informed: the fleet's look
		seen("d", 0, 0, true, t0.Add(7*time.Hour)), // new offering
	}
	got := mergeSpotHistory(into, from, now)
	want := []placement.SpotSeen{into[0], from[1], seen("c", 2, 4, true, t0), from[3]}
	if !(placement.FallbackState{Spot: got}).Equal(placement.FallbackState{Spot: want}) {
		t.Fatalf("merged\n%+v\nwant\n%+v", got, want)
	}
}
