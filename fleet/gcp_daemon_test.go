package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	gcpprov "github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
)

// TestDaemonGCPStockoutAndPreemption runs the daemon with the real GCE
// client against the in-repo Compute Engine fake: a stockout in one zone
// moves the fleet to the other; a preemption recorded as a zone operation
// becomes a notice, a drain and a replacement.
func TestDaemonGCPStockoutAndPreemption(t *testing.T) {
	fake := fakegce.New(fakegce.Options{})
	defer fake.Close()
	fake.SetStockout("us-central1-a", true)

	td := launchTestDaemon(t, t.TempDir(), staticProviders{gcpprov.Name: gcpprov.New(gcpprov.Options{PollInterval: 10 * time.Millisecond})}, nil,
		Options{PollInterval: 200 * time.Millisecond})
	ctx := context.Background()
	td.logEventsIfFailed(t)

	spec := fmt.Sprintf(`
fleet "l4" {
  min_nodes = 2
  max_nodes = 2
  node {
    gpus = 1
  }
  placement {
    colocate           = "zone"
    on_demand_fallback = "after 1s below min_nodes"
  }
  provider "gcp" {
    project       = %q
    zones         = ["us-central1-a", "us-central1-b"]
    machine_types = ["g2-standard-8"]
    image         = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"
    endpoint      = %q
  }
  training {
    command = ["python3", "train.py"]
  }
  rendezvous {
    heartbeat  = "20s"
    dead_after = "60s"
  }
}`, fake.Project(), fake.URL)
	td.apply(ctx, t, "l4.hcl", spec)
	td.waitBootingIn(t, "l4", "us-central1-b", 2)
	joined := map[string]bool{}
	td.joinAll(t, "l4", joined)
	waitFor(t, "2 running", 10*time.Second, func() bool { return countState(td.nodes(t, "l4"), state.NodeRunning) == 2 })

	victim := td.lastRunning(t, "l4")
	zone, name, ok := strings.Cut(victim.InstanceID, "/")
	if !ok {
		t.Fatalf("instance id %q is not ZONE/NAME", victim.InstanceID)
	}
	if _, err := fake.Preempt(zone, name); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "preemption notice, drain and replacement", 20*time.Second, func() bool {
		draining, fresh := false, 0
		for _, x := range td.nodes(t, "l4") {
			if x.ID == victim.ID && x.State != state.NodeRunning {
				draining = true
			}
			if !joined[x.ID] && x.InstanceID != "" {
				fresh++
			}
		}
		return draining && fresh >= 1
	})
	if !td.noticeSays(victim.ID, "preempted") {
		t.Fatal("no preempted notice for the victim")
	}
}
