package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

// TestDestroyThenApplyLocal is the report that opened the incarnations
// work, as a user runs it: a 3-node local fleet with real agents and
// workers runs its job to the end, is destroyed, and the same spec is
// applied again at once. The new fleet's nodes must all get new
// instances, none may be declared lost and no alert may fire; the old
// fleet's events and logs stay under its incarnation.
func TestDestroyThenApplyLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary with real agents")
	}
	bin := fleetdBinary(t)
	d := startDaemon(t, bin, t.TempDir(), freeAddr(t))
	spec := filepath.Join("..", "..", "configs", "examples", "local.hcl")
	ckpt := t.TempDir()
	apply := func() {
		t.Helper()
		if out, errOut, code := d.cli(t, bin, "apply", "-auto-approve", "-var", "steps=40", "-var", "checkpoint_dir="+ckpt, spec); code != 0 {
			t.Fatalf("apply exit %d\n%s\n%s", code, out, errOut)
		}
	}
	detail := func() (api.FleetDetail, bool) {
		out, _, code := d.cli(t, bin, "status", "-json", "demo")
		var f api.FleetDetail
		if code != 0 || json.Unmarshal([]byte(out), &f) != nil {
			return f, false
		}
		return f, true
	}
	apply()
	first, _ := detail()
	waitUntil(t, "the first job to finish", 3*time.Minute, func() bool {
		f, ok := detail()
		if ok {
			first = f
		}
		return ok && f.Completed
	})
	if !first.Succeeded {
		t.Fatalf("first job did not succeed: %s", first.CompletedDetail)
	}
	oldInst := map[string]bool{}
	for _, n := range first.Nodes {
		oldInst[n.InstanceID] = true
	}
	if out, errOut, code := d.cli(t, bin, "destroy", "-auto-approve", "demo"); code != 0 {
		t.Fatalf("destroy exit %d\n%s\n%s", code, out, errOut)
	}
	apply()
	var second api.FleetDetail
	waitUntil(t, "3 running nodes of the new fleet", 2*time.Minute, func() bool {
		f, ok := detail()
		second = f
		return ok && f.NodesByState["running"] == 3
	})
	if second.Incarnation == "" || second.Incarnation == first.Incarnation {
		t.Fatalf("incarnations %q then %q", first.Incarnation, second.Incarnation)
	}
	for _, n := range second.Nodes {
		if oldInst[n.InstanceID] {
			t.Errorf("node %s got the first fleet's instance %s", n.ID, n.InstanceID)
		}
		if !strings.HasPrefix(n.ID, "demo-"+second.Incarnation+"-") {
			t.Errorf("node id %s does not carry the incarnation", n.ID)
		}
	}
	if len(second.Nodes) != 3 {
		t.Errorf("%d node records; want 3 (nothing replaced)", len(second.Nodes))
	}
	if len(second.Alerts) != 0 {
		t.Errorf("alerts: %+v", second.Alerts)
	}
	// `fleetd events demo` (the fleet as its argument) shows the new
	// incarnation only; -incarnation shows the old one's.
	out, errOut, code := d.cli(t, bin, "events", "-json", "demo")
	if code != 0 {
		t.Fatalf("events demo: exit %d: %s", code, errOut)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var e struct{ Type, Node, Message, Incarnation string }
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events line %q: %v", line, err)
		}
		if e.Incarnation != second.Incarnation {
			t.Errorf("events demo shows an event of incarnation %q: %s", e.Incarnation, line)
		}
		if strings.Contains(e.Message, "lost") || e.Type == "alert" {
			t.Errorf("event: %s", line)
		}
	}
	out, _, code = d.cli(t, bin, "events", "-incarnation", first.Incarnation, "demo")
	if code != 0 || !strings.Contains(out, "job.finished") || !strings.Contains(out, "(reported by ") {
		t.Errorf("events of the first incarnation (exit %d) lack its job.finished:\n%s", code, out)
	}
	if i := strings.Index(out, "(reported by "); i >= 0 && strings.Contains(out[i:], ")all workers") {
		t.Errorf("job.finished message runs its detail into the node name:\n%s", out)
	}
	old, _, _ := d.cli(t, bin, "logs", "-incarnation", first.Incarnation, "-n", "1000", "demo")
	cur, _, _ := d.cli(t, bin, "logs", "-n", "1000", "demo")
	for _, n := range first.Nodes {
		if strings.Contains(cur, n.ID+" ") {
			t.Errorf("logs of the new fleet show the old node %s", n.ID)
		}
	}
	if !slices.ContainsFunc(first.Nodes, func(n api.NodeInfo) bool { return strings.Contains(old, n.ID+" ") }) {
		t.Errorf("logs -incarnation %s show none of the old nodes:\n%s", first.Incarnation, old)
	}
}
