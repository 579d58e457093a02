package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/agentapi"
	"github.com/fleetd/fleetd/fleet/controller"
	"github.com/fleetd/fleetd/fleet/stats"
)

func dumpEvents(t *testing.T, td *testDaemon) {
	evs, _ := td.client.Events(context.Background(), 0, 0, 0)
	for _, e := range evs.Events {
		t.Logf("%d %s %s %s", e.Seq, e.Type, e.Node, e.Message)
	}
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
