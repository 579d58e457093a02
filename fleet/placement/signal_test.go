package placement

import (
	"testing"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// TestPlacementScoreInRanking: the cloud's spot placement score shapes the
// interruption prior, so between equal prices the better-scored zone ranks
// first, a small price edge does not beat a bad score, and the learned
// history outweighs the score once the deployment has run there.
func TestPlacementScoreInRanking(t *testing.T) {
	m := DefaultModel()
	f := fleet(1, 4)
	scored := func(zone string, price float64, score int) providers.Offering {
		o := off("aws", zone, "p4d.24xlarge", providers.Spot, price, -1)
		o.PlacementScore = score
		return o
	}
	cases := []struct {
		name  string
		offs  []providers.Offering
		recs  map[string]state.OfferingRecord
		first string
	}{
		{"equal prices: higher score first",
			[]providers.Offering{scored("us-east-1a", 10, 3), scored("us-east-1b", 10, 9)}, nil, "us-east-1b"},
		{"no score counts as neutral (6)",
			[]providers.Offering{scored("us-east-1a", 10, 0), scored("us-east-1b", 10, 5)}, nil, "us-east-1a"},
		{"1% cheaper does not beat score 1 vs 10",
			[]providers.Offering{scored("us-east-1a", 9.9, 1), scored("us-east-1b", 10, 10)}, nil, "us-east-1b"},
		{"30% cheaper beats a better score",
			[]providers.Offering{scored("us-east-1a", 7, 3), scored("us-east-1b", 10, 9)}, nil, "us-east-1a"},
		{"history outweighs the score",
			[]providers.Offering{scored("us-east-1a", 10, 3), scored("us-east-1b", 10, 9)},
			map[string]state.OfferingRecord{
				scored("us-east-1a", 10, 3).Key(): {RunSeconds: 500 * 3600},
				scored("us-east-1b", 10, 9).Key(): {RunSeconds: 50 * 3600, Interruptions: 10},
			}, "us-east-1a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Rank(f, tc.offs, tc.recs, t0, m)
			if r[0].Offering.Zone != tc.first {
				t.Errorf("first %s (score %.3f), want %s; ranking %+v", r[0].Offering.Zone, r[0].Score, tc.first, r)
			}
		})
	}
	for score, want := range map[int]float64{0: 1, 1: 2, 6: 1, 10: 0.2, 11: 1, -1: 1} {
		if got := ScorePriorFactor(score); got != want {
			t.Errorf("ScorePriorFactor(%d) = %v, want %v", score, got, want)
		}
	}
}
