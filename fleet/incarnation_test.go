package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	awsprov "github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/providertest"
)

// TestDestroyThenApplyIsANewIncarnation is the report that opened the
// incarnations work: apply, run, destroy, apply the same spec at once. The
// provider honours idempotency tokens (as EC2's ClientToken does), so
// reused node ids used to hand the new fleet the old fleet's (dead)
// instances, declare its nodes lost and raise a boot-failure alert.
func TestDestroyThenApplyIsANewIncarnation(t *testing.T) {
	mem := providertest.NewMemProvider()
	td := startTestDaemon(t, t.TempDir(), mem)
	ctx := context.Background()
	// The test's agents are API calls, not processes that exit when told
	// to drain: a short drain grace lets the destroy finish.
	src := strings.Replace(memSpec, `command = ["python3", "train.py"]`, `command = ["python3", "train.py"]
    drain_grace = "1s"`, 1)
	apply := func() api.FleetSummary {
		t.Helper()
		r, err := td.client.Apply(ctx, api.ApplyRequest{Filename: "train.hcl", Source: src})
		if err != nil {
			t.Fatal(err)
		}
		return r.Fleets[0]
	}
	first := apply()
	joined := map[string]bool{}
	waitFor(t, "3 running nodes", 20*time.Second, func() bool {
		td.joinAll(t, "train", joined)
		return countState(td.nodes(t, "train"), state.NodeRunning) == 3
	})
	old := td.nodes(t, "train")
	oldIDs, oldInst := map[string]bool{}, map[string]bool{}
	for _, n := range old {
		oldIDs[n.ID], oldInst[n.InstanceID] = true, true
		if !strings.HasPrefix(n.ID, "train-"+first.Incarnation+"-") {
			t.Errorf("node id %s does not carry the incarnation %s", n.ID, first.Incarnation)
		}
	}
	if code := td.agentCall(t, "train", old[0].ID, "logs", api.LogsRequest{Lines: []string{"a line of the first incarnation"}}); code != 204 {
		t.Fatalf("logs: HTTP %d", code)
	}
	oldToken := td.NodeToken("train", old[0].ID)

	if _, err := td.client.Destroy(ctx, "train"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			dumpEvents(t, td)
		}
	}()
	waitFor(t, "the fleet forgotten", 20*time.Second, func() bool {
		_, err := td.client.Fleet(ctx, "train")
		return api.IsNotFound(err)
	})
	since := lastSeq(t, td)
	plan, err := td.client.Plan(ctx, api.ApplyRequest{Filename: "train.hcl", Source: src})
	if err != nil {
		t.Fatal(err)
	}
	if notes := strings.Join(plan.Fleets[0].Notes, "\n"); !strings.Contains(notes, "new incarnation") || !strings.Contains(notes, first.Incarnation) {
		t.Errorf("plan notes do not say the fleet is a new incarnation of %s:\n%s", first.Incarnation, notes)
	}
	second := apply()
	if second.Incarnation == "" || second.Incarnation == first.Incarnation {
		t.Fatalf("incarnation %q after re-create; first was %q", second.Incarnation, first.Incarnation)
	}
	waitFor(t, "3 booting nodes with instances", 20*time.Second, func() bool {
		n := 0
		for _, x := range td.nodes(t, "train") {
			if x.State == state.NodeBooting && x.InstanceID != "" {
				n++
			}
		}
		return n == 3
	})
	time.Sleep(500 * time.Millisecond) // a few more passes: nothing may be declared lost
	nodes := td.nodes(t, "train")
	if len(nodes) != 3 {
		t.Errorf("%d node records; want 3 (no replacements)", len(nodes))
	}
	for _, n := range nodes {
		if oldIDs[n.ID] || oldInst[n.InstanceID] {
			t.Errorf("node %s (instance %s) repeats the first incarnation's", n.ID, n.InstanceID)
		}
		if n.State != state.NodeBooting {
			t.Errorf("node %s is %s (%s); want booting", n.ID, n.State, n.Reason)
		}
	}
	evs, err := td.client.Events(ctx, since, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Events {
		if e.Fleet != "train" {
			continue
		}
		if e.Incarnation != second.Incarnation {
			t.Errorf("event %d %s of incarnation %q after the re-create", e.Seq, e.Type, e.Incarnation)
		}
		if strings.Contains(e.Message, "lost") || e.Type == "alert" {
			t.Errorf("event %d %s: %s", e.Seq, e.Type, e.Message)
		}
	}
	d, err := td.client.Fleet(ctx, "train")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Alerts) != 0 {
		t.Errorf("alerts after the re-create: %+v", d.Alerts)
	}
	// Logs: the new incarnation shows none of the old one's; they stay
	// reachable under its id.
	if got := td.agentAPI.Logs("train", "", 0); len(got) != 0 {
		t.Errorf("the new incarnation shows %d old log lines: %+v", len(got), got)
	}
	var oldLines []api.LogLine
	if err := td.client.Do(ctx, "GET", "/v1/fleets/train/logs", map[string][]string{"incarnation": {first.Incarnation}}, nil, &oldLines); err != nil {
		t.Fatal(err)
	}
	if len(oldLines) != 1 || oldLines[0].Line != "a line of the first incarnation" {
		t.Errorf("logs of the first incarnation = %+v", oldLines)
	}
	// The old node's token opens nothing of the new fleet.
	if slices.ContainsFunc(nodes, func(n state.Node) bool { return td.NodeToken("train", n.ID) == oldToken }) {
		t.Error("a new node's token equals an old node's")
	}
	// The name's spend counts both incarnations.
	if d.SpendNameTotalUSD < d.SpendUSD || d.SpendNameTotalUSD <= 0 {
		t.Errorf("spend: incarnation %.6f, name total %.6f; want the total to include the first incarnation", d.SpendUSD, d.SpendNameTotalUSD)
	}
}

func lastSeq(t *testing.T, td *testDaemon) uint64 {
	t.Helper()
	evs, err := td.client.Events(context.Background(), 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return evs.Next
}

const demoAWSSpec = `
fleet "demo" {
  min_nodes = 2
  max_nodes = 2
  node {
    gpus      = 1
    gpu_types = ["V100"]
  }
  placement {
    colocate = "region"
  }
  provider "aws" {
    regions        = ["us-east-1"]
    instance_types = ["p3.2xlarge"]
    image          = "ami-0123456789abcdef0"
    endpoint       = %q
  }
  training {
    command = ["python3", "train.py"]
  }
}`

// TestTwoDaemonsShareOneEC2Account runs two daemons, each with a fleet
// called "demo", against one fake EC2 account that honours ClientToken.
// Each launches its own instances, neither adopts, drains or deletes the
// other's, and destroying one fleet leaves the other's running.
func TestTwoDaemonsShareOneEC2Account(t *testing.T) {
	ec2, srv := fakeEC2(t, "us-east-1a", "us-east-1b")
	ctx := context.Background()
	spec := fmt.Sprintf(demoAWSSpec, srv.URL)
	var ds []*testDaemon
	for range 2 {
		prov := awsprov.New(awsprov.Options{RetryMaxAttempts: 2, RetryMaxBackoff: 10 * time.Millisecond})
		td := launchTestDaemon(t, t.TempDir(), staticProviders{awsprov.Name: prov}, nil, Options{})
		td.apply(ctx, t, "demo.hcl", spec)
		ds = append(ds, td)
	}
	if ds[0].DaemonID() == ds[1].DaemonID() {
		t.Fatal("two daemons with one id")
	}
	booted := func(td *testDaemon) bool {
		n := 0
		for _, x := range td.nodes(t, "demo") {
			if x.State == state.NodeBooting && x.InstanceID != "" {
				n++
			}
		}
		return n == 2
	}
	waitFor(t, "both fleets with 2 booting nodes", 30*time.Second, func() bool { return booted(ds[0]) && booted(ds[1]) })
	time.Sleep(500 * time.Millisecond)

	owner := map[string]string{} // instance id → daemon id, from EC2's tags
	for _, in := range ec2.Live() {
		owner[in.ID] = in.Tags[providers.TagDaemonID]
	}
	if len(owner) != 4 {
		t.Fatalf("%d live EC2 instances; want 4 (2 per daemon)", len(owner))
	}
	tokens := map[string]bool{}
	for _, in := range ec2.Instances() {
		if tokens[in.ClientToken] {
			t.Errorf("ClientToken %q used twice", in.ClientToken)
		}
		tokens[in.ClientToken] = true
	}
	for _, td := range ds {
		for _, n := range td.nodes(t, "demo") {
			if n.InstanceID != "" && owner[n.InstanceID] != td.DaemonID() {
				t.Errorf("daemon %s recorded instance %s of daemon %q", td.DaemonID(), n.InstanceID, owner[n.InstanceID])
			}
		}
		d, err := td.client.Fleet(ctx, "demo")
		if err != nil {
			t.Fatal(err)
		}
		foreign := 0
		for _, a := range d.Alerts {
			if a.Kind == "foreign-instance" {
				foreign++
			}
		}
		if foreign != 2 {
			t.Errorf("daemon %s reports %d foreign instances; want the other daemon's 2: %+v", td.DaemonID(), foreign, d.Alerts)
		}
	}

	// Destroy the first daemon's fleet: the second's instances live on.
	if _, err := ds[0].client.Destroy(ctx, "demo"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first fleet destroyed", 30*time.Second, func() bool {
		_, err := ds[0].client.Fleet(ctx, "demo")
		return api.IsNotFound(err)
	})
	live := map[string]string{}
	for _, in := range ec2.Live() {
		live[in.ID] = in.Tags[providers.TagDaemonID]
	}
	if len(live) != 2 {
		t.Errorf("%d live instances after the first destroy; want the second daemon's 2", len(live))
	}
	for id, d := range live {
		if d != ds[1].DaemonID() {
			t.Errorf("instance %s of daemon %s survived its fleet's destroy", id, d)
		}
	}
	if !booted(ds[1]) {
		t.Errorf("the second fleet lost nodes: %+v", ds[1].nodes(t, "demo"))
	}
	if _, err := ds[1].client.Destroy(ctx, "demo"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second fleet destroyed", 30*time.Second, func() bool {
		_, err := ds[1].client.Fleet(ctx, "demo")
		return api.IsNotFound(err) && len(ec2.Live()) == 0
	})
}
