package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/local"
)

// The fleet the benchmark applies must stay a valid spec with the settings
// the comparison relies on.
func TestFleetdSpec(t *testing.T) {
	cfg := config{Config: driver.Config{Python: "/usr/bin/python3", Script: "/abs/ddp_train.py", StepTime: 0.1, CkptEvery: 10, Lead: 30 * time.Second}, steps: 100}
	f := newFleetd(cfg, t.TempDir())
	file, diags := spec.Parse("bench.hcl", []byte(f.spec().HCL()), spec.Options{Schema: func(name string) (providers.ConfigSchema, bool) {
		return local.Schema, name == local.Name
	}})
	if diags.HasErrors() {
		t.Fatalf("spec does not parse: %s\n%s", diags.Error(), f.spec().HCL())
	}
	fl := file.Fleets[0]
	if fl.MinNodes != 2 || fl.MaxNodes != 3 || fl.TargetNodes() != 3 {
		t.Errorf("nodes min %d max %d target %d, want 2, 3, 3", fl.MinNodes, fl.MaxNodes, fl.TargetNodes())
	}
	want := append([]string{cfg.Python, cfg.Script}, cfg.trainArgs(f.Dir+"/ckpt")...)
	if len(fl.Training.Command) != len(want) {
		t.Fatalf("command %q, want %q", fl.Training.Command, want)
	}
	for i := range want {
		if fl.Training.Command[i] != want[i] {
			t.Fatalf("command %q, want %q (the same as under torchrun)", fl.Training.Command, want)
		}
	}
	// Recovery must be measured with fleetd's defaults.
	if fl.Rendezvous.LastCall != spec.DefaultLastCall || fl.Rendezvous.Heartbeat != spec.DefaultHeartbeat || fl.Rendezvous.DeadAfter != spec.DefaultDeadAfter {
		t.Errorf("rendezvous %+v, want the spec defaults", fl.Rendezvous)
	}
}

func TestTorchrunArgv(t *testing.T) {
	cfg := config{Config: driver.Config{Python: "/usr/bin/python3", Script: "/abs/ddp_train.py", KeepAliveLauncher: "/abs/torchrun_keepalive.py", StepTime: 0.1, CkptEvery: 10}, steps: 100}
	for _, tt := range []struct {
		defaults bool
		node     string
		launcher []string // argv before "-r 1 -t 1"
		want     []string
		notWant  string
	}{
		{false, "A", []string{cfg.KeepAliveLauncher}, []string{"--rdzv_conf=is_host=1,last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=5", "--monitor_interval=0.1"}, "torch.distributed.run"},
		{false, "D", []string{cfg.KeepAliveLauncher}, []string{"--rdzv_conf=is_host=0,last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=5", "--monitor_interval=0.1"}, ""},
		{true, "A", []string{"-m", "torch.distributed.run"}, []string{"--rdzv_conf=is_host=1"}, "--monitor_interval=0.1"},
		{true, "B", []string{"-m", "torch.distributed.run"}, []string{"--rdzv_conf=is_host=0"}, cfg.KeepAliveLauncher},
	} {
		tr, err := newTorchrun(cfg, tt.defaults, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		argv := tr.Agent.Argv(tt.node, tr.Nodes.Port())
		has := map[string]bool{}
		for _, a := range argv {
			has[a] = true
		}
		for _, want := range append([]string{"--nnodes=2:3", "--nproc_per_node=1", "--rdzv_backend=c10d", "--max_restarts=10", cfg.Script}, tt.want...) {
			if !has[want] {
				t.Errorf("%s node %s: argv %q lacks %q", tr.name(), tt.node, argv, want)
			}
		}
		if tt.notWant != "" && has[tt.notWant] {
			t.Errorf("%s node %s: argv %q has %q", tr.name(), tt.node, argv, tt.notWant)
		}
		n := len(tt.launcher)
		if !slices.Equal(argv[:n], tt.launcher) || !slices.Equal(argv[n:n+4], []string{"-r", "1", "-t", "1"}) {
			t.Errorf("%s node %s: argv %q does not start with %q -r 1 -t 1", tr.name(), tt.node, argv, tt.launcher)
		}
		train := cfg.trainArgs(tr.Dir + "/ckpt")
		if tail := argv[len(argv)-len(train)-1:]; tail[0] != cfg.Script || !slices.Equal(tail[1:], train) {
			t.Fatalf("%s node %s: worker command %q, want %s %q", tr.name(), tt.node, tail, cfg.Script, train)
		}
	}
}

func TestAgentNotes(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.log")
	log := `{"time":"2026-11-22T06:04:45.065511282Z","level":"INFO","msg":"the master's store listens","node":"n1","round":3,"port":29502,"after":"99ms"}
not json
{"time":"2026-11-22T06:04:45.07Z","level":"INFO","msg":"worker started","round":3,"rank":1,"pid":7,"warm":true,"warm_ready":false}
{"time":"2026-11-22T06:04:45.08Z","level":"INFO","msg":"heartbeat failed"}
`
	if err := os.WriteFile(file, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got := driver.AgentNotes("n1", file, agentExplains)
	want := []string{
		"agent n1: the master's store listens (round=3 after=99ms)",
		"agent n1: worker started (round=3 rank=1 warm=true warm_ready=false)",
	}
	if len(got) != len(want) {
		t.Fatalf("notes %v, want %q", got, want)
	}
	for i := range want {
		if got[i].What != want[i] {
			t.Errorf("note %d = %q, want %q", i, got[i].What, want[i])
		}
	}
	if got[0].At.Format(time.RFC3339Nano) != "2026-11-22T06:04:45.065511282Z" {
		t.Errorf("time %v", got[0].At)
	}
	if driver.AgentNotes("n1", filepath.Join(t.TempDir(), "missing.log"), agentExplains) != nil {
		t.Error("notes from a missing log")
	}
}
