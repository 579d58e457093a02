package fleet

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec/spectest"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers/providertest"
)

const projectsConfig = `
max_gpus = 4
project "a" {
  quota_gpus = 2
  max_gpus   = 4
}
project "b" {
  quota_gpus = 2
}
`

// TestProjectsConfig: daemon.hcl's project blocks and max_gpus reach
// Config.Projects; a bad project is a positioned error.
func TestProjectsConfig(t *testing.T) {
	cfg, _, diags := ParseConfig("daemon.hcl", []byte("listen = \"127.0.0.1:0\"\n"+projectsConfig))
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	if cfg.Projects.Pool() != 4 || len(cfg.Projects.Projects) != 2 || cfg.Projects.Projects[0].MaxGPUs != 4 || cfg.Projects.Projects[1].MaxGPUs != 2 {
		t.Errorf("projects %+v", cfg.Projects)
	}
	cfg, _, diags = ParseConfig("daemon.hcl", []byte(projectsConfig+"allocation {\n  min_interval = \"2s\"\n  reserve_after = \"1h\"\n  fairness = 1\n}\n"))
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	if p := cfg.Allocation.Params(); p.MinInterval != 2*time.Second || p.ReserveAfter != time.Hour || p.Horizon != 0 || p.Fairness != 1 {
		t.Errorf("allocation block: %+v", p)
	}
	if m := mergeAllocation(allocator.Params{MinInterval: time.Millisecond}, cfg.Allocation.Params()); m.MinInterval != time.Millisecond || m.ReserveAfter != time.Hour || m.Fairness != 1 {
		t.Errorf("Options over the config: %+v", m)
	}
	if _, _, diags = ParseConfig("daemon.hcl", []byte("allocation {\n  horizon = \"soon\"\n}\n")); !diags.HasErrors() || !strings.Contains(diags.Error(), "horizon") {
		t.Errorf("bad horizon: %v, want an error naming it", diags)
	}
	if _, _, diags = ParseConfig("daemon.hcl", []byte("allocation {\n  fairness = -1\n}\n")); !diags.HasErrors() || !strings.Contains(diags.Error(), "fairness") {
		t.Errorf("negative fairness: %v, want an error naming it", diags)
	}
	_, _, diags = ParseConfig("daemon.hcl", []byte("project \"a\" {\n  quota_gpus = 8\n  max_gpus = 4\n}\n"))
	if !diags.HasErrors() || diags[0].Subject == nil || diags[0].Subject.Start.Line < 2 {
		t.Errorf("quota above max: %v, want a positioned error", diags)
	}
}

// projectsDaemon is a test daemon with projectsConfig's projects.
func projectsDaemon(t *testing.T) *testDaemon {
	t.Helper()
	cfg, _, diags := ParseConfig("daemon.hcl", []byte(projectsConfig))
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	mem := providertest.NewMemProvider()
	return launchTestDaemon(t, t.TempDir(), staticProviders{providertest.MemName: mem}, mem, Options{Config: cfg})
}

// TestApplyUnknownProject: plan and apply refuse a spec naming a project
// the daemon does not have, with the position of the project attribute.
func TestApplyUnknownProject(t *testing.T) {
	td := projectsDaemon(t)
	src := strings.Replace(memSpec, "min_nodes = 2", "project   = \"vison\"\n  min_nodes = 2", 1)
	for _, op := range []string{"plan", "apply"} {
		var err error
		if op == "plan" {
			_, err = td.client.Plan(context.Background(), api.ApplyRequest{Filename: "train.hcl", Source: src})
		} else {
			_, err = td.client.Apply(context.Background(), api.ApplyRequest{Filename: "train.hcl", Source: src})
		}
		var ae *api.HTTPError
		if !errors.As(err, &ae) || len(ae.Body.Diagnostics) == 0 {
			t.Fatalf("%s: %v, want diagnostics", op, err)
		}
		dg := ae.Body.Diagnostics[0]
		if dg.Filename != "train.hcl" || dg.Line != 3 || !strings.Contains(dg.Summary+dg.Detail, "vison") {
			t.Errorf("%s: diagnostic %+v, want train.hcl:3 naming the project", op, dg)
		}
	}
	ok := strings.Replace(memSpec, "min_nodes = 2", "project   = \"a\"\n  min_nodes = 2", 1)
	if _, err := td.client.Plan(context.Background(), api.ApplyRequest{Filename: "train.hcl", Source: ok}); err != nil {
		t.Errorf("plan naming project a: %v", err)
	}
}

// projectSpec is a 1-GPU fleet of the mem provider in project (none when
// ""), at desired nodes within [minN, 4], draining in 1s.
func projectSpec(name, project string, minN, desired int) string {
	return spectest.Fleet{Name: name, Project: project, Min: minN, Max: 4, Desired: desired, DrainGrace: "1s",
		LastCall: "200ms", Heartbeat: "20s", DeadAfter: "60s"}.HCL()
}

// running counts a fleet's running nodes, joining its booting ones to the
// rendezvous first (as their agents would).
func (td *testDaemon) running(t *testing.T, fleet string, joined map[string]bool) int {
	t.Helper()
	td.joinAll(t, fleet, joined)
	return countState(td.nodes(t, fleet), state.NodeRunning)
}

func liveCount(nodes []state.Node) int {
	n := 0
	for _, x := range nodes {
		if reconcile.Live(x.State) {
			n++
		}
	}
	return n
}

// TestProjectsReclaimAndQueue is the scenario on the in-memory
// provider: pool 4 GPUs of 1-GPU nodes; project a (quota 2, max 4) runs a
// fleet at 4; project b (quota 2) applies a fleet of min 2: a shrinks to
// 2, keeping its rank-0 node, and b runs; a second fleet of b's waits in
// the queue until the first is destroyed; when b has nothing left, a
// grows back to 4.
func TestProjectsReclaimAndQueue(t *testing.T) {
	cfg, _, diags := ParseConfig("daemon.hcl", []byte(projectsConfig))
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	mem := providertest.NewMemProvider()
	td := launchTestDaemon(t, t.TempDir(), staticProviders{providertest.MemName: mem}, mem,
		Options{Config: cfg, Allocation: allocator.Params{MinInterval: time.Millisecond}})
	ctx := context.Background()
	defer func() {
		if t.Failed() {
			dumpEvents(t, td)
		}
	}()
	apply := func(name, project string, minN, desired int) {
		t.Helper()
		td.apply(ctx, t, name+".hcl", projectSpec(name, project, minN, desired))
	}
	ja, jb, jc := map[string]bool{}, map[string]bool{}, map[string]bool{}
	apply("alpha", "a", 2, 4)
	waitFor(t, "alpha at 4 running", 20*time.Second, func() bool { return td.running(t, "alpha", ja) == 4 })

	// The node holding rank 0 in alpha's round.
	var rank0 string
	waitFor(t, "alpha's rank 0", 10*time.Second, func() bool {
		st, err := td.rdzv.rz().Status("alpha")
		if err != nil {
			return false
		}
		for _, m := range st.Members {
			if m.GroupRank != nil && *m.GroupRank == 0 {
				rank0 = m.NodeID
			}
		}
		return rank0 != ""
	})

	// The pool holds 4 GPUs: bravo's nodes wait until alpha's reclaimed
	// ones are gone (they drain for up to drain_grace), so the provider
	// never holds more than 4 instances.
	peak := watchPeak(t, mem.Live)
	apply("bravo", "b", 2, 2)
	waiting := ""
	waitFor(t, "alpha reclaimed to 2 and bravo at 2", 30*time.Second, func() bool {
		if s, err := td.client.Fleet(ctx, "bravo"); err == nil && s.Allocation != nil && s.Allocation.Waiting != "" {
			waiting = s.Allocation.Waiting
		}
		return liveCount(td.nodes(t, "alpha")) == 2 && td.running(t, "alpha", ja) == 2 && td.running(t, "bravo", jb) == 2
	})
	if n := peak(); n > 4 {
		t.Errorf("the provider held %d instances during the reclaim, above the pool's 4 GPUs", n)
	}
	if !strings.Contains(waiting, "alpha") {
		t.Errorf("bravo's allocation never said it waits for alpha's draining nodes (last: %q)", waiting)
	}
	for _, n := range td.nodes(t, "alpha") {
		if n.ID == rank0 && !reconcile.Live(n.State) {
			t.Fatalf("alpha's rank-0 node %s was drained (%s)", rank0, n.State)
		}
	}
	// The reclaim is a resize the allocator remembers (persisted): it
	// prices alpha's next one over a shorter expected hold.
	var resized int
	waitFor(t, "alpha's resize counted", 10*time.Second, func() bool {
		resized = readRuntime(t, td, "alpha").Alloc.Resizes
		return resized >= 1
	})
	sum, err := td.client.Fleet(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if al := sum.Allocation; al == nil || al.Target != 2 || al.Reason == "" {
		t.Fatalf("alpha's allocation %+v, want target 2 with a reason", al)
	}
	evs, err := td.client.Events(ctx, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	reclaimed := false
	for _, e := range evs.Events {
		reclaimed = reclaimed || e.Type == "fleet.allocated" && e.Fleet == "alpha" && e.Data["to"] == "2" && strings.Contains(e.Message, "project b takes back")
	}
	if !reclaimed {
		t.Error("no fleet.allocated event says why alpha went 4→2")
	}

	// A second fleet of b's cannot get its min_nodes: it queues.
	apply("charlie", "b", 2, 2)
	waitFor(t, "charlie queued", 10*time.Second, func() bool {
		q, err := td.client.Queue(ctx)
		return err == nil && len(q.Queue) == 1 && q.Queue[0].Fleet == "charlie" && q.Queue[0].Position == 1 && q.Queue[0].Reason != ""
	})
	time.Sleep(500 * time.Millisecond)
	if n := liveCount(td.nodes(t, "charlie")); n != 0 {
		t.Fatalf("queued fleet charlie has %d live nodes", n)
	}
	ps, err := td.client.Projects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pb api.Project
	for _, p := range ps.Projects {
		if p.Name == "b" {
			pb = p
		}
	}
	if pb.Queued != 1 || pb.UsedGPUs != 2 || ps.PoolGPUs != 4 {
		t.Fatalf("projects %+v, want b using 2 with 1 queued in a pool of 4", ps)
	}
	_, mfs := scrape(t, td, td.Token())
	for _, m := range []struct {
		name, project string
		want          float64
	}{{"fleetd_project_quota_gpus", "a", 2}, {"fleetd_project_used_gpus", "b", 2}, {"fleetd_project_queued_fleets", "b", 1}, {"fleetd_project_max_gpus", "a", 4}} {
		got := series(mfs, m.name, map[string]string{"project": m.project})
		if len(got) != 1 || got[0].GetGauge().GetValue() != m.want {
			t.Errorf("%s{project=%q} = %v, want %v", m.name, m.project, got, m.want)
		}
	}
	if q := series(mfs, "fleetd_queue_length", nil); len(q) != 1 || q[0].GetGauge().GetValue() != 1 {
		t.Errorf("fleetd_queue_length = %v, want 1", q)
	}
	if sp := series(mfs, "fleetd_project_spend_usd", map[string]string{"project": "a"}); len(sp) != 1 || sp[0].GetGauge().GetValue() <= 0 {
		t.Errorf("fleetd_project_spend_usd{project=a} = %v, want > 0", sp)
	}

	// bravo ends: charlie starts in b's quota once bravo's nodes are
	// gone (a destroyed fleet's draining nodes hold their GPUs too);
	// alpha stays at 2.
	peak = watchPeak(t, mem.Live)
	if _, err := td.client.Destroy(ctx, "bravo"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "charlie running at 2", 30*time.Second, func() bool { return td.running(t, "charlie", jc) == 2 })
	if n := peak(); n > 4 {
		t.Errorf("the provider held %d instances while bravo was destroyed and charlie started, above the pool's 4 GPUs", n)
	}
	if q, err := td.client.Queue(ctx); err != nil || len(q.Queue) != 0 {
		t.Fatalf("queue after charlie started: %+v %v", q, err)
	}
	if n := liveCount(td.nodes(t, "alpha")); n != 2 {
		t.Fatalf("alpha at %d while b uses its quota, want 2", n)
	}

	// b has nothing left: alpha borrows back up to 4.
	if _, err := td.client.Destroy(ctx, "charlie"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "alpha back at 4", 30*time.Second, func() bool { return td.running(t, "alpha", ja) == 4 })
	waitFor(t, "alpha's growth counted", 10*time.Second, func() bool { return readRuntime(t, td, "alpha").Alloc.Resizes > resized })
}

// watchPeak samples count every few milliseconds until the returned
// function is called, which gives the largest value seen.
func watchPeak(t *testing.T, count func() int) func() int {
	t.Helper()
	stop, done := make(chan struct{}), make(chan int)
	go func() {
		peak := count()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- max(peak, count())
				return
			case <-tick.C:
				peak = max(peak, count())
			}
		}
	}()
	var once sync.Once
	var got int
	stopAndGet := func() int {
		once.Do(func() { close(stop); got = <-done })
		return got
	}
	t.Cleanup(func() { stopAndGet() })
	return stopAndGet
}

// memDaemon is a test daemon on the in-memory provider without projects
// that prints its events if the test fails.
func memDaemon(t *testing.T) *testDaemon {
	t.Helper()
	mem := providertest.NewMemProvider()
	td := launchTestDaemon(t, t.TempDir(), staticProviders{providertest.MemName: mem}, mem, Options{})
	t.Cleanup(func() {
		if t.Failed() {
			dumpEvents(t, td)
		}
	})
	return td
}

// TestBudgetPauseAndResume: a fleet whose spend reaches its budget's
// total pauses (every node drained, the fleet kept), and runs again once
// resumed with a raised budget. No project is declared: a fleet's own
// budget is enforced in the default project too.
func TestBudgetPauseAndResume(t *testing.T) {
	td := memDaemon(t)
	ctx := context.Background()
	withBudget := func(total string) string {
		return strings.Replace(projectSpec("delta", "default", 2, 2), "  node {", "  budget {\n    total = "+total+"\n  }\n  node {", 1)
	}
	// Two 1-GPU nodes cost about $0.4/h: $0.0001 is gone within a second.
	td.apply(ctx, t, "delta.hcl", withBudget("0.0001"))
	joined := map[string]bool{}
	waitFor(t, "delta paused with no live node", 30*time.Second, func() bool {
		td.joinAll(t, "delta", joined)
		s, err := td.client.Fleet(ctx, "delta")
		return err == nil && s.Allocation != nil && s.Allocation.Action == string(allocator.Paused) && liveCount(td.nodes(t, "delta")) == 0
	})
	evs, err := td.client.Events(ctx, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range evs.Events {
		seen[e.Type] = true
	}
	for _, typ := range []string{"budget.exhausted", "fleet.paused"} {
		if !seen[typ] {
			t.Errorf("no %s event", typ)
		}
	}
	s, err := td.client.Fleet(ctx, "delta")
	if err != nil || s.Destroying || s.Allocation.Kind == "" || !strings.Contains(s.Allocation.Reason, "budget") {
		t.Fatalf("paused fleet: %+v %v, want kept with the budget as the reason", s.Allocation, err)
	}

	// Resumed with its budget raised: it runs again.
	td.apply(ctx, t, "delta.hcl", withBudget("1000"))
	if err := td.client.Resume(ctx, "delta"); err != nil {
		var he *api.HTTPError
		// The raised budget may have un-paused it first: then it is not paused.
		if !errors.As(err, &he) || he.StatusCode != 409 {
			t.Fatalf("resume: %v", err)
		}
	}
	waitFor(t, "delta running again", 30*time.Second, func() bool { return td.running(t, "delta", joined) == 2 })
	if err := td.client.Resume(ctx, "nope"); err == nil {
		t.Error("resume of an unknown fleet succeeded")
	}
}

// TestBudgetStop: on_exhausted = "stop" ends the fleet: its nodes drain,
// then it is marked completed (not succeeded, "stopped: …"), leaves the
// allocation, and stays stopped.
func TestBudgetStop(t *testing.T) {
	td := memDaemon(t)
	ctx := context.Background()
	src := strings.Replace(projectSpec("echo", "default", 2, 2), "  node {", "  budget {\n    total        = 0.0001\n    on_exhausted = \"stop\"\n  }\n  node {", 1)
	td.apply(ctx, t, "echo.hcl", src)
	joined := map[string]bool{}
	var s api.FleetDetail
	waitFor(t, "echo stopped", 30*time.Second, func() bool {
		td.joinAll(t, "echo", joined)
		var err error
		s, err = td.client.Fleet(ctx, "echo")
		return err == nil && s.Completed && s.Allocation == nil
	})
	time.Sleep(300 * time.Millisecond) // passes after the stop start nothing
	if s.Succeeded || !strings.HasPrefix(s.CompletedDetail, "stopped: ") || !strings.Contains(s.CompletedDetail, "budget") || s.Allocation != nil {
		t.Errorf("stopped fleet: succeeded %v, detail %q, allocation %+v", s.Succeeded, s.CompletedDetail, s.Allocation)
	}
	for _, n := range td.nodes(t, "echo") {
		if n.State != state.NodeTerminated && n.State != state.NodeFailed {
			t.Errorf("node %s is %s after the stop", n.ID, n.State)
		}
	}
	evs, err := td.client.Events(ctx, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, e := range evs.Events {
		seen[e.Type]++
	}
	if seen["fleet.stopping"] != 1 || seen["fleet.stopped"] != 1 || seen["fleet.paused"] != 0 {
		t.Errorf("events %v: want one fleet.stopping and one fleet.stopped, no pause", seen)
	}
	if err := td.client.Resume(ctx, "echo"); err == nil {
		t.Error("a stopped fleet was resumed")
	}
}
