package fleet

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spend"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/stats"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
	dto "github.com/prometheus/client_model/go"
)

// fleetValue gathers one fleet series of a family from the daemon's own
// registry; false when the series is absent.
func fleetValue(t *testing.T, td *testDaemon, name, fleet string) (float64, bool) {
	t.Helper()
	m, ok := byLabel(t, td.Daemon, name, "fleet")[fleet]
	if !ok {
		return 0, false
	}
	return value(m), true
}

// byLabel gathers d's series of the metric name, keyed by their value of
// label; where several share one, the first gathered.
func byLabel(t *testing.T, d *Daemon, name, label string) map[string]*dto.Metric {
	t.Helper()
	mfs, err := d.metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.Metric{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if _, seen := out[l.GetValue()]; l.GetName() == label && !seen {
					out[l.GetValue()] = m
				}
			}
		}
	}
	return out
}

// fleetd_spend_usd_total never goes down: not when a node record is
// forgotten (the fleetd_spend_usd gauge drops then), and not across a
// daemon restart on the same state.
func TestSpendTotalNeverGoesDown(t *testing.T) {
	dir := t.TempDir()
	mem := providertest.NewMemProvider()
	opts := Options{Params: reconcile.Params{ForgetAfter: 300 * time.Millisecond, VisibilityGrace: 100 * time.Millisecond}}
	td := launchTestDaemon(t, dir, staticProviders{providertest.MemName: mem}, mem, opts)
	ctx := context.Background()
	td.apply(ctx, t, "train.hcl", memSpec)
	waitFor(t, "3 booting nodes", 10*time.Second, func() bool { return countState(td.nodes(t, "train"), state.NodeBooting) == 3 })

	last := 0.0
	sample := func(when string) float64 {
		t.Helper()
		v, ok := fleetValue(t, td, "fleetd_spend_usd_total", "train")
		if !ok {
			t.Fatalf("%s: no fleetd_spend_usd_total{fleet=train}", when)
		}
		if v < last {
			t.Fatalf("%s: fleetd_spend_usd_total went down: %v after %v", when, v, last)
		}
		last = v
		return v
	}
	sample("booting")

	// The instance of one node vanishes: its record ends, then is forgotten.
	victim := td.nodes(t, "train")[0]
	if err := mem.Delete(ctx, providers.Config{Fleet: "train"}, victim.InstanceID); err != nil {
		t.Fatal(err)
	}
	gone := func() bool {
		for _, n := range td.nodes(t, "train") {
			if n.ID == victim.ID {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; !gone(); i++ {
		if time.Now().After(deadline) {
			dumpEvents(t, td)
			t.Fatalf("node %s never forgotten", victim.ID)
		}
		sample(fmt.Sprintf("while forgetting (sample %d)", i))
		time.Sleep(20 * time.Millisecond)
	}
	total := sample("after forget")
	gauge, _ := fleetValue(t, td, "fleetd_spend_usd", "train")
	forgotten := stateView(t, td, func(tx state.Tx) (float64, error) { return spend.ReadForgotten(tx, "train") })
	if forgotten <= 0 {
		t.Fatalf("persisted forgotten spend = %v, want > 0 (the victim ran with price %v)", forgotten, victim.Offering.PricePerHour)
	}
	if gauge >= total {
		t.Errorf("fleetd_spend_usd %v not below the counter %v after a record was forgotten", gauge, total)
	}

	// A restart on the same data directory: the counter carries on from the
	// persisted figures, never below the last value shown.
	td.stop()
	td = launchTestDaemon(t, dir, staticProviders{providertest.MemName: mem}, mem, opts)
	sample("after restart")
}

// Below-min_nodes is 1 until enough nodes have joined; the heartbeat age
// is per fleet and follows the agents' heartbeats.
func TestBelowMinAndHeartbeatAge(t *testing.T) {
	td, _ := startBooting(t)
	if v, _ := fleetValue(t, td, "fleetd_below_min_nodes", "train"); v != 1 {
		t.Errorf("below min while all nodes boot = %v, want 1", v)
	}
	if v, _ := fleetValue(t, td, "fleetd_min_nodes", "train"); v != 2 {
		t.Errorf("fleetd_min_nodes = %v, want 2", v)
	}
	if _, ok := fleetValue(t, td, "fleetd_heartbeat_age_max_seconds", "train"); ok {
		t.Error("heartbeat age reported before any agent registered")
	}
	td.joinAll(t, "train", map[string]bool{})
	waitFor(t, "3 running nodes", 10*time.Second, func() bool { return countState(td.nodes(t, "train"), state.NodeRunning) == 3 })
	if v, _ := fleetValue(t, td, "fleetd_below_min_nodes", "train"); v != 0 {
		t.Errorf("below min with 3 running = %v, want 0", v)
	}
	age0, ok := fleetValue(t, td, "fleetd_heartbeat_age_max_seconds", "train")
	if !ok || age0 < 0 || age0 > 30 {
		t.Fatalf("heartbeat age after join = %v (present %v), want a fresh one", age0, ok)
	}
	if _, ok := fleetValue(t, td, "fleetd_job_completed", "train"); ok {
		t.Error("fleetd_job_completed while the job runs")
	}
	// A worker reports the job failed: the fleet scales to zero, min_nodes
	// no longer applies, and the outcome is exported.
	node := td.nodes(t, "train")[0].ID
	if code := td.agentCall(t, "train", node, "done", api.DoneRequest{Success: false, Detail: "exit 1"}); code != 200 {
		t.Fatalf("done: HTTP %d", code)
	}
	outcome := ""
	waitFor(t, "a failed job with min_nodes 0", 5*time.Second, func() bool {
		outcome = ""
		for o, m := range byLabel(t, td.Daemon, "fleetd_job_completed", "outcome") {
			if value(m) == 1 {
				outcome = o
			}
		}
		v, _ := fleetValue(t, td, "fleetd_min_nodes", "train")
		b, _ := fleetValue(t, td, "fleetd_below_min_nodes", "train")
		return v == 0 && b == 0 && outcome != ""
	})
	if outcome != "failed" {
		t.Errorf("fleetd_job_completed outcome %q, want failed", outcome)
	}
}

func TestProviderErrorLabels(t *testing.T) {
	regional := providers.Config{Raw: []byte(`{"regions":["eu-west-1"]}`)}
	for _, c := range []struct {
		name       string
		err        error
		known      string
		cfg        providers.Config
		kind, want string
	}{
		{"typed error naming an offering", &providers.Error{Kind: providers.KindCapacity, Offering: "aws/us-east-1/us-east-1a/p4d.24xlarge/spot"}, "", regional, "insufficient-capacity", "us-east-1"},
		{"the offering's region", providers.QuotaExceeded(errors.New("x")), "us-west-2", regional, "quota", "us-west-2"},
		{"one-region block", fmt.Errorf("list: %w", providers.Transient(errors.New("throttled"))), "", regional, "transient", "eu-west-1"},
		{"gcp zones of one region", errors.New("boom"), "", providers.Config{Raw: []byte(`{"zones":["us-central1-a","us-central1-b"]}`)}, "unclassified", "us-central1"},
		{"several regions", errors.New("boom"), "", providers.Config{Raw: []byte(`{"regions":["us-east-1","us-west-2"]}`)}, "unclassified", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := stats.CallRegion(c.err, c.known, c.cfg); got != c.want {
				t.Errorf("region = %q, want %q", got, c.want)
			}
			if got := stats.ErrorKindLabel(c.err); got != c.kind {
				t.Errorf("kind = %q, want %q", got, c.kind)
			}
		})
	}
}
