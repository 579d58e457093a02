package gcp_test

import (
	"testing"

	"github.com/fleetd/fleetd/providers/gcp/fakegce"
)

// TestOfferingsSayTheirNetwork: every offering carries the name of the
// VPC network the block launches into, "default" when unset, however the
// block spells it.
func TestOfferingsSayTheirNetwork(t *testing.T) {
	cases := []struct {
		network any // nil: unset
		want    string
	}{
		{nil, "default"},
		{"training", "training"},
		{"projects/host-proj/global/networks/shared-vpc", "shared-vpc"},
		{"https://www.googleapis.com/compute/v1/projects/p/global/networks/ml-net", "ml-net"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			_, cfg := newFake(t, fakegce.Options{}, map[string]any{"network": tc.network})
			offs, err := newProvider().Offerings(ctxT(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(offs) == 0 {
				t.Fatal("no offerings")
			}
			for _, o := range offs {
				if o.VPC != tc.want {
					t.Errorf("%s: VPC %q, want %q", o.Key(), o.VPC, tc.want)
				}
			}
		})
	}
}
