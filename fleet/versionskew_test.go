package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers/providertest"
)

// TestAgentVersionSkew: a daemon v1.4.2 registers agents of its window
// (v1.3.x–v1.4.x) and releases it cannot judge, refuses a booting node
// whose agent is outside it (426, an event, the node stays booting), and
// keeps a node already at work whose agent is outside it (an event once),
// so a daemon upgrade never kills a running job.
func TestAgentVersionSkew(t *testing.T) {
	mem := providertest.NewMemProvider()
	td := launchTestDaemon(t, t.TempDir(), staticProviders{providertest.MemName: mem}, mem, Options{Version: "v1.4.2"})
	td.apply(context.Background(), t, "train.hcl", memSpec)
	waitFor(t, "3 booting nodes", 15*time.Second, func() bool { return countState(td.nodes(t, "train"), state.NodeBooting) == 3 })
	nodes := td.nodes(t, "train")
	register := func(node, version string) (int, string) {
		b, _ := json.Marshal(api.RegisterRequest{Address: "127.0.0.9", AgentVersion: version})
		code, body, _ := td.call(t, "POST", "/v1/agent/train/"+node+"/register", "Bearer "+td.NodeToken("train", node), b)
		return code, string(body)
	}
	nodeState := func(id string) state.Node {
		for _, n := range td.nodes(t, "train") {
			if n.ID == id {
				return n
			}
		}
		t.Fatalf("no node %s", id)
		return state.Node{}
	}
	tests := []struct {
		name, node, version string
		code                int
		state               state.NodeState
		event               string // event type expected for the node ("" none)
	}{
		{"booting, too old: refused", nodes[0].ID, "v1.2.0", http.StatusUpgradeRequired, state.NodeBooting, "agent.version_refused"},
		{"booting, too new: refused", nodes[0].ID, "v2.0.0", http.StatusUpgradeRequired, state.NodeBooting, "agent.version_refused"},
		{"booting, one minor back: joins", nodes[0].ID, "v1.3.9", http.StatusOK, state.NodeJoined, ""},
		{"booting, dev build: joins", nodes[1].ID, "dev", http.StatusOK, state.NodeJoined, ""},
		{"joined, daemon moved on: kept", nodes[1].ID, "v1.1.0", http.StatusOK, state.NodeJoined, "agent.version_skew"},
		{"booting, same release: joins", nodes[2].ID, "v1.4.2", http.StatusOK, state.NodeJoined, ""},
	}
	var since uint64
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := register(tt.node, tt.version)
			if code != tt.code {
				t.Fatalf("register %s: HTTP %d %s, want %d", tt.version, code, body, tt.code)
			}
			if code == http.StatusUpgradeRequired && (!strings.Contains(body, "v1.3.x–v1.4.x") || !strings.Contains(body, tt.version)) {
				t.Errorf("refusal does not name the versions and window: %s", body)
			}
			n := nodeState(tt.node)
			if n.State != tt.state {
				t.Errorf("node %s is %s, want %s", tt.node, n.State, tt.state)
			}
			if code == http.StatusOK && n.AgentVersion != tt.version {
				t.Errorf("node records agent version %q, want %q", n.AgentVersion, tt.version)
			}
			ev, err := td.client.Events(context.Background(), since, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			since = ev.Next
			var got []string
			for _, e := range ev.Events {
				if e.Node == tt.node && strings.HasPrefix(e.Type, "agent.version") {
					got = append(got, e.Type)
				}
			}
			if want := []string{tt.event}; tt.event == "" && len(got) != 0 || tt.event != "" && (len(got) != 1 || got[0] != want[0]) {
				t.Errorf("events %v, want %q", got, tt.event)
			}
		})
	}
	// Re-registering with the same skewed version (the agent after a
	// daemon restart) does not repeat the warning.
	if code, body := register(nodes[1].ID, "v1.1.0"); code != http.StatusOK {
		t.Fatalf("re-register: HTTP %d %s", code, body)
	}
	ev, err := td.client.Events(context.Background(), since, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ev.Events {
		if e.Type == "agent.version_skew" {
			t.Errorf("warned again: %s", e.Message)
		}
	}
}
