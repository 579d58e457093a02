package aws_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakeec2"
)

// offeringKinds lists, per zone, which capacity types an instance type has.
func offeringKinds(offs []providers.Offering, typ string) map[string][]providers.CapacityType {
	out := map[string][]providers.CapacityType{}
	for _, o := range offs {
		if o.InstanceType == typ {
			out[o.Zone] = append(out[o.Zone], o.CapacityType)
		}
	}
	return out
}

func has(cts []providers.CapacityType, ct providers.CapacityType) bool {
	for _, c := range cts {
		if c == ct {
			return true
		}
	}
	return false
}

// TestOfferingsFromCatalogue: zones come from DescribeInstanceTypeOfferings,
// spot prices only add spot offerings.
func TestOfferingsFromCatalogue(t *testing.T) {
	cases := []struct {
		name         string
		setup        func(f *fakeec2.Server)
		zone         string
		spot, onDemd bool
	}{
		{name: "offered with a spot price", setup: func(f *fakeec2.Server) {
		}, zone: "us-east-1a", spot: true, onDemd: true},
		{name: "no spot price: on-demand only", setup: func(f *fakeec2.Server) {
			f.RemoveSpotPrices("us-east-1a", "p4d.24xlarge")
		}, zone: "us-east-1a", spot: false, onDemd: true},
		{name: "not offered in the zone: nothing, even with a spot price", setup: func(f *fakeec2.Server) {
			f.RemoveOffering("us-east-1b", "p4d.24xlarge")
		}, zone: "us-east-1b", spot: false, onDemd: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake, url := newFake(t)
			tc.setup(fake)
			p := aws.New(testOptions())
			offs, err := p.Offerings(ctxT(t), config(t, "f", baseBlock(url)))
			if err != nil {
				t.Fatal(err)
			}
			got := offeringKinds(offs, "p4d.24xlarge")[tc.zone]
			if has(got, providers.Spot) != tc.spot || has(got, providers.OnDemand) != tc.onDemd {
				t.Errorf("p4d.24xlarge in %s: %v, want spot=%v on-demand=%v", tc.zone, got, tc.spot, tc.onDemd)
			}
			// The other zones are untouched.
			if z := offeringKinds(offs, "p4d.24xlarge")["us-west-2a"]; len(z) != 2 {
				t.Errorf("p4d.24xlarge in us-west-2a: %v, want spot and on-demand", z)
			}
		})
	}
}

// TestSpotPriceProducts: both Linux product descriptions count, the newest
// entry of either wins, other products never do.
func TestSpotPriceProducts(t *testing.T) {
	fake, url := newFake(t)
	now := time.Now().UTC()
	fake.RemoveSpotPrices("us-east-1a", "g5.xlarge")
	fake.SetSpotPriceProduct("us-east-1a", "g5.xlarge", "Linux/UNIX", 0.50, now.Add(-20*time.Minute))
	fake.SetSpotPriceProduct("us-east-1a", "g5.xlarge", "Linux/UNIX (Amazon VPC)", 0.40, now.Add(-10*time.Minute))
	fake.SetSpotPriceProduct("us-east-1a", "g5.xlarge", "Windows", 0.10, now.Add(-time.Minute))
	fake.RemoveSpotPrices("us-east-1b", "g5.xlarge")
	fake.SetSpotPriceProduct("us-east-1b", "g5.xlarge", "Linux/UNIX (Amazon VPC)", 0.45, now.Add(-time.Minute))
	p := aws.New(testOptions())
	offs, err := p.Offerings(ctxT(t), config(t, "f", baseBlock(url)))
	if err != nil {
		t.Fatal(err)
	}
	if o := find(t, offs, "us-east-1a", "g5.xlarge", providers.Spot); !approx(o.PricePerHour, 0.40) {
		t.Errorf("us-east-1a g5.xlarge spot = %v, want the newest Linux entry 0.40", o.PricePerHour)
	}
	if o := find(t, offs, "us-east-1b", "g5.xlarge", providers.Spot); !approx(o.PricePerHour, 0.45) {
		t.Errorf("us-east-1b g5.xlarge spot = %v, want 0.45 from a \"Linux/UNIX (Amazon VPC)\" entry", o.PricePerHour)
	}
}

func TestPlacementScores(t *testing.T) {
	fake, url := newFake(t)
	fake.SetPlacementScore("us-east-1a", "g5.xlarge", 3)
	fake.SetPlacementScore("us-east-1b", "g5.xlarge", 8)
	fake.SetCapacity("us-east-1b", "p4d.24xlarge", 1)
	var now = time.Now()
	opts := testOptions()
	opts.Now = func() time.Time { return now }
	p := aws.New(opts)
	cfg := config(t, "f", with(baseBlock(url), "placement_score_capacity", 4))
	offs, err := p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		zone, typ string
		want      int
	}{
		{"us-east-1a", "g5.xlarge", 3}, {"us-east-1b", "g5.xlarge", 8},
		{"us-east-1b", "p4d.24xlarge", 2}, // capacity 1 < target 4
		{"us-east-1a", "p4d.24xlarge", 9}, {"us-west-2a", "g5.xlarge", 9},
	} {
		if o := find(t, offs, c.zone, c.typ, providers.Spot); o.PlacementScore != c.want || o.PlacementScoreNote != "" {
			t.Errorf("%s %s spot: score %d note %q, want %d", c.zone, c.typ, o.PlacementScore, o.PlacementScoreNote, c.want)
		}
		if o := find(t, offs, c.zone, c.typ, providers.OnDemand); o.PlacementScore != 0 {
			t.Errorf("%s %s on-demand has a spot score %d", c.zone, c.typ, o.PlacementScore)
		}
	}
	if q := fake.LastRequest("GetSpotPlacementScores"); q.Get("TargetCapacity") != "4" || q.Get("SingleAvailabilityZone") != "true" {
		t.Errorf("GetSpotPlacementScores request %v, want TargetCapacity=4 SingleAvailabilityZone=true", q)
	}
	calls := fake.Calls("GetSpotPlacementScores")
	if calls != 4 { // 2 regions × 2 types
		t.Errorf("%d GetSpotPlacementScores calls, want 4 (one configuration per region and type)", calls)
	}
	if _, err := p.Offerings(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	if got := fake.Calls("GetSpotPlacementScores"); got != calls {
		t.Errorf("scores refetched within their TTL: %d calls, want %d", got, calls)
	}
}

func TestPlacementScoresDegrade(t *testing.T) {
	cases := []struct{ code, msg, note string }{
		{"UnauthorizedOperation", "You are not authorized to perform this operation.", "denied (UnauthorizedOperation)"},
		{"InvalidAction", "The action GetSpotPlacementScores is not valid for this web service.", "not available (InvalidAction)"},
		{"MaxConfigLimitExceeded", "You have exceeded your maximum allowed Spot placement configurations.", "retrying in 24 h"},
	}
	for _, tc := range cases {
		t.Run(tc.code, func(t *testing.T) {
			fake, url := newFake(t)
			fake.FailNext("GetSpotPlacementScores", tc.code, tc.msg, 100)
			now := time.Now()
			opts := testOptions()
			opts.Now = func() time.Time { return now }
			p := aws.New(opts)
			cfg := config(t, "f", with(baseBlock(url), "regions", []string{"us-east-1"}))
			offs, err := p.Offerings(ctxT(t), cfg)
			if err != nil {
				t.Fatalf("Offerings failed with scores unavailable: %v", err)
			}
			o := find(t, offs, "us-east-1a", "g5.xlarge", providers.Spot)
			if o.PlacementScore != 0 || !strings.Contains(o.PlacementScoreNote, tc.note) {
				t.Errorf("score %d note %q, want 0 and a note containing %q", o.PlacementScore, o.PlacementScoreNote, tc.note)
			}
			calls := fake.Calls("GetSpotPlacementScores")
			if calls != 1 {
				t.Errorf("%d calls, want 1 (one attempt, no SDK retries)", calls)
			}
			now = now.Add(aws.DefaultPlacementScoreTTL + time.Minute)
			if _, err := p.Offerings(ctxT(t), cfg); err != nil {
				t.Fatal(err)
			}
			if got := fake.Calls("GetSpotPlacementScores"); got != calls {
				t.Errorf("a refused score call was retried after %v (%d calls)", aws.DefaultPlacementScoreTTL, got)
			}
		})
	}
}
