package plugins

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

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

// An offering crosses the wire unchanged. Every field of the fixture is
// set, so a field added to providers.Offering but not to the conversion
// fails here.
func TestOfferingRoundTrip(t *testing.T) {
	o := providers.Offering{
		Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "p5.48xlarge",
		CapacityType: providers.Spot, PricePerHour: 31.5, GPUs: 8, GPUType: "H100", VCPUs: 192, MemoryGiB: 2048,
		Available: -1, PlacementScore: 7, PlacementScoreNote: "n", Arch: "arm64",
		PriceSource: "price list", PriceAsOf: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		Network: providers.NetworkInfo{Fabric: providers.FabricEFA, Interfaces: 32, BandwidthGbps: 3200},
		VPC:     "vpc-0a1b2c3d",
	}
	v := reflect.ValueOf(o)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("fixture leaves %s unset: set it so the round trip covers it", v.Type().Field(i).Name)
		}
	}
	pb, err := offeringToPB(o)
	if err != nil {
		t.Fatal(err)
	}
	if got := offeringFromPB(pb); !reflect.DeepEqual(got, o) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, o)
	}
}
