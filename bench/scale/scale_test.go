package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/bench/internal/report"
)

// TestMain lets the test binary serve as the agent swarm child, as the
// scale binary does (benchRendezvous re-executes os.Executable()).
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "agents" {
		if err := runSwarm(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "agents:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestBenchmarksSmall runs every scale benchmark at a small size against
// the real daemon, store and swarm process, and checks that each figure
// was measured (never its value: these are not timed tests).
func TestBenchmarksSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts daemons and a swarm process")
	}
	p := params{Agents: []int{40}, CPUWindow: time.Second, Flood: time.Second,
		Nodes: 300, StormNotices: 50, StormSpread: 500 * time.Millisecond, StormWait: 30 * time.Second, DaemonPasses: 3 * time.Second,
		StateWindow: 300 * time.Millisecond, Appenders: []int{2, 8}, SizeNodes: 500}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var buf bytes.Buffer
	r := report.New(&buf)
	for name, run := range map[string]func() error{
		"state":      func() error { return benchState(ctx, r, p) },
		"rendezvous": func() error { return benchRendezvous(ctx, r, 40, p) },
		"reconcile":  func() error { return benchReconcile(ctx, r, p) },
		"stores":     func() error { return benchStores(ctx, r, p) },
	} {
		if err := run(); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, buf.String())
		}
	}
	got := map[string]report.Figure{}
	for _, f := range r.Figures() {
		got[f.Name] = f
		if f.Missing != "" {
			t.Errorf("figure %s not measured: %s", f.Name, f.Missing)
		}
	}
	for _, name := range []string{
		"state.events_per_s_batched_8_callers", "state.file_per_10000_nodes",
		"rendezvous.40.last_join_to_all_assigned", "rendezvous.40.daemon_cpu_heartbeat_2s", "rendezvous.40.steady_heartbeats_per_s",
		"reconcile.300.pass_pure_median", "reconcile.300.pass_daemon_mean", "reconcile.300.rss", "reconcile.300.storm_notice_to_replacement_max",
		"stores.bbolt.300.pass_daemon_mean", "stores.etcd.300.read_nodes_median", "stores.etcd.300.pass_daemon_mean",
	} {
		f, ok := got[name]
		if !ok {
			t.Errorf("figure %s missing from the report", name)
			continue
		}
		if !strings.HasPrefix(f.Line(), "FIGURE "+name+" = ") {
			t.Errorf("bad summary line %q", f.Line())
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", buf.String())
	}
}
