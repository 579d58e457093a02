package fleet

import (
	"context"
	"testing"
)

func dumpEvents(t *testing.T, td *testDaemon) {
	evs, _ := td.client.Events(context.Background(), 0, 0, 0)
	for _, e := range evs.Events {
		t.Logf("%d %s %s %s", e.Seq, e.Type, e.Node, e.Message)
	}
	for _, a := range td.runtime("train").plan.Actions {
		t.Logf("action: %s", a)
	}
	for _, n := range td.nodes(t, "train") {
		t.Logf("node %s %s %s", n.ID, n.State, n.Reason)
	}
}
