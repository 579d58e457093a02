package fleet

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	awsprov "github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakesqs"
)

// TestDaemonAWSCapacityFailoverAndSQSNotice runs the daemon with the real
// AWS provider (aws-sdk-go-v2) against the in-repo EC2 and SQS fakes: one
// zone has no capacity, so the fleet lands in the other; then an
// EventBridge spot interruption warning arrives through SQS and the node
// is drained and replaced.
func TestDaemonAWSCapacityFailoverAndSQSNotice(t *testing.T) {
	ec2, ec2srv := fakeEC2(t, "us-east-1a", "us-east-1b")
	ec2.SetCapacity("us-east-1a", "p3.2xlarge", 0)
	sqs := fakesqs.New(fakesqs.Options{})
	sqs.CreateQueue("fleetd-interruptions")
	sqssrv := httptest.NewServer(sqs)
	defer sqssrv.Close()

	prov := awsprov.New(awsprov.Options{RetryMaxAttempts: 2, RetryMaxBackoff: 10 * time.Millisecond})
	td := launchTestDaemon(t, t.TempDir(), staticProviders{awsprov.Name: prov}, nil, Options{})
	ctx := context.Background()

	spec := fmt.Sprintf(`
fleet "v100" {
  min_nodes = 2
  max_nodes = 2
  node {
    gpus      = 1
    gpu_types = ["V100"]
  }
  placement {
    colocate = "zone"
    # The only V100 type is exhausted in 1a and interrupted in 1b: the
    # replacement must come from on-demand, quickly.
    on_demand_fallback = "after 1s below min_nodes"
  }
  provider "aws" {
    regions            = ["us-east-1"]
    instance_types     = ["p3.2xlarge"]
    image              = "ami-0123456789abcdef0"
    endpoint           = %q
    sqs_endpoint       = %q
    interruption_queue = "fleetd-interruptions"
  }
  training {
    command = ["python3", "train.py"]
  }
  rendezvous {
    heartbeat  = "20s"
    dead_after = "60s"
  }
}`, ec2srv.URL, sqssrv.URL)
	td.apply(ctx, t, "v100.hcl", spec)
	td.logEventsIfFailed(t)
	td.waitBootingIn(t, "v100", "us-east-1b", 2)
	if live := len(ec2.Live()); live != 2 {
		t.Fatalf("%d live EC2 instances, want 2", live)
	}
	// No retry storm on the exhausted zone: it is backed off after failing.
	time.Sleep(500 * time.Millisecond)
	failedA := 0
	for _, x := range td.nodes(t, "v100") {
		if x.Offering.Zone == "us-east-1a" {
			failedA++
		}
	}
	if failedA > 2 {
		t.Fatalf("%d launch attempts in the exhausted zone, want ≤ 2", failedA)
	}

	joined := map[string]bool{}
	td.joinAll(t, "v100", joined)
	waitFor(t, "2 running", 10*time.Second, func() bool { return countState(td.nodes(t, "v100"), state.NodeRunning) == 2 })

	// EventBridge → SQS: a spot interruption warning for one instance, plus
	// one for an instance fleetd does not manage (ignored and deleted).
	victim := td.lastRunning(t, "v100")
	for _, id := range []string{victim.InstanceID, "i-0123456789abcdef9"} {
		body := strings.NewReplacer("INSTANCE", id, "EVID", "ev-"+id).Replace(`{"version":"0","id":"EVID","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"123456789012","time":"` +
			time.Now().UTC().Format(time.RFC3339) + `","region":"us-east-1","resources":["arn:aws:ec2:us-east-1b:instance/INSTANCE"],"detail":{"instance-id":"INSTANCE","instance-action":"terminate"}}`)
		if _, err := sqs.Send("fleetd-interruptions", body); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "victim draining and a replacement requested", 25*time.Second, func() bool {
		ns := td.nodes(t, "v100")
		draining, fresh := false, 0
		for _, x := range ns {
			if x.ID == victim.ID && (x.State == state.NodeDraining || x.State == state.NodeTerminating || x.State == state.NodeTerminated) {
				draining = true
			}
			if !joined[x.ID] && x.Offering.Zone == "us-east-1b" && x.InstanceID != "" {
				fresh++
			}
		}
		return draining && fresh >= 1
	})
	if !td.noticeSays(victim.ID, "aws-eventbridge") {
		t.Fatal("no notice event from the EventBridge source")
	}
}
