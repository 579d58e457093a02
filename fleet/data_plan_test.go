package fleet

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/providers/providertest"
)

// TestPlanShowsData: `fleetd plan` says where a fleet's data is and what
// reading it from the chosen offering costs; a file system in another
// cloud excludes every offering, and plan and `fleetd offerings` say why.
func TestPlanShowsData(t *testing.T) {
	mem := providertest.NewMemProvider()
	td := startTestDaemon(t, t.TempDir(), mem)
	withData := func(data string) string {
		src := strings.Replace(memSpec, `command = ["python3", "train.py"]`, `command = ["python3", "train.py"]
    `+data, 1)
		return strings.Replace(src, `colocate = "region"`, `colocate = "region"
    egress_per_gb = { "aws->mem" = 0.05 }`, 1)
	}
	cases := []struct {
		name, data string
		want       []string
	}{
		{"bucket in S3", `data {
      source     = "s3://corpus/tokens"
      mount_path = "/data"
      size_gb    = 2000
      epoch_time = "24h"
      region     = "us-east-1"
    }`, []string{
			// 3 nodes read 2000 GB a day from aws:us-east-1 at the overridden $0.05/GB.
			"data s3://corpus/tokens (stream, 2000 GB) is in aws:us-east-1; reading 2000 GB per epoch from mem:",
			"costs $100.00 per epoch ($0.050/GB, aws->mem), $4.17 per hour at one epoch per 24h0m0s, $1.389 per GPU-hour",
			"+ $1.389 data = ",
		}},
		{"FSx elsewhere", `data {
      source     = "fsx://fs-0123456789abcdef0"
      mount_path = "/fsx"
      size_gb    = 1200
      region     = "us-east-1"
      zone       = "us-east-1a"
    }`, []string{"no offering fits the fleet", "× data fsx://fs-0123456789abcdef0 is a file system in aws us-east-1; mem nodes cannot mount it"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := td.client.Plan(context.Background(), api.ApplyRequest{Filename: "train.hcl", Source: withData(c.data)})
			if err != nil {
				t.Fatal(err)
			}
			notes := strings.Join(p.Fleets[0].Notes, "\n")
			t.Logf("plan notes:\n%s", notes)
			for _, w := range c.want {
				if !strings.Contains(notes, w) {
					t.Errorf("plan notes lack %q", w)
				}
			}
		})
	}

	var views []OfferingsView
	if err := td.client.Do(context.Background(), http.MethodPost, "/v1/offerings", nil, api.ApplyRequest{Filename: "train.hcl", Source: withData(cases[1].data)}, &views); err != nil {
		t.Fatal(err)
	}
	if len(views) != 1 || len(views[0].Offerings) == 0 {
		t.Fatalf("views %+v", views)
	}
	// Offerings of the node's shape are excluded for the data alone.
	unreachable := 0
	for _, r := range views[0].Offerings {
		switch {
		case strings.Contains(r.Excluded, "cannot mount it"):
			unreachable++
		case !strings.Contains(r.Excluded, "GPUs, node needs 1"):
			t.Errorf("%s: excluded %q, want the file system's reason", r.Offering.Key(), r.Excluded)
		}
	}
	if unreachable == 0 {
		t.Errorf("no offering excluded for the file system: %+v", views[0].Offerings)
	}
}
