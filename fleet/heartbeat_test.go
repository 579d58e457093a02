package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
	"github.com/fleetd/fleetd/rendezvous"
)

// TestHeartbeatLossBecomesLostNotice: a running node whose agent goes
// silent is dropped by the rendezvous after dead_after (survivors go on)
// and, still silent after 3 × dead_after, is declared lost and replaced,
// although its instance is still there.
func TestHeartbeatLossBecomesLostNotice(t *testing.T) {
	mem := providertest.NewMemProvider()
	td := startTestDaemon(t, t.TempDir(), mem)
	spec := strings.Replace(strings.Replace(memSpec, `heartbeat  = "20s"`, `heartbeat  = "500ms"`, 1), `dead_after = "60s"`, `dead_after = "1500ms"`, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	td.apply(ctx, t, "train.hcl", spec)
	joined := map[string]bool{}
	td.joinBooting(t, "train", 3, 3, joined)
	nodes := td.nodes(t, "train")
	silent := nodes[0].ID
	for _, n := range nodes[1:] {
		go func(id string) {
			c := rendezvous.NewClient(td.URL(), td.NodeToken("train", id), nil)
			tick := time.NewTicker(300 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					_, _ = c.Heartbeat(ctx, "train", rendezvous.HeartbeatRequest{NodeID: id})
				}
			}
		}(n.ID)
	}
	waitFor(t, "silent node declared lost from heartbeat", 20*time.Second, func() bool {
		for _, n := range td.nodes(t, "train") {
			if n.ID == silent && n.State != state.NodeRunning {
				return true
			}
		}
		return false
	})
	if !td.noticeSays(silent, "heartbeat") {
		t.Fatal("no lost notice from the heartbeat source")
	}
	// The survivors were never declared lost.
	for _, n := range td.nodes(t, "train") {
		if n.ID != silent && joined[n.ID] && n.State != state.NodeRunning {
			t.Fatalf("heartbeating node %s is %s", n.ID, n.State)
		}
	}
}

// TestDroppedWatchChecksInstancesAtOnce: an agent that dies drops its
// rendezvous watch, and the daemon looks at the fleet's instances then,
// not at its next tick. The periodic tick is an hour here, so only the
// dropped watch can make the daemon notice the vanished instance.
func TestDroppedWatchChecksInstancesAtOnce(t *testing.T) {
	mem := providertest.NewMemProvider()
	td := launchTestDaemon(t, t.TempDir(), staticProviders{providertest.MemName: mem}, mem, Options{Tick: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	td.apply(ctx, t, "train.hcl", memSpec)
	td.joinBooting(t, "train", 3, 3, map[string]bool{})
	victim := td.nodes(t, "train")[0]

	// The node's agent watches, as agents always do.
	wctx, drop := context.WithCancel(ctx)
	watching := make(chan error, 1)
	go func() {
		c := rendezvous.NewClient(td.URL(), td.NodeToken("train", victim.ID), nil)
		v, err := c.Watch(wctx, "train", victim.ID, rendezvous.View{})
		if err != nil {
			watching <- err
			return
		}
		_, err = c.Watch(wctx, "train", victim.ID, v)
		watching <- err
	}()
	// The instance vanishes without a word (a host failure). With the
	// watch still held, nothing tells the daemon: the node stays running.
	if err := mem.Delete(ctx, providers.Config{Fleet: "train"}, victim.InstanceID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if n := nodeByID(td.nodes(t, "train"), victim.ID); n.State != state.NodeRunning {
		t.Fatalf("the node became %s before its watch dropped: something else checks the instances; this test then proves nothing", n.State)
	}
	// The agent dies with its node: its connection closes.
	drop()
	if err := <-watching; err == nil {
		t.Fatal("the watch returned a view: it was not held")
	}
	waitFor(t, "the vanished node handled after its watch dropped", 10*time.Second, func() bool {
		return nodeByID(td.nodes(t, "train"), victim.ID).State != state.NodeRunning
	})
}

func nodeByID(nodes []state.Node, id string) state.Node {
	for _, n := range nodes {
		if n.ID == id {
			return n
		}
	}
	return state.Node{}
}

// TestDesiredNodesDecreaseActsAtOnce: an apply that lowers desired_nodes
// drains the surplus at once. The scale cooldowns space the daemon's own
// steps (here: the growth wave to 3 just before); they do not hold back
// a size the user asked for.
func TestDesiredNodesDecreaseActsAtOnce(t *testing.T) {
	mem := providertest.NewMemProvider()
	td := startTestDaemon(t, t.TempDir(), mem)
	ctx := context.Background()
	withDesired := func(n int) string {
		s := strings.Replace(memSpec, "min_nodes = 2", "min_nodes = 1", 1)
		return strings.Replace(s, "max_nodes = 3", fmt.Sprintf("max_nodes = 3\n  desired_nodes = %d", n), 1)
	}
	td.apply(ctx, t, "train.hcl", withDesired(3))
	joined := map[string]bool{}
	td.joinBooting(t, "train", 3, 3, joined)
	td.apply(ctx, t, "train.hcl", withDesired(2))
	waitFor(t, "a running node drained for desired_nodes = 2 (the scale-down cooldown is 5 min)", 15*time.Second, func() bool {
		return countState(td.nodes(t, "train"), state.NodeRunning) == 2
	})
}
