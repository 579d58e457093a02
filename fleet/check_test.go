package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/providers"
	awsprov "github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakeec2"
)

// awsTestEnv pins the SDK to static test keys, off IMDS and the user's
// ~/.aws, so no request of a test leaves loopback.
func awsTestEnv(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "AKIAFLEETDTEST0000", "AWS_SECRET_ACCESS_KEY": "fleetd-test-secret",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": dir + "/config", "AWS_SHARED_CREDENTIALS_FILE": dir + "/credentials",
		"AWS_PROFILE": "", "AWS_REGION": "", "AWS_ENDPOINT_URL": "",
	} {
		t.Setenv(k, v)
	}
}

// fakeEC2 sets the AWS test environment and serves a fake EC2 account
// with the given us-east-1 zones until cleanup.
func fakeEC2(t *testing.T, zones ...string) (*fakeec2.Server, *httptest.Server) {
	t.Helper()
	awsTestEnv(t)
	ec2 := fakeec2.New(fakeec2.Options{Regions: map[string][]string{"us-east-1": zones}})
	srv := httptest.NewServer(ec2)
	t.Cleanup(srv.Close)
	return ec2, srv
}

// TestApplyPreflight: apply runs the quick preflight first and refuses,
// with the same rows `fleetd check` prints, when the image is missing or
// launching is denied; nothing is stored and nothing launched. -skip-check
// goes ahead; POST /v1/check reports without launching.
func TestApplyPreflight(t *testing.T) {
	ec2, ec2srv := fakeEC2(t, "us-east-1a", "us-east-1b")
	ec2.RemoveImage("us-east-1", "ami-0badbadbadbadbad0")
	ec2.AddSubnet("subnet-0aaa1111", "us-east-1a")
	prov := awsprov.New(awsprov.Options{RetryMaxAttempts: 2})
	td := launchTestDaemon(t, t.TempDir(), staticProviders{awsprov.Name: prov}, nil, Options{})
	ctx := context.Background()

	specFor := func(image, subnet string) string {
		return fmt.Sprintf(`
fleet "v100" {
  min_nodes = 1
  max_nodes = 1
  node { gpus = 1 }
  provider "aws" {
    regions        = ["us-east-1"]
    instance_types = ["p3.2xlarge"]
    image          = %q
    subnets        = { "us-east-1a" = %q }
    endpoint       = %q
    service_quotas_endpoint = %q
  }
  training { command = ["python3", "train.py"] }
}`, image, subnet, ec2srv.URL, ec2srv.URL)
	}
	bad := specFor("ami-0badbadbadbadbad0", "subnet-0dead000")
	_, err := td.client.Apply(ctx, api.ApplyRequest{Filename: "v100.hcl", Source: bad})
	var he *api.HTTPError
	if !errors.As(err, &he) || he.StatusCode != http.StatusPreconditionFailed || he.Body.Preflight == nil {
		t.Fatalf("apply with a missing image: %v, want HTTP 412 with a preflight report", err)
	}
	var failed []string
	for _, pc := range he.Body.Preflight.Providers {
		for _, r := range pc.Results {
			if r.Status == providers.CheckFailed {
				failed = append(failed, r.Check+"@"+r.Scope)
			}
		}
	}
	if want := "[image@us-east-1 subnet@us-east-1a]"; fmt.Sprint(failed) != want {
		t.Errorf("failed rows %v, want %s", failed, want)
	}
	if !strings.Contains(he.Body.Error, "-skip-check") {
		t.Errorf("error %q does not say how to skip the check", he.Body.Error)
	}
	st, err := td.client.Status(ctx)
	if err != nil || len(st.Fleets) != 0 {
		t.Fatalf("after a refused apply: %d fleets stored (%v), want none", len(st.Fleets), err)
	}

	ec2.Deny("RunInstances")
	var rep api.CheckReport
	good := specFor("ami-0123456789abcdef0", "subnet-0aaa1111")
	if err := td.client.Do(ctx, http.MethodPost, "/v1/check", nil, api.CheckRequest{ApplyRequest: api.ApplyRequest{Filename: "v100.hcl", Source: good}}, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.OK || len(rep.Providers) != 1 {
		t.Fatalf("check with RunInstances denied: %+v, want not OK", rep)
	}
	var denied *providers.CheckResult
	for i, r := range rep.Providers[0].Results {
		if r.Check == "permission ec2:RunInstances" {
			denied = &rep.Providers[0].Results[i]
		}
	}
	if denied == nil || denied.Status != providers.CheckFailed || !strings.Contains(denied.Detail, "ec2:RunInstances") {
		t.Errorf("RunInstances row %+v, want failed naming ec2:RunInstances", denied)
	}
	if len(ec2.Live()) != 0 {
		t.Errorf("%d instances launched by checks", len(ec2.Live()))
	}

	// -skip-check applies anyway (the launch itself then fails, as denied).
	if _, err := td.client.Apply(ctx, api.ApplyRequest{Filename: "v100.hcl", Source: good, SkipCheck: true}); err != nil {
		t.Fatalf("apply -skip-check: %v", err)
	}
}

// TestOfferingsViewWithoutSpotPrice: the market view `fleetd offerings`
// shows keeps the on-demand offering of a zone where EC2 publishes no spot
// price for the type, carries the spot placement scores, and says why when
// scores are missing or a provider offers nothing.
func TestOfferingsViewWithoutSpotPrice(t *testing.T) {
	ec2, ec2srv := fakeEC2(t, "us-east-1a", "us-east-1b")
	ec2.RemoveSpotPrices("us-east-1a", "p4d.24xlarge")
	ec2.SetPlacementScore("us-east-1b", "p4d.24xlarge", 4)
	td := launchTestDaemon(t, t.TempDir(), staticProviders{awsprov.Name: awsprov.New(awsprov.Options{RetryMaxAttempts: 1})}, nil, Options{})
	spec := func(types string) string {
		return awsFleetSpec("big", 1, 2, 8, types, ec2srv.URL)
	}
	var views []OfferingsView
	if err := td.client.Do(context.Background(), http.MethodPost, "/v1/offerings", nil, api.ApplyRequest{Filename: "big.hcl", Source: spec(`"p4d.24xlarge"`)}, &views); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range views[0].Offerings {
		got[r.Offering.Zone+" "+string(r.Offering.CapacityType)] = r.Offering.PlacementScore
	}
	want := map[string]int{"us-east-1a on-demand": 0, "us-east-1b spot": 4, "us-east-1b on-demand": 0}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("offerings (zone capacity → placement score) %v, want %v", got, want)
	}

	ec2.FailNext("GetSpotPlacementScores", "UnauthorizedOperation", "You are not authorized to perform this operation.", 100)
	views = nil
	if err := td.client.Do(context.Background(), http.MethodPost, "/v1/offerings", nil, api.ApplyRequest{Filename: "big.hcl", Source: spec(`"g5.12xlarge"`)}, &views); err != nil {
		t.Fatal(err)
	}
	if notes := strings.Join(views[0].Notes, "\n"); !strings.Contains(notes, "spot placement scores denied (UnauthorizedOperation)") {
		t.Errorf("notes %q do not say scores were denied", notes)
	}
	for _, z := range []string{"us-east-1a", "us-east-1b"} {
		ec2.RemoveOffering(z, "p3.8xlarge")
	}
	views = nil
	if err := td.client.Do(context.Background(), http.MethodPost, "/v1/offerings", nil, api.ApplyRequest{Filename: "big.hcl", Source: spec(`"p3.8xlarge"`)}, &views); err != nil {
		t.Fatal(err)
	}
	if len(views[0].Offerings) != 0 || !strings.Contains(strings.Join(views[0].Notes, "\n"), "no offerings") {
		t.Errorf("a type offered nowhere: %d offerings, notes %q; want none and a note saying why", len(views[0].Offerings), views[0].Notes)
	}
}

// awsFleetSpec is one fleet on the aws provider against a fake EC2 at
// endpoint; types is the HCL list body of instance_types.
func awsFleetSpec(name string, minNodes, maxNodes, gpus int, types, endpoint string) string {
	return fmt.Sprintf(`
fleet %q {
  min_nodes = %d
  max_nodes = %d
  node { gpus = %d }
  provider "aws" {
    regions        = ["us-east-1"]
    instance_types = [%s]
    image          = "ami-0123456789abcdef0"
    endpoint       = %q
  }
  training { command = ["python3", "train.py"] }
}`, name, minNodes, maxNodes, gpus, types, endpoint)
}
