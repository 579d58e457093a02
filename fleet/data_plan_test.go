package fleet

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/api"
	awsprov "github.com/fleetd/fleetd/providers/aws"
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

// TestPlanShowsDataNetwork: an FSx file system in VPC vpc-0a000001 keeps
// the job on nodes of that VPC: with subnets in two VPCs the zone of the
// other is excluded with the reason, in `fleetd offerings` and, when no
// zone is left, in `fleetd plan`; nodes whose VPC EC2 does not give
// (no subnets, no default VPC) stay, and the plan says so.
func TestPlanShowsDataNetwork(t *testing.T) {
	ec2, ec2srv := fakeEC2(t, "us-east-1a", "us-east-1b")
	ec2.AddSubnetInVPC("subnet-0aaa1111", "us-east-1a", "vpc-0a000001")
	ec2.AddSubnetInVPC("subnet-0bbb2222", "us-east-1b", "vpc-0b000002")
	td := launchTestDaemon(t, t.TempDir(), staticProviders{awsprov.Name: awsprov.New(awsprov.Options{RetryMaxAttempts: 1})}, nil, Options{})
	spec := func(subnets, network string) api.ApplyRequest {
		src := awsFleetSpec("fsx", 1, 1, 1, `"p3.2xlarge"`, ec2srv.URL)
		src = strings.Replace(src, "    endpoint ", "    "+subnets+"\n    endpoint ", 1)
		src = strings.Replace(src, `training { command = ["python3", "train.py"] }`, fmt.Sprintf(`training {
    command = ["python3", "train.py"]
    data {
      source     = "fsx://fs-0123456789abcdef0"
      mount_path = "/fsx"
      size_gb    = 1200
      region     = "us-east-1"
      network    = %q
    }
  }`, network), 1)
		return api.ApplyRequest{Filename: "fsx.hcl", Source: src}
	}
	twoVPCs := `subnets = { "us-east-1a" = "subnet-0aaa1111", "us-east-1b" = "subnet-0bbb2222" }`
	ctx := context.Background()

	// One zone in the file system's VPC: the plan launches there, the
	// other zone is excluded with the reason.
	p, err := td.client.Plan(ctx, spec(twoVPCs, "vpc-0a000001"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plan notes:\n%s", strings.Join(p.Fleets[0].Notes, "\n"))
	var views []OfferingsView
	if err := td.client.Do(ctx, http.MethodPost, "/v1/offerings", nil, spec(twoVPCs, "vpc-0a000001"), &views); err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for _, r := range views[0].Offerings {
		reasons[r.Offering.Zone] = r.Excluded
	}
	if reasons["us-east-1a"] != "" {
		t.Errorf("us-east-1a, in the file system's VPC, excluded: %q", reasons["us-east-1a"])
	}
	if want := "data fsx://fs-0123456789abcdef0 is in network vpc-0a000001; nodes in us-east-1b land in vpc-0b000002"; reasons["us-east-1b"] != want {
		t.Errorf("us-east-1b excluded for %q, want %q", reasons["us-east-1b"], want)
	}

	// Neither zone in the file system's VPC: nothing fits, and plan says why.
	p, err = td.client.Plan(ctx, spec(twoVPCs, "vpc-0c000003"))
	if err != nil {
		t.Fatal(err)
	}
	notes := strings.Join(p.Fleets[0].Notes, "\n")
	t.Logf("plan notes:\n%s", notes)
	for _, w := range []string{"no offering fits the fleet", "data fsx://fs-0123456789abcdef0 is in network vpc-0c000003; nodes in us-east-1", "land in vpc-0"} {
		if !strings.Contains(notes, w) {
			t.Errorf("plan notes lack %q", w)
		}
	}

	// No subnets and no default VPC: EC2 gives no VPC, the offerings
	// stay and the plan says the network is unchecked.
	ec2.RemoveDefaultVPC("us-east-1")
	p, err = td.client.Plan(ctx, spec("", "vpc-0a000001"))
	if err != nil {
		t.Fatal(err)
	}
	notes = strings.Join(p.Fleets[0].Notes, "\n")
	t.Logf("plan notes:\n%s", notes)
	if w := "data fsx://fs-0123456789abcdef0 is in network vpc-0a000001; aws does not say which network its nodes in us-east-1"; !strings.Contains(notes, w) {
		t.Errorf("plan notes lack %q", w)
	}
}
