package fleet

import (
	"context"
	"math"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/stats"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers/providertest"
	"github.com/fleetd/fleetd/rendezvous"
)

// autoscaleSpec is the daemon tests' fleet with room to grow to 4.
var autoscaleSpec = strings.Replace(memSpec, "max_nodes = 3", "max_nodes = 4", 1)

// reporter plays the workers' progress reports: the rank-0 node of the
// current closed round heartbeats with the round's progress at the
// throughput rate(nodes), as an agent forwards FLEETD_PROGRESS.
type reporter struct {
	td    *testDaemon
	fleet string
	rate  func(nodes int) float64

	mu      sync.Mutex
	step    int64
	rewind  int64 // the next round resumes this many steps back
	started map[int]time.Time
	first   map[int]int64
}

func (r *reporter) run(ctx context.Context, t *testing.T) {
	for ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		st, err := r.td.rdzv.rz().Status(r.fleet)
		if err != nil || st.State != rendezvous.RoundClosed || len(st.Members) == 0 || st.Members[0].GroupRank == nil {
			continue
		}
		r.mu.Lock()
		start, ok := r.started[st.Round]
		if !ok {
			start = time.Now()
			r.started[st.Round] = start
			r.step -= r.rewind
			r.rewind = 0
			r.first[st.Round] = r.step
		}
		el := time.Since(start)
		x := r.rate(st.Nodes)
		r.step += 1
		p := &rendezvous.Progress{Round: st.Round, Nodes: st.Nodes, WorldSize: st.WorldSize, Step: r.step, Samples: float64(r.step) * 64,
			TotalSteps: 100000, FirstStep: r.first[st.Round], FirstAgeMS: el.Milliseconds(), Reports: 2 + int(el/(100*time.Millisecond)),
			SamplesPerSec: x, StepsPerSec: x / 64, RateSeconds: el.Seconds()}
		r.mu.Unlock()
		node := st.Members[0].NodeID
		c := rendezvous.NewClient(r.td.URL(), r.td.NodeToken(r.fleet, node), nil)
		_, _ = c.Heartbeat(ctx, r.fleet, rendezvous.HeartbeatRequest{NodeID: node, Round: st.Round, Workers: "running", Progress: p})
	}
}

// TestDaemonAutoscalerSizesByReports runs the autoscaler in a real daemon
// with agents played by the test: a job whose throughput is flat beyond 2
// nodes starts at max_nodes (4), is tried at 2 and stays there, saying
// why; status JSON, the node view and the metrics show its progress; a
// notice then measures when the workers train again and what it lost.
func TestDaemonAutoscalerSizesByReports(t *testing.T) {
	mem := providertest.NewMemProvider()
	dataDir := t.TempDir()
	opts := Options{Autoscale: autoscale.Params{MeasureFor: 1500 * time.Millisecond, MinInterval: 200 * time.Millisecond}}
	td := launchTestDaemon(t, dataDir, staticProviders{providertest.MemName: mem}, mem, opts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	td.apply(ctx, t, "train.hcl", autoscaleSpec)
	joined := map[string]bool{}
	waitFor(t, "4 booting nodes (max_nodes before any report)", 10*time.Second, func() bool {
		td.joinAll(t, "train", joined)
		return len(joined) == 4
	})
	r := &reporter{td: td, fleet: "train", rate: func(n int) float64 { return 100 * float64(min(n, 2)) },
		started: map[int]time.Time{}, first: map[int]int64{}}
	go r.run(ctx, t)

	var det api.FleetDetail
	waitFor(t, "settled at 2 nodes", 30*time.Second, func() bool {
		var err error
		det, err = td.client.Fleet(ctx, "train")
		if err != nil || det.Scaling == nil || det.Rendezvous == nil {
			return false
		}
		return det.Scaling.Reason == "goodput" && det.Scaling.Target == 2 && det.Rendezvous.WorldSize == 2
	})
	// 4 nodes measured the same throughput; they lose a little to the
	// interruptions a larger gang expects.
	if !regexp.MustCompile(`^2 nodes: 200 samples/s at \$0\.\d\d/h; 4 would (add no|lose \d%) throughput for 100% more cost$`).MatchString(det.Scaling.Explain) {
		t.Errorf("explanation %q", det.Scaling.Explain)
	}
	if det.TargetNodes != 2 || det.Scaling.Policy != "goodput" || det.Scaling.Model == nil || len(det.Scaling.Options) != 3 {
		t.Errorf("target %d, scaling %+v", det.TargetNodes, det.Scaling)
	}
	tr := det.Training
	if tr == nil || tr.Source != "reports" || tr.SamplesPerSecond != 200 || tr.WorldSize != 2 || tr.TotalSteps != 100000 || tr.ETA == nil || len(tr.History) < 2 {
		t.Fatalf("training %+v", tr)
	}
	// The nodes of the running round show it, with their last heartbeat.
	inRound := 0
	for _, n := range det.Nodes {
		if n.RendezvousState == "assigned" && n.Round == int64(det.Rendezvous.Round) && n.LastHeartbeat != nil {
			inRound++
		}
	}
	if inRound != 2 {
		t.Errorf("%d nodes show the closed round %d: %+v", inRound, det.Rendezvous.Round, det.Nodes)
	}
	// The summary carries the compact view, the events the change.
	st, err := td.client.Status(ctx)
	if err != nil || len(st.Fleets) != 1 || st.Fleets[0].Scaling == nil || st.Fleets[0].Scaling.Options != nil || st.Fleets[0].Training.History != nil {
		t.Errorf("status summary: %+v %v", st.Fleets, err)
	}
	evs, err := td.client.Events(ctx, 0, 1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	var scaled []string
	for _, e := range evs.Events {
		if e.Type == "fleet.scaled" {
			scaled = append(scaled, e.Data["from"]+"→"+e.Data["to"])
		}
	}
	if len(scaled) == 0 || scaled[0] != "4→2" {
		t.Errorf("fleet.scaled events %v, want 4→2 first", scaled)
	}

	// A notice on a node of the running round: the survivors' round is
	// re-formed and, once the replacement joined, the workers report again
	// from 50 steps back.
	var victim string
	for _, n := range det.Nodes {
		if n.RendezvousState == "assigned" {
			victim = n.ID
		}
	}
	r.mu.Lock()
	r.rewind = 50
	r.mu.Unlock()
	if err := td.ctrl.HandleNotice(ctx, "train", interruption.Notice{Node: victim, Kind: interruption.SpotInterruption, Source: "test"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for resumed := false; !resumed; {
		td.joinAll(t, "train", joined)
		for _, rec := range td.stats.Recoveries("train") {
			// The daemon knows the last step it saw: a report or two behind.
			if rec.Kind == stats.RecoveryTrainingResumed && rec.LostSteps != nil && *rec.LostSteps >= 40 && *rec.LostSteps <= 50 {
				resumed = true
			}
		}
		if time.Now().After(deadline) {
			st, _ := td.rdzv.rz().Status("train")
			var lost []int64
			for _, rec := range td.stats.Recoveries("train") {
				if rec.LostSteps != nil {
					lost = append(lost, *rec.LostSteps)
				}
			}
			t.Fatalf("the workers' return was not measured: lost steps %v, recoveries %+v; rendezvous round %d %s, %d members; nodes %+v",
				lost, td.stats.Recoveries("train"), st.Round, st.State, len(st.Members), td.nodes(t, "train"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	kinds := map[string]bool{}
	for _, rec := range td.stats.Recoveries("train") {
		kinds[rec.Kind] = true
	}
	if !kinds[stats.RecoveryRoundReformed] {
		t.Errorf("recoveries %+v: want round-reformed too", td.stats.Recoveries("train"))
	}

	// The metrics.
	code, mfs := scrape(t, td, td.Token())
	if code != 200 {
		t.Fatalf("/metrics: HTTP %d", code)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"fleetd_training_samples_per_second", map[string]string{"fleet": "train"}, 200},
		{"fleetd_training_total_steps", map[string]string{"fleet": "train"}, 100000},
		{"fleetd_target_nodes", map[string]string{"fleet": "train"}, 2},
		{"fleetd_autoscale_samples_per_second", map[string]string{"fleet": "train", "nodes": "4", "source": "measured"}, 200},
	} {
		ms := series(mfs, c.name, c.labels)
		if len(ms) != 1 || math.Abs(ms[0].GetGauge().GetValue()-c.want) > 1e-6*c.want {
			t.Errorf("%s%v: %v, want %g", c.name, c.labels, ms, c.want)
		}
	}
	if ms := series(mfs, "fleetd_recovery_duration_seconds", map[string]string{"fleet": "train", "kind": stats.RecoveryTrainingResumed}); len(ms) != 1 || ms[0].GetHistogram().GetSampleCount() != 1 {
		t.Errorf("training-resumed recoveries in /metrics: %v", ms)
	}

	// What was measured survives a restart (the fleet's runtime in the
	// state store): the new daemon knows both sizes and keeps 2 nodes.
	cancel()
	td.stop()
	td2 := launchTestDaemon(t, dataDir, staticProviders{providertest.MemName: mem}, mem, opts)
	rt := td2.ctrl.Runtime("train")
	sizes := map[int]bool{}
	if rt.Training != nil {
		for _, o := range rt.Training.History {
			sizes[o.Nodes] = true
		}
	}
	if !sizes[2] || !sizes[4] || rt.Scale.Target != 2 {
		t.Errorf("after a restart: sizes %v, target %d; want 2 and 4 measured, target 2", sizes, rt.Scale.Target)
	}
}
