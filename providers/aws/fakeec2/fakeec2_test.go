package fakeec2_test

import (
	"context"
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/providers/aws/fakeec2"
)

// newClient points the real SDK client at a fresh fake.
func newClient(t *testing.T, region string) (*fakeec2.Server, *ec2.Client, string) {
	t.Helper()
	fake := fakeec2.New(fakeec2.Options{})
	ts := httptest.NewServer(fake)
	t.Cleanup(ts.Close)
	client := ec2.New(ec2.Options{
		Region:           region,
		BaseEndpoint:     aws.String(ts.URL),
		Credentials:      credentials.NewStaticCredentialsProvider("AKIATEST", "secret", ""),
		RetryMaxAttempts: 1,
	})
	return fake, client, ts.URL
}

func ctxT(t *testing.T) context.Context { return testutil.Context(t, 10*time.Second) }

// run launches n instances under token, failing the test if EC2 says no.
func run(t *testing.T, c *ec2.Client, token string, n int32) *ec2.RunInstancesOutput {
	t.Helper()
	out, err := c.RunInstances(ctxT(t), runInput(token, n))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func code(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func runInput(token string, count int32) *ec2.RunInstancesInput {
	return &ec2.RunInstancesInput{
		ImageId: aws.String("ami-0123456789abcdef0"), InstanceType: "g5.xlarge",
		MinCount: aws.Int32(count), MaxCount: aws.Int32(count), ClientToken: aws.String(token),
		Placement: &types.Placement{AvailabilityZone: aws.String("us-east-1b")},
		InstanceMarketOptions: &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot,
			SpotOptions: &types.SpotMarketOptions{SpotInstanceType: types.SpotInstanceTypeOneTime}},
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance,
			Tags: []types.Tag{{Key: aws.String("fleetd-fleet"), Value: aws.String("f")}}}},
	}
}

// post sends a raw signed-looking EC2 Query request.
func post(t *testing.T, endpoint string, form url.Values) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIATEST/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=00")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

// TestWireShapes checks the raw protocol: namespace and requestId on
// success, <Response><Errors><Error> with a RequestID and EC2's HTTP
// status on errors.
func TestWireShapes(t *testing.T) {
	fake, _, endpoint := newClient(t, "us-east-1")
	resp, body := post(t, endpoint, url.Values{"Action": {"DescribeAvailabilityZones"}, "Version": {"2016-11-15"}})
	if resp.StatusCode != 200 || !strings.Contains(string(body), `<DescribeAvailabilityZonesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">`) || !strings.Contains(string(body), "<requestId>") {
		t.Errorf("success: %d %s", resp.StatusCode, body)
	}
	fake.SetCapacity("us-east-1a", "p5.48xlarge", 0)
	for _, tc := range []struct {
		form   url.Values
		status int
		code   string
	}{
		{url.Values{"Action": {"NoSuchAction"}, "Version": {"2016-11-15"}}, 400, "InvalidAction"},
		{url.Values{"Action": {"DescribeInstances"}, "Version": {"2016-11-15"}, "InstanceId.1": {"i-0123456789abcdef0"}}, 400, "InvalidInstanceID.NotFound"},
		{url.Values{"Action": {"RunInstances"}, "Version": {"2016-11-15"}, "ImageId": {"ami-01234567"}, "InstanceType": {"p5.48xlarge"},
			"MinCount": {"1"}, "MaxCount": {"1"}, "Placement.AvailabilityZone": {"us-east-1a"}}, 500, "InsufficientInstanceCapacity"},
	} {
		resp, body := post(t, endpoint, tc.form)
		var e struct {
			XMLName   xml.Name `xml:"Response"`
			Code      string   `xml:"Errors>Error>Code"`
			Message   string   `xml:"Errors>Error>Message"`
			RequestID string   `xml:"RequestID"`
		}
		if err := xml.Unmarshal(body, &e); err != nil {
			t.Fatalf("%s: %v in %s", tc.code, err, body)
		}
		if resp.StatusCode != tc.status || e.Code != tc.code || e.Message == "" || e.RequestID == "" {
			t.Errorf("got %d %+v, want %d %s", resp.StatusCode, e, tc.status, tc.code)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, endpoint, strings.NewReader("Action=DescribeInstances&Version=2016-11-15"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unsigned request: %d, want 401 AuthFailure", resp.StatusCode)
	}
}

func TestDescribeInstanceTypes(t *testing.T) {
	_, c, _ := newClient(t, "us-east-1")
	out, err := c.DescribeInstanceTypes(ctxT(t), &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{"p4d.24xlarge", "m5.large"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.InstanceTypes) != 2 {
		t.Fatalf("%d types", len(out.InstanceTypes))
	}
	p4d := out.InstanceTypes[0]
	g := p4d.GpuInfo.Gpus[0]
	if p4d.InstanceType != "p4d.24xlarge" || aws.ToInt32(p4d.VCpuInfo.DefaultVCpus) != 96 || aws.ToInt64(p4d.MemoryInfo.SizeInMiB) != 1179648 ||
		aws.ToString(g.Name) != "A100" || aws.ToString(g.Manufacturer) != "NVIDIA" || aws.ToInt32(g.Count) != 8 || aws.ToInt32(p4d.GpuInfo.TotalGpuMemoryInMiB) != 8*40960 {
		t.Errorf("p4d.24xlarge parsed as %+v / %+v", p4d, g)
	}
	if out.InstanceTypes[1].GpuInfo != nil {
		t.Error("m5.large has GPUs")
	}
	_, err = c.DescribeInstanceTypes(ctxT(t), &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{"p9.huge"}})
	if code(err) != "InvalidInstanceType" {
		t.Errorf("unknown type: %v", err)
	}
}

func TestRunInstancesIdempotency(t *testing.T) {
	fake, c, _ := newClient(t, "us-east-1")
	first := run(t, c, "tok-a", 2)
	in := first.Instances[0]
	if len(first.Instances) != 2 || in.State.Name != types.InstanceStateNamePending || in.InstanceLifecycle != types.InstanceLifecycleTypeSpot ||
		aws.ToString(in.Placement.AvailabilityZone) != "us-east-1b" || aws.ToString(in.SpotInstanceRequestId) == "" || aws.ToString(in.Tags[0].Value) != "f" {
		t.Fatalf("RunInstances parsed as %+v", first)
	}
	again := run(t, c, "tok-a", 2)
	if aws.ToString(again.ReservationId) != aws.ToString(first.ReservationId) || aws.ToString(again.Instances[1].InstanceId) != aws.ToString(first.Instances[1].InstanceId) {
		t.Errorf("same token and parameters: reservation %s, want %s", aws.ToString(again.ReservationId), aws.ToString(first.ReservationId))
	}
	if _, err := c.RunInstances(ctxT(t), runInput("tok-a", 1)); code(err) != "IdempotentParameterMismatch" {
		t.Errorf("same token, other parameters: %v", err)
	}
	// A failed launch does not consume its token.
	fake.SetCapacity("us-east-1b", "g5.xlarge", 0)
	if _, err := c.RunInstances(ctxT(t), runInput("tok-b", 1)); code(err) != "InsufficientInstanceCapacity" {
		t.Fatalf("no capacity: %v", err)
	}
	fake.SetCapacity("us-east-1b", "g5.xlarge", -1)
	if _, err := c.RunInstances(ctxT(t), runInput("tok-b", 1)); err != nil {
		t.Errorf("retry after capacity returned: %v", err)
	}
	if n := len(fake.Live()); n != 3 {
		t.Errorf("%d live instances, want 3", n)
	}
}

func TestDescribeInstances(t *testing.T) {
	fake, c, _ := newClient(t, "us-east-1")
	for i := range 3 {
		if _, err := c.RunInstances(ctxT(t), runInput("tok-"+string(rune('a'+i)), 2)); err != nil {
			t.Fatal(err)
		}
	}
	fake.SetPageSize(4)
	p := ec2.NewDescribeInstancesPaginator(c, &ec2.DescribeInstancesInput{
		Filters: []types.Filter{{Name: aws.String("tag:fleetd-fleet"), Values: []string{"f"}}, {Name: aws.String("instance-state-name"), Values: []string{"pending", "running"}}},
	})
	n, pages := 0, 0
	for p.HasMorePages() && pages < 10 {
		out, err := p.NextPage(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, r := range out.Reservations {
			for _, in := range r.Instances {
				n++
				if in.State.Name != types.InstanceStateNameRunning {
					t.Errorf("%s is %s on its first describe after launch, want running", aws.ToString(in.InstanceId), in.State.Name)
				}
			}
		}
	}
	if n != 6 || pages != 2 {
		t.Errorf("%d instances in %d pages, want 6 in 2", n, pages)
	}
	for _, tc := range []struct {
		in   *ec2.DescribeInstancesInput
		code string
	}{
		{&ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: aws.String("no-such-filter"), Values: []string{"x"}}}}, "InvalidParameterValue"},
		{&ec2.DescribeInstancesInput{InstanceIds: []string{"i-0123456789abcdef0"}, MaxResults: aws.Int32(5)}, "InvalidParameterCombination"},
		{&ec2.DescribeInstancesInput{InstanceIds: []string{"nope"}}, "InvalidInstanceID.Malformed"},
		{&ec2.DescribeInstancesInput{NextToken: aws.String("garbage")}, "InvalidNextToken"},
	} {
		if _, err := c.DescribeInstances(ctxT(t), tc.in); code(err) != tc.code {
			t.Errorf("DescribeInstances: %v, want %s", err, tc.code)
		}
	}
}

func TestConsistencyDelay(t *testing.T) {
	fake, c, _ := newClient(t, "us-east-1")
	fake.SetConsistencyDelay(2)
	out := run(t, c, "tok", 1)
	id := aws.ToString(out.Instances[0].InstanceId)
	for i := range 2 {
		if _, err := c.DescribeInstances(ctxT(t), &ec2.DescribeInstancesInput{InstanceIds: []string{id}}); code(err) != "InvalidInstanceID.NotFound" {
			t.Fatalf("describe #%d right after launch: %v, want InvalidInstanceID.NotFound", i+1, err)
		}
	}
	if _, err := c.DescribeInstances(ctxT(t), &ec2.DescribeInstancesInput{InstanceIds: []string{id}}); err != nil {
		t.Errorf("describe #3: %v", err)
	}
}

func TestSpotInterruption(t *testing.T) {
	fake, c, _ := newClient(t, "us-east-1")
	out := run(t, c, "tok", 1)
	id := aws.ToString(out.Instances[0].InstanceId)
	if err := fake.InterruptSpot(id, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	sirs, err := c.DescribeSpotInstanceRequests(ctxT(t), &ec2.DescribeSpotInstanceRequestsInput{
		Filters: []types.Filter{{Name: aws.String("instance-id"), Values: []string{id}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(sirs.SpotInstanceRequests) != 1 || aws.ToString(sirs.SpotInstanceRequests[0].Status.Code) != "marked-for-termination" || sirs.SpotInstanceRequests[0].Status.UpdateTime == nil {
		t.Fatalf("spot requests %+v", sirs.SpotInstanceRequests)
	}
	// Reclaimed after the delay: poll a bounded number of times.
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, err := c.DescribeInstances(ctxT(t), &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
		if err != nil {
			t.Fatal(err)
		}
		st := d.Reservations[0].Instances[0].State.Name
		if st == types.InstanceStateNameTerminated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s after the reclaim delay", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := fake.Instances()[0].SpotRequestStatus; got != "instance-terminated-by-no-capacity" {
		t.Errorf("spot request status after the reclaim: %s", got)
	}
}

func TestRegionsAreSeparate(t *testing.T) {
	fake := fakeec2.New(fakeec2.Options{})
	ts := httptest.NewServer(fake)
	t.Cleanup(ts.Close)
	mk := func(region string) *ec2.Client {
		return ec2.New(ec2.Options{Region: region, BaseEndpoint: aws.String(ts.URL), Credentials: credentials.NewStaticCredentialsProvider("AKIATEST", "s", ""), RetryMaxAttempts: 1})
	}
	east, west := mk("us-east-1"), mk("us-west-2")
	in := runInput("tok", 1)
	in.Placement = nil
	out, err := west.RunInstances(ctxT(t), in)
	if err != nil {
		t.Fatal(err)
	}
	if z := aws.ToString(out.Instances[0].Placement.AvailabilityZone); z != "us-west-2a" {
		t.Errorf("launched in %s, want the region's first zone us-west-2a", z)
	}
	if _, err := east.DescribeInstances(ctxT(t), &ec2.DescribeInstancesInput{InstanceIds: []string{aws.ToString(out.Instances[0].InstanceId)}}); code(err) != "InvalidInstanceID.NotFound" {
		t.Errorf("us-west-2 instance seen from us-east-1: %v", err)
	}
}
