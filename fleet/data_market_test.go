package fleet

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	awsprov "github.com/fleetd/fleetd/providers/aws"
	gcpprov "github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
)

// TestPlanDataAcrossClouds: `fleetd plan` of a fleet that may run on AWS
// or GCP (the real clients against the in-repo fakes), before and after
// its S3 us-east-1 dataset is declared: the cheaper GCP zone wins alone
// and loses once reading the data across clouds is priced.
func TestPlanDataAcrossClouds(t *testing.T) {
	_, ec2srv := fakeEC2(t, "us-east-1a")
	gce := fakegce.New(fakegce.Options{})
	defer gce.Close()
	td := launchTestDaemon(t, t.TempDir(), staticProviders{
		awsprov.Name: awsprov.New(awsprov.Options{RetryMaxAttempts: 1}),
		gcpprov.Name: gcpprov.New(gcpprov.Options{PollInterval: 10 * time.Millisecond}),
	}, nil, Options{})
	spec := func(data string) string {
		return fmt.Sprintf(`
fleet "llm" {
  min_nodes = 2
  max_nodes = 2
  node { gpus = 1 }
  provider "aws" {
    regions        = ["us-east-1"]
    instance_types = ["g5.xlarge"]
    image          = "ami-0123456789abcdef0"
    endpoint       = %q
  }
  provider "gcp" {
    project       = %q
    zones         = ["us-central1-a"]
    machine_types = ["g2-standard-8"]
    image         = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"
    endpoint      = %q
    prices        = { "g2-standard-8" = { spot = 0.30, on_demand = 0.85 } }
  }
  training {
    command = ["python3", "train.py"]
    %s
  }
}`, ec2srv.URL, gce.Project(), gce.URL, data)
	}
	plan := func(src string) api.FleetPlan {
		t.Helper()
		p, err := td.client.Plan(context.Background(), api.ApplyRequest{Filename: "llm.hcl", Source: src})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("plan: %+v\nnotes:\n%s", p.Fleets[0].Offerings, strings.Join(p.Fleets[0].Notes, "\n"))
		return p.Fleets[0]
	}
	before := plan(spec(""))
	if len(before.Offerings) != 1 || before.Offerings[0].Provider != "gcp" {
		t.Fatalf("without data: %+v, want the GCP zone", before.Offerings)
	}
	data := `data {
      source     = "s3://corpus/tokens"
      mount_path = "/data"
      size_gb    = 2000
      epoch_time = "24h"
      region     = "us-east-1"
    }`
	after := plan(spec(data))
	if len(after.Offerings) != 1 || after.Offerings[0].Provider != "aws" {
		t.Fatalf("with 2 TB in S3 us-east-1: %+v, want the AWS zone", after.Offerings)
	}
	if notes := strings.Join(after.Notes, "\n"); !strings.Contains(notes, "data s3://corpus/tokens (stream, 2000 GB) is in aws:us-east-1; reading it from aws:us-east-1a is free") ||
		!strings.Contains(notes, "data: gcp/us-central1/us-central1-a/g2-standard-8/spot is $0.130/GPU-h cheaper than aws/us-east-1/us-east-1a/g5.xlarge/spot, but reading the data from there adds $3.750 per GPU-hour") {
		t.Errorf("notes:\n%s", notes)
	}

	// `fleetd offerings` shows why GCP lost: 2000 GB a day at $0.09/GB is
	// $7.50/h over 2 GPUs.
	var views []OfferingsView
	if err := td.client.Do(context.Background(), http.MethodPost, "/v1/offerings", nil, api.ApplyRequest{Filename: "llm.hcl", Source: spec(data)}, &views); err != nil {
		t.Fatal(err)
	}
	for _, r := range views[0].Offerings {
		t.Logf("%s excluded=%q data=%.3f score=%.3f", r.Offering.Key(), r.Excluded, r.DataCost, r.Score)
		if r.Offering.Key() == "gcp/us-central1/us-central1-a/g2-standard-8/spot" && math.Abs(r.DataCost-3.75) > 1e-9 {
			t.Errorf("GCP data cost %g, want 3.75", r.DataCost)
		}
	}
	if first := views[0].Offerings[0].Offering; first.Provider != "aws" {
		t.Errorf("best offering %s, want the AWS one", first.Key())
	}
}
