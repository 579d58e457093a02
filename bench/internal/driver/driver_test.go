package driver

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/local"
)

// The fleet both benchmarks apply must stay a valid spec with the
// settings the comparisons rely on, in either elastic mode.
func TestSpec(t *testing.T) {
	for _, elastic := range []string{"", "restart", "in-process"} {
		s := Spec{StateDir: t.TempDir(), AddressPrefix: "127.0.77.", Lead: 30 * time.Second, Elastic: elastic,
			Command: []string{"/usr/bin/python3", "/abs/train.py", "--steps", "100"}}
		file, diags := spec.Parse("bench.hcl", []byte(s.HCL()), spec.Options{Schema: func(name string) (providers.ConfigSchema, bool) {
			return local.Schema, name == local.Name
		}})
		if diags.HasErrors() {
			t.Fatalf("elastic %q: spec does not parse: %s\n%s", elastic, diags.Error(), s.HCL())
		}
		fl := file.Fleets[0]
		if fl.Name != Fleet || fl.MinNodes != 2 || fl.MaxNodes != 3 || fl.TargetNodes() != 3 || !slices.Equal(fl.Training.Command, s.Command) {
			t.Errorf("elastic %q: fleet %s nodes %d..%d target %d command %q", elastic, fl.Name, fl.MinNodes, fl.MaxNodes, fl.TargetNodes(), fl.Training.Command)
		}
		if want := elastic != ""; strings.Contains(s.HCL(), "elastic ") != want {
			t.Errorf("elastic %q: the spec's elastic line present is not %v:\n%s", elastic, want, s.HCL())
		}
		if fl.Rendezvous.LastCall != spec.DefaultLastCall || fl.Rendezvous.Heartbeat != spec.DefaultHeartbeat || fl.Rendezvous.DeadAfter != spec.DefaultDeadAfter {
			t.Errorf("rendezvous %+v, want the spec defaults", fl.Rendezvous)
		}
	}
}

// TestTorchrunNodes runs shell "agents" that log the rendezvous line: the
// cluster sees their lines, their join, and kills and silences them.
func TestTorchrunNodes(t *testing.T) {
	var mu sync.Mutex
	lines := map[string][]string{}
	tr, err := NewTorchrun(TorchrunConfig{Python: "/bin/sh", Dir: t.TempDir(),
		Argv: func(node string, port int) []string {
			return []string{"-c", "echo hello " + node + "; echo \"INFO [default] " + RendezvousLine + "\"; exec sleep 60"}
		},
		Line: func(node, line string) {
			mu.Lock()
			lines[node] = append(lines[node], line)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Stop()
	since := time.Now()
	for _, n := range []string{"A", "B", "C"} {
		if err := tr.Start(n); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"A", "B", "C"} {
		at, err := tr.WaitRendezvous(context.Background(), n, since, 10*time.Second)
		if err != nil || at.Before(since) {
			t.Fatalf("node %s: rendezvous at %v, %v", n, at, err)
		}
	}
	if _, err := tr.WaitRendezvous(context.Background(), "A", time.Now().Add(time.Hour), 100*time.Millisecond); err == nil {
		t.Error("a rendezvous from the future was found")
	}
	if got := tr.Live(); !slices.Equal(got, []string{"A", "B", "C"}) {
		t.Errorf("live %v", got)
	}
	if err := tr.Kill("B"); err != nil {
		t.Fatal(err)
	}
	if tr.Kill("B") == nil {
		t.Error("killed B twice")
	}
	if n := tr.Silence("C"); n < 1 {
		t.Errorf("silenced %d processes of C", n)
	}
	if got := tr.Live(); !slices.Equal(got, []string{"A"}) {
		t.Errorf("live after kill and silence: %v", got)
	}
	notes := tr.Notes()
	if len(notes) != 3 || !strings.HasPrefix(notes[0].What, "torchrun agent ") || !strings.Contains(notes[0].What, "[default] "+RendezvousLine) {
		t.Errorf("notes %+v", notes)
	}
	if len(Between(notes, time.Now(), time.Now().Add(time.Hour))) != 0 || len(Between(notes, since, time.Now())) != 3 {
		t.Errorf("Between does not select by time: %+v", notes)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines["A"]) != 2 || lines["A"][0] != "hello A" {
		t.Errorf("node A's lines %q", lines["A"])
	}
}

func TestWithout(t *testing.T) {
	if got := Without([]string{"a", "b", "c"}, "b"); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("%v", got)
	}
}

func TestWorkerEvent(t *testing.T) {
	type ev struct {
		Event string  `json:"event"`
		Time  float64 `json:"time"`
	}
	for _, tt := range []struct {
		line string
		ok   bool
		want ev
	}{
		{`{"event":"step","time":12.5}`, true, ev{"step", 12.5}},
		{`[default0]:{"event":"start","time":1}` + "\r", true, ev{"start", 1}},
		{`  {"event":"step"}`, true, ev{Event: "step"}}, // which events count is the caller's check
		{`[default0]: {"event":"step","time":1}`, false, ev{}},
		{`garbage {"event":"step","time":1}`, false, ev{}},
		{`[default0]:not json {`, false, ev{}},
		{`INFO:torch.distributed.elastic.agent.server.api:[default] Rendezvous'ing worker group`, false, ev{}},
	} {
		if got, ok := WorkerEvent[ev](tt.line); ok != tt.ok || got != tt.want {
			t.Errorf("WorkerEvent(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
	if got := UnixTime(1700000000.25); !got.Equal(time.Unix(1700000000, 250_000_000)) {
		t.Errorf("UnixTime = %v", got)
	}
}
