package aws_test

import (
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakeec2"
)

// TestOfferingsSayTheirVPC: each offering carries the VPC its nodes land
// in — the VPC of the zone's subnet, or the region's default VPC without
// subnets — described once per region, not per call.
func TestOfferingsSayTheirVPC(t *testing.T) {
	cases := []struct {
		name      string
		subnets   map[string]string // zone → subnet id, added in VPC vpcOf[zone]
		vpcOf     map[string]string
		noDefault string            // region without a default VPC
		want      map[string]string // zone → VPC of its offerings
		describe  string            // the call that finds the VPCs
	}{
		{
			name:    "subnets in two VPCs",
			subnets: map[string]string{"us-east-1a": "subnet-0aaa1111", "us-east-1b": "subnet-0bbb2222", "us-west-2a": "subnet-0ccc3333"},
			vpcOf:   map[string]string{"us-east-1a": "vpc-0a000001", "us-east-1b": "vpc-0b000002"},
			want: map[string]string{"us-east-1a": "vpc-0a000001", "us-east-1b": "vpc-0b000002",
				"us-west-2a": fakeec2.DefaultVPC},
			describe: "DescribeSubnets",
		},
		{
			name:     "no subnets: the default VPC",
			want:     map[string]string{"us-east-1a": fakeec2.DefaultVPC, "us-east-1c": fakeec2.DefaultVPC, "us-west-2b": fakeec2.DefaultVPC},
			describe: "DescribeVpcs",
		},
		{
			name:      "no subnets and no default VPC: unknown",
			noDefault: "us-west-2",
			want:      map[string]string{"us-east-1a": fakeec2.DefaultVPC, "us-west-2a": "", "us-west-2b": ""},
			describe:  "DescribeVpcs",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake, url := newFake(t)
			for z, id := range tc.subnets {
				if vpc, ok := tc.vpcOf[z]; ok {
					fake.AddSubnetInVPC(id, z, vpc)
				}
			}
			if tc.noDefault != "" {
				fake.RemoveDefaultVPC(tc.noDefault)
			}
			block := with(baseBlock(url), "subnets", tc.subnets)
			if tc.subnets == nil {
				delete(block, "subnets")
			}
			p, cfg := aws.New(testOptions()), config(t, "f", block)
			var offs []providers.Offering
			for range 2 {
				var err error
				if offs, err = p.Offerings(ctxT(t), cfg); err != nil {
					t.Fatal(err)
				}
			}
			seen := map[string]bool{}
			for _, o := range offs {
				want, ok := tc.want[o.Zone]
				if !ok {
					continue
				}
				seen[o.Zone] = true
				if o.VPC != want {
					t.Errorf("%s: VPC %q, want %q", o.Key(), o.VPC, want)
				}
			}
			for z := range tc.want {
				if !seen[z] {
					t.Errorf("no offering in %s", z)
				}
			}
			// Once per region across both calls.
			if n := fake.Calls(tc.describe); n != 2 {
				t.Errorf("%s called %d times for 2 regions and 2 Offerings calls, want 2", tc.describe, n)
			}
		})
	}
}
