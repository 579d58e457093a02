package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/agentapi"
	"github.com/fleetd/fleetd/fleet/controller"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/stats"
)

func dumpEvents(t *testing.T, td *testDaemon) {
	td.logEvents(t)
	v, _ := td.ctrl.View("train")
	for _, a := range v.Plan.Actions {
		t.Logf("action: %s", a)
	}
	for _, n := range td.nodes(t, "train") {
		t.Logf("node %s %s %s", n.ID, n.State, n.Reason)
	}
}

// bareDaemon is a daemon with only what its in-memory views need: no
// store, no server (unit tests of the tally and alerts).
func bareDaemon() *Daemon {
	m := newMetrics("test")
	d := &Daemon{now: time.Now, metrics: m, stats: stats.New(m.reg), ctrl: controller.New(controller.Options{}), agentAPI: agentapi.New(nil, nil, time.Now, "", nil)}
	d.fleetViews = &fleetViews{now: d.now, stats: d.stats, ctrl: d.ctrl, agentAPI: d.agentAPI}
	return d
}

func (td *testDaemon) logEvents(t *testing.T) {
	evs, _ := td.client.Events(context.Background(), 0, 0, 0)
	for _, e := range evs.Events {
		t.Logf("%d %s %s %s", e.Seq, e.Type, e.Node, e.Message)
	}
}

// logEventsIfFailed logs the daemon's events at the end of a failed test,
// before the daemon stops.
func (td *testDaemon) logEventsIfFailed(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			td.logEvents(t)
		}
	})
}

// waitBootingIn waits until n of fleet's nodes are booting in zone.
func (td *testDaemon) waitBootingIn(t *testing.T, fleet, zone string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d booting nodes in %s", n, zone), 20*time.Second, func() bool {
		booting := 0
		for _, x := range td.nodes(t, fleet) {
			if x.State == state.NodeBooting && x.Offering.Zone == zone {
				booting++
			}
		}
		return booting == n
	})
}

// lastRunning is the last running node of fleet in listing order.
func (td *testDaemon) lastRunning(t *testing.T, fleet string) state.Node {
	var last state.Node
	for _, x := range td.nodes(t, fleet) {
		if x.State == state.NodeRunning {
			last = x
		}
	}
	return last
}

// noticeSays reports whether a notice event for node mentions substr.
func (td *testDaemon) noticeSays(node, substr string) bool {
	evs, _ := td.client.Events(context.Background(), 0, 0, 0)
	for _, e := range evs.Events {
		if e.Type == "notice" && e.Node == node && strings.Contains(e.Message, substr) {
			return true
		}
	}
	return false
}
