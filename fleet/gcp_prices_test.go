package fleet

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	gcpprov "github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/gcp/fakebilling"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
)

// TestDaemonGCPPrices: a GCP fleet's prices come from the Cloud Billing
// Catalog (the real client against the in-repo fake): the market view
// (`fleetd offerings`) and the fleet's status name the catalog and date
// the prices by when it was read; a fleet whose catalog is off is priced
// from the bundled table, whose date and the reason status shows.
func TestDaemonGCPPrices(t *testing.T) {
	gce := fakegce.New(fakegce.Options{})
	defer gce.Close()
	on := fakebilling.New(fakebilling.Options{})
	defer on.Close()
	off := fakebilling.New(fakebilling.Options{})
	defer off.Close()
	off.SetDisabled(true)
	americas := []string{"us-central1", "us-east1", "us-west1"}
	for _, fb := range []*fakebilling.Server{on, off} {
		fb.AddSeries("G2 Instance", "Americas", americas, 0.024988, 0.002927, 0.0099952, 0.0011708)
		fb.AddGPU("Nvidia L4", "Americas", americas, 0.56004, 0.224)
	}
	td := launchTestDaemon(t, t.TempDir(), staticProviders{gcpprov.Name: gcpprov.New(gcpprov.Options{PollInterval: 10 * time.Millisecond})}, nil,
		Options{PollInterval: 200 * time.Millisecond})
	ctx := context.Background()
	spec := func(name, billing string) api.ApplyRequest {
		return api.ApplyRequest{Filename: name + ".hcl", Source: fmt.Sprintf(`
fleet %q {
  min_nodes = 1
  max_nodes = 1
  node { gpus = 1 }
  provider "gcp" {
    project          = %q
    zones            = ["us-central1-a"]
    machine_types    = ["g2-standard-8"]
    image            = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"
    endpoint         = %q
    billing_endpoint = %q
  }
  training { command = ["python3", "train.py"] }
}`, name, gce.Project(), gce.URL, billing)}
	}
	start := time.Now().Add(-time.Second)
	cases := []struct {
		fleet, billing string
		spot           float64
		sources        []string
		dated          func(time.Time) bool
	}{
		{fleet: "catalog", billing: on.URL, spot: 8*0.0099952 + 32*0.0011708 + 0.224,
			sources: []string{gcpprov.SourceCatalog}, dated: func(at time.Time) bool { return !at.Before(start) && !at.After(time.Now()) }},
		{fleet: "disabled", billing: off.URL,
			sources: []string{gcpprov.SourceBundled + " (" + gcpprov.SourceCatalog + ": SERVICE_DISABLED)"},
			dated:   func(at time.Time) bool { return at.Equal(gcpprov.BundledPricesAsOf) }},
	}
	for _, tc := range cases {
		t.Run(tc.fleet, func(t *testing.T) {
			req := spec(tc.fleet, tc.billing)
			var views []OfferingsView
			if err := td.client.Do(ctx, http.MethodPost, "/v1/offerings", nil, req, &views); err != nil {
				t.Fatal(err)
			}
			for _, r := range views[0].Offerings {
				o := r.Offering
				if !slices.Contains(tc.sources, o.PriceSource) || !tc.dated(o.PriceAsOf) || (tc.spot > 0 && o.CapacityType == "spot" && fmt.Sprintf("%.6f", o.PricePerHour) != fmt.Sprintf("%.6f", tc.spot)) {
					t.Errorf("offering %s %s: $%v from %q as of %v; want %q (spot $%v)", o.InstanceType, o.CapacityType, o.PricePerHour, o.PriceSource, o.PriceAsOf, tc.sources, tc.spot)
				}
			}
			if _, err := td.client.Apply(ctx, req); err != nil {
				t.Fatal(err)
			}
			var det api.FleetDetail
			waitFor(t, "a launched node and its fleet's prices in status", 20*time.Second, func() bool {
				var err error
				det, err = td.client.Fleet(ctx, tc.fleet)
				return err == nil && len(det.Nodes) > 0 && len(det.PriceSources) > 0
			})
			if !slices.Equal(det.PriceSources, tc.sources) || !tc.dated(det.PricesAsOf) {
				t.Errorf("status: prices from %q as of %v; want %q", det.PriceSources, det.PricesAsOf, tc.sources)
			}
		})
	}
}
