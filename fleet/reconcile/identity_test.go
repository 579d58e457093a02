package reconcile

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

func tagged(fleet, node, daemon, inc string) map[string]string {
	m := map[string]string{providers.TagFleet: fleet, providers.TagNodeID: node}
	if daemon != "" {
		m[providers.TagDaemonID] = daemon
	}
	if inc != "" {
		m[providers.TagIncarnation] = inc
	}
	return m
}

func TestIdentityOf(t *testing.T) {
	cur := Identity{Fleet: "bert", DaemonID: "d1", Incarnation: "inc2"}
	legacy := cur
	legacy.LegacyUntagged = true
	tests := []struct {
		name string
		id   Identity
		tags map[string]string
		want Owner
	}{
		{"ours", cur, tagged("bert", "n", "d1", "inc2"), Ours},
		{"other fleet", cur, tagged("gpt", "n", "d1", "inc2"), OtherFleet},
		{"other daemon, same incarnation id", cur, tagged("bert", "n", "d2", "inc2"), OtherDaemon},
		{"no daemon tag", cur, tagged("bert", "n", "", "inc2"), OtherDaemon},
		{"earlier incarnation", cur, tagged("bert", "n", "d1", "inc1"), OtherIncarnation},
		{"untagged, not legacy", cur, tagged("bert", "n", "d1", ""), OtherIncarnation},
		{"untagged, legacy fleet", legacy, tagged("bert", "n", "d1", ""), Ours},
		{"legacy fleet, other incarnation", legacy, tagged("bert", "n", "d1", "inc1"), OtherIncarnation},
		{"no incarnation to check", Identity{Fleet: "bert", DaemonID: "d1"}, tagged("bert", "n", "d1", "inc1"), Ours},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.id.Of(providers.Instance{ID: "i", Tags: tt.tags}); got != tt.want {
				t.Errorf("Of = %d; want %d", got, tt.want)
			}
		})
	}
}

// TestReCreatedFleetAdoptsNothing is the destroy-then-apply bug: the new
// incarnation's node has the id an instance of the old incarnation (or of
// another daemon's fleet of the same name) carries. No pass may match,
// drain, adopt or delete those instances.
func TestReCreatedFleetAdoptsNothing(t *testing.T) {
	f := testFleet(1, 1)
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	now := t0
	node := state.Node{ID: "bert-1-1", Fleet: "bert", State: state.NodeBooting, Offering: a, InstanceID: "i-new",
		CreatedAt: now.Add(-time.Minute), UpdatedAt: now.Add(-time.Minute)}
	inst := func(id, daemon, inc string) providers.Instance {
		return providers.Instance{ID: id, Offering: a, State: providers.StateRunning, Tags: tagged("bert", "bert-1-1", daemon, inc), LaunchedAt: now.Add(-time.Hour)}
	}
	in := Input{
		Fleet: f, DaemonID: "d1", Incarnation: "inc2", Now: now, StartedAt: now.Add(-time.Hour), Nodes: []state.Node{node},
		Instances: []providers.Instance{
			inst("i-new", "d1", "inc2"),
			inst("i-old", "d1", "inc1"),   // the destroyed incarnation's, same node id
			inst("i-other", "d2", "inc2"), // another daemon's fleet "bert"
		},
		ObservedOK: map[string]bool{"aws": true},
		Offerings:  []providers.Offering{a},
		Joined:     map[string]bool{"bert-1-1": true},
	}
	p := Reconcile(in)
	for _, act := range p.Actions {
		s := act.String()
		if strings.Contains(s, "i-old") || strings.Contains(s, "i-other") {
			if _, ok := act.(Alert); !ok {
				t.Errorf("action touches another owner's instance: %s", s)
			}
		}
	}
	if n := len(actionsOf[DeleteOrphan](p)) + len(actionsOf[Terminate](p)); n != 0 {
		t.Errorf("deletes or terminations: %v", p.Actions)
	}
	kinds := map[string]string{}
	for _, al := range p.Alerts() {
		kinds[al.Subject] = al.Kind
	}
	if kinds["i-old"] != AlertOtherIncarnation || kinds["i-other"] != AlertForeign {
		t.Errorf("alerts %v; want other-incarnation for i-old and foreign-instance for i-other", kinds)
	}

	// Without its own instance the node is lost (and replaced), never
	// given the old incarnation's.
	in.Instances = in.Instances[1:]
	in.Nodes[0].InstanceID = ""
	in.Nodes[0].State = state.NodeProvisioning
	in.Nodes[0].UpdatedAt = now.Add(-time.Hour)
	p = Reconcile(in)
	for _, tr := range actionsOf[Transition](p) {
		if tr.Node.InstanceID == "i-old" || tr.Node.InstanceID == "i-other" {
			t.Errorf("node given another owner's instance: %s", tr)
		}
	}
}

func TestCheckLaunched(t *testing.T) {
	who := Identity{Fleet: "bert", DaemonID: "d1", Incarnation: "inc2"}
	ok := providers.Instance{ID: "i-1", Tags: who.Tags("n1")}
	if err := who.CheckLaunched("n1", []providers.Instance{ok}); err != nil {
		t.Errorf("own instance refused: %v", err)
	}
	for name, in := range map[string]providers.Instance{
		"old incarnation": {ID: "i-2", Tags: tagged("bert", "n1", "d1", "inc1")},
		"other daemon":    {ID: "i-3", Tags: tagged("bert", "n1", "d2", "inc2")},
		"other node":      {ID: "i-4", Tags: who.Tags("n2")},
	} {
		err := who.CheckLaunched("n1", []providers.Instance{in})
		var fe *ForeignLaunchError
		if !errors.As(err, &fe) || fe.InstanceID != in.ID {
			t.Errorf("%s: CheckLaunched = %v; want a ForeignLaunchError naming %s", name, err, in.ID)
			continue
		}
		// The node fails without backing the offering off.
		n := state.Node{ID: "n1", Offering: offering("us-east-1a", "p4d", providers.Spot, 10)}
		res := AfterLaunch(n, nil, err, t0)
		if res.Node.State != state.NodeFailed || res.Mark != nil || res.Node.InstanceID != "" {
			t.Errorf("%s: AfterLaunch = %+v; want failed, no mark, no instance", name, res)
		}
	}
}

func TestTokensAndTagsNeverRepeat(t *testing.T) {
	a := Identity{Fleet: "demo", DaemonID: "d1", Incarnation: "inc1"}
	b := Identity{Fleet: "demo", DaemonID: "d2", Incarnation: "inc1"}
	if a.Token("demo-inc1-1-abcd") == b.Token("demo-inc1-1-abcd") {
		t.Error("two daemons share a launch token for the same node id")
	}
	if a.Tags("n")[providers.TagIncarnation] != "inc1" || a.Tags("n")[providers.TagDaemonID] != "d1" {
		t.Errorf("tags %v", a.Tags("n"))
	}
}

func TestNodeIDs(t *testing.T) {
	seq := 0
	rnd := func(n int) (string, error) { seq++; return strings.Repeat(string(rune('a'+seq%26)), n), nil }
	existing := []state.Node{{ID: "bert-inc1-7-xxxx"}, {ID: "bert-inc1-3-yyyy"}, {ID: "bert-1-9"}, {ID: "bert-inc0-20-zzzz"}}
	next := NodeIDs("bert", "inc1", existing, rnd)
	if got := next(); got != "bert-inc1-8-bbbb" {
		t.Errorf("first id %q; want ordinal 8 after the incarnation's highest (7)", got)
	}
	if got := next(); got != "bert-inc1-9-cccc" {
		t.Errorf("second id %q", got)
	}
	// With the real random source, many ids of one incarnation, and of
	// two incarnations starting from the same (restored) records, are all
	// distinct.
	seen := map[string]bool{}
	for _, inc := range []string{"inc1", "inc1", "inc2"} {
		next := NodeIDs("bert", inc, nil, state.RandomID)
		for range 500 {
			id := next()
			if seen[id] {
				t.Fatalf("node id %s repeated", id)
			}
			seen[id] = true
		}
	}
}
