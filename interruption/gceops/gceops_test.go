package gceops_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/interruption/gceops"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
)

func ctxT(t *testing.T) context.Context { return testutil.Context(t, 20*time.Second) }

// launch starts n spot instances through the real gcp provider, so the
// test checks the notice names the provider's own instance ids.
func launch(t *testing.T, f *fakegce.Server, zone string, nodes ...string) []providers.Instance {
	t.Helper()
	raw, _ := json.Marshal(map[string]any{
		"project": f.Project(), "zones": []string{"us-central1-a", "us-central1-b"},
		"machine_types": []string{"g2-standard-8"}, "image": "projects/p/global/images/i", "endpoint": f.URL,
	})
	cfg := providers.Config{Fleet: "f", Raw: raw}
	p := gcp.New(gcp.Options{PollInterval: 5 * time.Millisecond})
	offs, err := p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var off providers.Offering
	for _, o := range offs {
		if o.Zone == zone && o.CapacityType == providers.Spot {
			off = o
		}
	}
	var out []providers.Instance
	for _, node := range nodes {
		ins, err := p.Create(ctxT(t), cfg, providers.LaunchRequest{Offering: off, Count: 1, Tags: map[string]string{providers.TagFleet: "f", providers.TagNodeID: node}, IdempotencyToken: node})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ins...)
	}
	return out
}

func preempt(t *testing.T, f *fakegce.Server, id string) fakegce.Operation {
	t.Helper()
	zone, name, _ := gcp.ParseInstanceID(id)
	op, err := f.Preempt(zone, name)
	if err != nil {
		t.Fatal(err)
	}
	return op
}

func TestPreemptionEmittedOnce(t *testing.T) {
	f := fakegce.New(fakegce.Options{})
	defer f.Close()
	a := launch(t, f, "us-central1-a", "a1", "a2")
	launch(t, f, "us-central1-b", "b1")
	cl, err := gceops.NewClients(ctxT(t), f.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	var (
		mu      sync.Mutex
		notices []interruption.Notice
		errs    []error
	)
	p := &gceops.Poller{
		Project: f.Project(), Lister: cl, Interval: 10 * time.Millisecond,
		Zones:   func() []string { return []string{"us-central1-a", "us-central1-b"} },
		OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() },
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		done <- p.Run(ctx, func(n interruption.Notice) { mu.Lock(); notices = append(notices, n); mu.Unlock() })
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(notices) }

	time.Sleep(50 * time.Millisecond) // several polls with nothing to report
	if n := count(); n != 0 {
		t.Fatalf("%d notices before any preemption", n)
	}
	op := preempt(t, f, a[1].ID)
	for deadline := time.Now().Add(5 * time.Second); count() == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	// Let the poller see the same operation many more times.
	time.Sleep(100 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 {
		t.Errorf("poll errors: %v", errs)
	}
	if len(notices) != 1 {
		t.Fatalf("notices %+v, want exactly one", notices)
	}
	n := notices[0]
	insert, _ := time.Parse(time.RFC3339Nano, op.InsertTime)
	if n.Instance != a[1].ID || n.Kind != interruption.Preempted || n.Source != "gce-operations" || !n.Deadline.Equal(insert.Add(30*time.Second)) || n.Validate() != nil {
		t.Errorf("notice %+v, want preempted %s with deadline %v", n, a[1].ID, insert.Add(30*time.Second))
	}
	if !strings.Contains(n.ID, strconv.FormatUint(uint64(op.ID), 10)) {
		t.Errorf("notice id %q does not name operation %d", n.ID, op.ID)
	}
}

// stubLister serves fixed operations per zone, ignoring the filter (the
// Poller must not trust it), or fails for zones in fail.
type stubLister struct {
	ops  map[string][]gceops.Operation
	fail map[string]bool
}

func (s *stubLister) ListZoneOperations(_ context.Context, _, zone, filter string) ([]gceops.Operation, error) {
	if filter != gceops.PreemptedFilter {
		return nil, errors.New("unexpected filter " + filter)
	}
	if s.fail[zone] {
		return nil, errors.New("backend error")
	}
	return s.ops[zone], nil
}

func preemptOp(id, zone, name string, at time.Time) gceops.Operation {
	return gceops.Operation{
		ID: id, Name: "systemevent-" + id, OperationType: gceops.OperationTypePreempted,
		TargetLink: fakegce.APIBase + "projects/p/zones/" + zone + "/instances/" + name, InsertTime: at,
	}
}

func TestPollDedupSinceAndErrors(t *testing.T) {
	now := time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)
	clock := now
	l := &stubLister{ops: map[string][]gceops.Operation{
		"us-central1-a": {
			preemptOp("1", "us-central1-a", "old", now.Add(-time.Hour)), // before Since
			preemptOp("2", "us-central1-a", "vm-2", now.Add(-time.Minute)),
			{ID: "3", OperationType: "insert", TargetLink: "x/instances/vm-3", InsertTime: now},
		},
		"us-central1-b": {preemptOp("4", "us-central1-b", "vm-4", now)},
	}, fail: map[string]bool{"us-central1-c": true}}
	p := &gceops.Poller{
		Project: "p", Lister: l, Now: func() time.Time { return clock },
		Zones: func() []string { return []string{"us-central1-a", "us-central1-c", "us-central1-b"} },
	}
	got, err := p.Poll(ctxT(t))
	if err == nil || !strings.Contains(err.Error(), "us-central1-c") {
		t.Errorf("Poll error %v, want the failing zone named", err)
	}
	var ids []string
	for _, n := range got {
		ids = append(ids, n.Instance)
	}
	if strings.Join(ids, ",") != "us-central1-a/vm-2,us-central1-b/vm-4" {
		t.Fatalf("first poll: %v, want vm-2 and vm-4 (not the old one, not the insert)", ids)
	}
	if got, _ := p.Poll(ctxT(t)); len(got) != 0 {
		t.Errorf("second poll repeated %+v", got)
	}
	// Past the retention window the old operations are forgotten and
	// ignored, not re-reported.
	clock = now.Add(gceops.Retention + time.Hour)
	l.ops["us-central1-b"] = append(l.ops["us-central1-b"], preemptOp("5", "us-central1-b", "vm-5", clock))
	got, _ = p.Poll(ctxT(t))
	if len(got) != 1 || got[0].Instance != "us-central1-b/vm-5" {
		t.Errorf("poll after retention: %+v, want only vm-5", got)
	}
}

func TestStatusPolling(t *testing.T) {
	f := fakegce.New(fakegce.Options{})
	defer f.Close()
	ins := launch(t, f, "us-central1-a", "s1", "s2", "s3")
	cl, err := gceops.NewClients(ctxT(t), f.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	p := &gceops.Poller{
		Project: f.Project(), Lister: cl, Status: cl,
		Zones:   func() []string { return nil }, // status polling alone
		Watched: func() []string { return []string{ins[0].ID, ins[1].ID, ins[2].ID} },
	}
	if got, err := p.Poll(ctxT(t)); err != nil || len(got) != 0 {
		t.Fatalf("poll with all running: %+v, %v", got, err)
	}
	preempt(t, f, ins[0].ID)
	zone, name, _ := gcp.ParseInstanceID(ins[1].ID)
	f.Remove(zone, name)
	for i := range 3 {
		got, err := p.Poll(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			if len(got) != 0 {
				t.Errorf("poll %d repeated %+v", i, got)
			}
			continue
		}
		if len(got) != 2 || got[0].Instance != ins[0].ID || got[0].Kind != interruption.Preempted || got[0].Source != "gce-status" ||
			got[1].Instance != ins[1].ID || got[1].Kind != interruption.Lost {
			t.Fatalf("notices %+v, want %s preempted and %s lost", got, ins[0].ID, ins[1].ID)
		}
	}
}
