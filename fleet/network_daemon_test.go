package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/state"
	awsprov "github.com/fleetd/fleetd/providers/aws"
)

// TestDaemonAWSFastNetwork runs the daemon with the real AWS provider
// against the in-repo EC2 fake on the fast network: a "fast" fleet's
// nodes launch with their EFA interfaces into the incarnation's cluster
// placement group; an "auto" fleet whose offering has failed 3 times in a
// row for capacity launches without a group and says so in its events;
// destroying the fleets deletes the group.
func TestDaemonAWSFastNetwork(t *testing.T) {
	ec2, ec2srv := fakeEC2(t, "us-east-1a")
	ec2.AddSubnet("subnet-0aaa1111", "us-east-1a")
	ec2.AllowSelf("us-east-1", "sg-0123456789abcdef0")
	prov := awsprov.New(awsprov.Options{RetryMaxAttempts: 2, RetryMaxBackoff: 10 * time.Millisecond})
	td := launchTestDaemon(t, t.TempDir(), staticProviders{awsprov.Name: prov}, nil, Options{})
	ctx := context.Background()
	defer func() {
		if t.Failed() {
			dumpEvents(t, td)
		}
	}()

	// The p4d offering's last 3 launches failed for capacity (its back-off
	// is over): "auto" gives its placement group up.
	key := "aws/us-east-1/us-east-1a/p4d.24xlarge/spot"
	past := time.Now().Add(-3 * time.Hour)
	if err := td.store.Update(ctx, func(tx state.Tx) error {
		rec := state.OfferingRecord{Key: key}
		for i := range placement.GroupFallbackAfter {
			rec = placement.MarkUnavailable(rec, past.Add(time.Duration(i)*30*time.Minute), "InsufficientInstanceCapacity: no capacity in the placement group", placement.UnavailableCapacity)
		}
		return tx.PutOffering(rec)
	}); err != nil {
		t.Fatal(err)
	}
	fleetSpec := func(name, network, typ string) string {
		return fmt.Sprintf(`
fleet %q {
  min_nodes = 2
  max_nodes = 2
  node {
    gpus    = 8
    network = %q
  }
  placement {
    on_demand_fallback = "never"
  }
  provider "aws" {
    regions         = ["us-east-1"]
    instance_types  = [%q]
    image           = "ami-0123456789abcdef0"
    subnets         = { "us-east-1a" = "subnet-0aaa1111" }
    security_groups = ["sg-0123456789abcdef0"]
    endpoint        = %q
  }
  training {
    command = ["python3", "train.py"]
  }
}`, name, network, typ, ec2srv.URL)
	}
	for _, f := range []struct{ name, network, typ string }{{"h100", "fast", "p5.48xlarge"}, {"a100", "auto", "p4d.24xlarge"}} {
		td.apply(ctx, t, f.name+".hcl", fleetSpec(f.name, f.network, f.typ))
	}
	waitFor(t, "4 instances", 20*time.Second, func() bool { return len(ec2.Live()) == 4 })
	h100, err := td.client.Fleet(ctx, "h100")
	if err != nil {
		t.Fatal(err)
	}
	group := "fleetd-h100-" + h100.Incarnation + "-us-east-1a"
	for _, in := range ec2.Live() {
		switch in.InstanceType {
		case "p5.48xlarge":
			if in.PlacementGroup != group || len(in.Interfaces) != 32 {
				t.Errorf("fast p5 node %s: group %q (want %q), %d interfaces", in.ID, in.PlacementGroup, group, len(in.Interfaces))
			}
		case "p4d.24xlarge":
			if in.PlacementGroup != "" || len(in.Interfaces) != 4 {
				t.Errorf("auto p4d node after 3 capacity failures: group %q, %d interfaces; want no group, 4 EFA", in.PlacementGroup, len(in.Interfaces))
			}
		}
	}
	evs, err := td.client.Events(ctx, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	said := 0
	for _, e := range evs.Events {
		if e.Type == "node.transition" && strings.Contains(e.Message, "launching without a group") {
			said++
		}
	}
	if said == 0 {
		t.Error("no node.transition event says the auto fleet launched without its placement group")
	}
	for _, n := range td.nodes(t, "h100") {
		if !n.Network.Fabric || n.Network.Group != "fleetd-h100-"+h100.Incarnation {
			t.Errorf("h100 node %s records network %+v", n.ID, n.Network)
		}
	}
	// Status says which path each node got.
	for name, want := range map[string]string{"h100": "efa ×32, placement group " + group, "a100": "efa ×4"} {
		det, err := td.client.Fleet(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range det.Nodes {
			if n.Network != want {
				t.Errorf("%s node %s: status network %q, want %q", name, n.ID, n.Network, want)
			}
		}
	}

	for _, name := range []string{"h100", "a100"} {
		if _, err := td.client.Destroy(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both fleets forgotten", 30*time.Second, func() bool {
		_, e1 := td.client.Fleet(ctx, "h100")
		_, e2 := td.client.Fleet(ctx, "a100")
		return api.IsNotFound(e1) && api.IsNotFound(e2)
	})
	if g := ec2.PlacementGroups(); len(g) != 0 {
		t.Errorf("placement groups left after destroy: %+v", g)
	}
}
