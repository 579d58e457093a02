package plugins

import (
	"math"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/providers"
)

// The wire carries int32 counts: an offering whose count does not fit is
// refused, naming the first such field in wire order.
func TestOfferingToPBNarrowing(t *testing.T) {
	const big = math.MaxInt32 + 1
	cases := []struct {
		name string
		o    providers.Offering
		want string // "" for no error
	}{
		{"fits", providers.Offering{GPUs: 8, VCPUs: 96, Available: -1, PlacementScore: 9}, ""},
		{"gpus", providers.Offering{GPUs: big}, "gpus"},
		{"vcpus", providers.Offering{VCPUs: big}, "vcpus"},
		{"available", providers.Offering{Available: math.MinInt32 - 1}, "available"},
		{"placement score", providers.Offering{PlacementScore: big}, "placement_score"},
		{"the first of two", providers.Offering{Available: big, PlacementScore: big}, "available"},
	}
	for _, tc := range cases {
		pb, err := offeringToPB(tc.o)
		switch {
		case tc.want == "" && (err != nil || pb.GetGpus() != int32(tc.o.GPUs) || pb.GetAvailable() != int32(tc.o.Available) || pb.GetPlacementScore() != int32(tc.o.PlacementScore)):
			t.Errorf("%s: %v, %v", tc.name, pb, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), ": "+tc.want+" ") || !providers.IsInvalidConfig(err)):
			t.Errorf("%s: error %v, want an invalid-config error about %s", tc.name, err, tc.want)
		}
	}
}
