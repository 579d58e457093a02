package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws/motoserver"
)

// motoWorld is the AWS account a test builds in moto: networks per region,
// the interruption queue in each, the nodes' instance profile.
type motoWorld struct {
	moto *motoserver.Server
	nets map[string]motoserver.Network
}

func newMotoWorld(t *testing.T, ctx context.Context, zones map[string][]string) *motoWorld {
	t.Helper()
	w := &motoWorld{moto: motoserver.StartT(t), nets: map[string]motoserver.Network{}}
	for region, zs := range zones {
		n, err := w.moto.SetupNetwork(ctx, region, zs)
		if err != nil {
			t.Fatal(err)
		}
		w.nets[region] = n
		if _, err := w.moto.SQS(region).CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: awssdk.String("fleetd-interruptions")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.moto.CreateInstanceProfile(ctx, "fleetd-node"); err != nil {
		t.Fatal(err)
	}
	return w
}

// motoEnv points the daemon (and its plugin processes) at moto the way a
// user points the SDK at any endpoint: AWS_ENDPOINT_URL, static keys, no
// IMDS, and a shared credentials file the test can add profiles to.
func motoEnv(t *testing.T, moto *motoserver.Server) (credsFile string) {
	t.Helper()
	dir := t.TempDir()
	credsFile = filepath.Join(dir, "credentials")
	if err := os.WriteFile(credsFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": motoserver.AccessKeyID, "AWS_SECRET_ACCESS_KEY": motoserver.SecretAccessKey,
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": filepath.Join(dir, "config"), "AWS_SHARED_CREDENTIALS_FILE": credsFile,
		"AWS_ENDPOINT_URL": moto.URL(), "AWS_PROFILE": "", "AWS_REGION": "", "AWS_SESSION_TOKEN": "",
	} {
		t.Setenv(k, v)
	}
	return credsFile
}

// eastMotoWorld is the moto world of the end-to-end tests against the aws
// provider (us-east-1a and 1b, the SDK's environment pointed at moto),
// with a context bounding the test; skipped under -short.
func eastMotoWorld(t *testing.T) (context.Context, *motoWorld) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary and runs moto")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	w := newMotoWorld(t, ctx, map[string][]string{"us-east-1": {"us-east-1a", "us-east-1b"}})
	motoEnv(t, w.moto)
	return ctx, w
}

// eastProvider is the provider block of a fleet on eastMotoWorld's
// network (g5.xlarge in us-east-1a and 1b), with extra attributes.
func (w *motoWorld) eastProvider(extra string) string {
	n := w.nets["us-east-1"]
	return fmt.Sprintf(`  provider "aws" {
    regions          = ["us-east-1"]
    instance_types   = ["g5.xlarge"]
    image            = %q
    subnets          = { "us-east-1a" = %q, "us-east-1b" = %q }
    security_groups  = [%q]
    instance_profile = "fleetd-node"
    %s
  }`, n.Image, n.Subnets["us-east-1a"], n.Subnets["us-east-1b"], n.SecurityGroup, extra)
}

// TestMotoEndToEnd runs the real `fleetd serve` with its aws provider
// against moto, an AWS emulator this project did not write: apply launches
// spot instances with fleetd's tags, market options, user data and
// subnets; an EventBridge spot warning put into moto's SQS queue drains and
// replaces a node; destroy leaves nothing running.
func TestMotoEndToEnd(t *testing.T) {
	ctx, w := eastMotoWorld(t)
	net := w.nets["us-east-1"]
	bin := fleetdBinary(t)
	d := startDaemon(t, bin, t.TempDir(), freeAddr(t))

	specPath := writeTemp(t, "moto.hcl", `
fleet "moto" {
  min_nodes = 2
  max_nodes = 2
  node { gpus = 1 }
  placement { colocate = "zone" }
`+w.eastProvider(`interruption_queue = "fleetd-interruptions"`)+`
  training { command = ["python3", "train.py"] }
}
`)

	// The offerings: moto has spot prices (as "Linux/UNIX (Amazon VPC)"),
	// no placement scores, and the view says so.
	out, errOut, code := d.cli(t, bin, "offerings", specPath)
	if code != 0 || !strings.Contains(out, "g5.xlarge") || !strings.Contains(out, "spot") || !strings.Contains(out, "on-demand") {
		t.Fatalf("offerings (exit %d):\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "spot placement scores not available") {
		t.Errorf("offerings does not say placement scores are unavailable:\n%s", out)
	}

	out, errOut, code = d.cli(t, bin, "apply", "-auto-approve", specPath)
	if code != 0 {
		t.Fatalf("apply (exit %d):\n%s\n%s", code, out, errOut)
	}
	client, err := api.NewClient(d.addr, api.ClientOptions{Token: d.token, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	nodes := func() []api.NodeInfo {
		fd, err := client.Fleet(ctx, "moto")
		if err != nil {
			t.Fatalf("fleet: %v", err)
		}
		return fd.Nodes
	}
	live := func() []ec2types.Instance { return fleetInstances(t, ctx, w.moto, "moto") }
	waitUntil(t, "2 instances in moto", 60*time.Second, func() bool { return len(live()) == 2 })

	// What was launched, as moto recorded it.
	for _, in := range live() {
		id := awssdk.ToString(in.InstanceId)
		tags := map[string]string{}
		for _, tg := range in.Tags {
			tags[awssdk.ToString(tg.Key)] = awssdk.ToString(tg.Value)
		}
		if tags[providers.TagFleet] != "moto" || tags[providers.TagNodeID] == "" || tags[providers.TagDaemonID] == "" {
			t.Errorf("%s tags %v, want fleetd's fleet, node and daemon tags", id, tags)
		}
		if in.InstanceLifecycle != ec2types.InstanceLifecycleTypeSpot {
			t.Errorf("%s lifecycle %q, want spot (InstanceMarketOptions)", id, in.InstanceLifecycle)
		}
		zone := awssdk.ToString(in.Placement.AvailabilityZone)
		if sn := awssdk.ToString(in.SubnetId); sn == "" || sn != net.Subnets[zone] {
			t.Errorf("%s in %s has subnet %q, want the zone's %q", id, zone, sn, net.Subnets[zone])
		}
		if !slices.ContainsFunc(in.SecurityGroups, func(g ec2types.GroupIdentifier) bool { return awssdk.ToString(g.GroupId) == net.SecurityGroup }) {
			t.Errorf("%s security groups %v, want %s", id, in.SecurityGroups, net.SecurityGroup)
		}
		ud, err := w.moto.EC2("us-east-1").DescribeInstanceAttribute(ctx, &ec2.DescribeInstanceAttributeInput{InstanceId: in.InstanceId, Attribute: ec2types.InstanceAttributeNameUserData})
		if err != nil || ud.UserData == nil {
			t.Fatalf("user data of %s: %v", id, err)
		}
		doc, err := base64.StdEncoding.DecodeString(awssdk.ToString(ud.UserData.Value))
		if err != nil || !strings.HasPrefix(string(doc), "#cloud-config") || !strings.Contains(string(doc), tags[providers.TagNodeID]) {
			t.Errorf("%s user data is not its node's #cloud-config (%v):\n%.300s", id, err, doc)
		}
	}
	waitUntil(t, "2 nodes in the fleet with instances", 30*time.Second, func() bool {
		n := 0
		for _, x := range nodes() {
			if x.InstanceID != "" && (x.State == state.NodeBooting || x.State == state.NodeRunning) {
				n++
			}
		}
		return n == 2
	})

	// EventBridge → moto's SQS: a spot interruption warning for one node,
	// sent 110 s after the event (the deadline is event time + 2 min), so
	// the daemon's own termination at the deadline comes within the test;
	// moto never reclaims a spot instance by itself.
	victim := nodes()[0]
	body := fmt.Sprintf(`{"version":"0","id":"7c1f1c2e-0000-4000-8000-%012d","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":%q,"time":%q,"region":"us-east-1","resources":["arn:aws:ec2:us-east-1:%s:instance/%s"],"detail":{"instance-id":%q,"instance-action":"terminate"}}`,
		time.Now().UnixNano()%1e12, motoserver.AccountID, time.Now().Add(-110*time.Second).UTC().Format(time.RFC3339), motoserver.AccountID, victim.InstanceID, victim.InstanceID)
	q, err := w.moto.SQS("us-east-1").GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: awssdk.String("fleetd-interruptions")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.moto.SQS("us-east-1").SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: q.QueueUrl, MessageBody: awssdk.String(body)}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the warned node drained and a replacement launched", 60*time.Second, func() bool {
		replaced, gone := false, false
		for _, x := range nodes() {
			if x.ID == victim.ID {
				gone = x.State != state.NodeBooting && x.State != state.NodeRunning
			} else if x.ID != victim.ID && x.InstanceID != "" && x.CreatedAt.After(victim.CreatedAt) {
				replaced = true
			}
		}
		return gone && replaced
	})
	waitUntil(t, "the warned instance terminated in moto", 60*time.Second, func() bool {
		return !slices.ContainsFunc(live(), func(in ec2types.Instance) bool { return awssdk.ToString(in.InstanceId) == victim.InstanceID })
	})

	out, errOut, code = d.cli(t, bin, "destroy", "-auto-approve", "moto")
	if code != 0 {
		t.Fatalf("destroy (exit %d):\n%s\n%s", code, out, errOut)
	}
	waitUntil(t, "nothing of the fleet running in moto", 60*time.Second, func() bool { return len(live()) == 0 })
}

// TestCheckAgainstMoto: `fleetd check configs/examples/aws.hcl`, with the
// example's ids swapped for resources made in moto, prints the preflight
// table (golden: testdata/check-aws-moto.golden, ids swapped back) and
// exits 0: every check passes or, where moto does not serve the call
// (spot placement scores, Service Quotas), reads "–". Then a spec with a
// wrong AMI, a missing subnet and a denied permission gets exactly those
// three ✗ rows with their fixes, exit 1, and nothing is launched; apply
// refuses it with the same rows.
func TestCheckAgainstMoto(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs moto")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newMotoWorld(t, ctx, map[string][]string{"us-east-1": {"us-east-1a", "us-east-1b"}, "us-west-2": {"us-west-2a"}})
	credsFile := motoEnv(t, w.moto)
	east, west := w.nets["us-east-1"], w.nets["us-west-2"]
	example, err := os.ReadFile("../../configs/examples/aws.hcl")
	if err != nil {
		t.Fatal(err)
	}
	// example id → moto's id; the golden shows the example's ids.
	swap := [][2]string{
		{"ami-0123456789abcdef0", east.Image}, {"ami-0fedcba9876543210", west.Image},
		{"subnet-0aaa1111", east.Subnets["us-east-1a"]}, {"subnet-0bbb2222", east.Subnets["us-east-1b"]},
		{"subnet-0ccc3333", west.Subnets["us-west-2a"]},
		{"sg-0123456789abcdef0", east.SecurityGroup}, {"sg-0fedcba9876543210", west.SecurityGroup},
		{"vpc-0example0east", east.VPC}, {"vpc-0example0west", west.VPC},
	}
	src := string(example)
	for _, s := range swap[:7] {
		if !strings.Contains(src, s[0]) {
			t.Fatalf("configs/examples/aws.hcl no longer has %s", s[0])
		}
		src = strings.ReplaceAll(src, s[0], s[1])
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "aws.hcl")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := fleetdBinary(t)
	d := startDaemon(t, bin, t.TempDir(), freeAddr(t))
	out, errOut, code := d.cli(t, bin, "check", path)
	for _, s := range swap {
		out = strings.ReplaceAll(out, s[1], s[0])
	}
	if code != 0 {
		t.Errorf("check of the example against moto: exit %d, want 0\n%s\n%s", code, out, errOut)
	}
	golden := filepath.Join("testdata", "check-aws-moto.golden")
	if *updateGolden {
		if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if out != string(want) {
		t.Errorf("check output differs from %s (run with -update if intended):\n--- got\n%s\n--- want\n%s", golden, out, want)
	}

	// The broken spec: a wrong AMI, a subnet that does not exist, and
	// credentials (an IAM user in moto, as profile "restricted") whose
	// policy denies ec2:RunInstances.
	const policy = `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"},{"Effect":"Deny","Action":"ec2:RunInstances","Resource":"*"}]}`
	key, err := w.moto.CreateUser(ctx, "fleetd-restricted", policy)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(credsFile, []byte(fmt.Sprintf("[restricted]\naws_access_key_id = %s\naws_secret_access_key = %s\n", key.AccessKeyID, key.SecretAccessKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := fmt.Sprintf(`
fleet "broken" {
  min_nodes = 1
  max_nodes = 2
  node { gpus = 1 }
  provider "aws" {
    profile          = "restricted"
    regions          = ["us-east-1"]
    instance_types   = ["g5.xlarge"]
    image            = "ami-0badbadbadbadbad0"
    subnets          = { "us-east-1a" = %q, "us-east-1b" = "subnet-0dead0000dead0000" }
    security_groups  = [%q]
  }
  training { command = ["python3", "train.py"] }
}
`, east.Subnets["us-east-1a"], east.SecurityGroup)
	badPath := filepath.Join(dir, "broken.hcl")
	if err := os.WriteFile(badPath, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	before := countMotoInstances(t, ctx, w)
	if err := w.moto.EnforceIAM(ctx, 0); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.moto.DisableIAM(context.Background()) }()
	out, errOut, code = d.cli(t, bin, "check", badPath)
	t.Logf("fleetd check %s (exit %d):\n%s", badPath, code, out)
	if code != 1 {
		t.Errorf("check of the broken spec: exit %d, want 1\n%s\n%s", code, out, errOut)
	}
	var failedRows []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "✗") {
			failedRows = append(failedRows, strings.Join(strings.Fields(line)[1:3], " "))
		}
	}
	if want := []string{"image us-east-1", "subnet us-east-1b", "permission ec2:RunInstances"}; !slices.Equal(failedRows, want) {
		t.Errorf("✗ rows %q, want %q\n%s", failedRows, want, out)
	}
	for _, fix := range []string{`fix: set image_per_region["us-east-1"]`, `fix: set subnets["us-east-1b"]`, "fix: allow ec2:RunInstances"} {
		if !strings.Contains(out, fix) {
			t.Errorf("no %q in\n%s", fix, out)
		}
	}
	out, errOut, code = d.cli(t, bin, "apply", "-auto-approve", badPath)
	if code != 1 || !strings.Contains(errOut, "✗") || !strings.Contains(errOut, "-skip-check") {
		t.Errorf("apply of the broken spec: exit %d, want 1 with the ✗ rows on stderr\n%s\n%s", code, out, errOut)
	}
	if err := w.moto.DisableIAM(ctx); err != nil {
		t.Fatal(err)
	}
	if after := countMotoInstances(t, ctx, w); after != before {
		t.Errorf("instances in moto went from %d to %d: check and a refused apply must launch nothing", before, after)
	}
}

// countMotoInstances counts every instance moto holds in the world's regions.
func countMotoInstances(t *testing.T, ctx context.Context, w *motoWorld) int {
	t.Helper()
	n := 0
	for region := range w.nets {
		resp, err := w.moto.EC2(region).DescribeInstances(ctx, &ec2.DescribeInstancesInput{})
		if err != nil {
			t.Fatalf("moto DescribeInstances: %v", err)
		}
		for _, r := range resp.Reservations {
			n += len(r.Instances)
		}
	}
	return n
}
