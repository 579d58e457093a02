package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleetd/bench/internal/report"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// Reconcile-scale targets.
const (
	passTargetMS    = 50
	rssTargetMiB    = 200
	stormTargetSecs = 5
)

// benchReconcile builds a fleet of n running nodes in a real daemon and
// measures one reconcile pass, the daemon's resident memory and an
// interruption storm.
func benchReconcile(ctx context.Context, r *report.Reporter, p params) error {
	n := p.Nodes
	name := fmt.Sprintf("reconcile.%d", n)
	dir, ctx, done, err := scratch(ctx, "reconcile", 4*time.Minute)
	if err != nil {
		return err
	}
	defer done()

	// The n nodes have no agents (like the sim provider's): dead_after is
	// raised to 10 min so that the daemon's heartbeat-loss detection (a
	// running node out of the rendezvous for 3 × dead_after becomes a
	// "lost" notice) leaves them alone for the few minutes of the run. The
	// rendezvous side of scale is the rendezvous benchmark.
	bd, err := newBenchDaemon(ctx, filepath.Join(dir, "data"), "big", n, state.NodeRunning, 10*time.Minute)
	if err != nil {
		return err
	}
	defer bd.stop()

	// 1. The pure pass: reconcile.Reconcile over exactly what the daemon
	// observes (spec, node records, a provider List, offerings).
	in, err := reconcileInput(ctx, bd)
	if err != nil {
		return err
	}
	var durs []time.Duration
	var plan reconcile.Plan
	for range 15 {
		start := time.Now()
		plan = reconcile.Reconcile(in)
		durs = append(durs, time.Since(start))
	}
	fmt.Printf("%s: pure pass over %d nodes, %d instances: %d actions; min %.1fms median %.1fms max %.1fms\n", name, len(in.Nodes), len(in.Instances),
		len(plan.Actions), ms(report.Quantile(durs, 0)), ms(report.Quantile(durs, 0.5)), ms(report.Quantile(durs, 1)))
	r.Check(name+".pass_pure_median", ms(report.Quantile(durs, 0.5)), "ms", report.Less, passTargetMS)

	// 2. The daemon's own pass (provider List of n instances, state read,
	// rendezvous view, plan, execute, accounting write), from /metrics.
	if err := bd.start(ctx); err != nil {
		return err
	}
	mean, err := daemonPasses(ctx, bd, name, p.DaemonPasses, 30*time.Second)
	if err != nil {
		return err
	}
	r.Check(name+".pass_daemon_mean", mean, "ms", report.Less, passTargetMS)

	// 3. Resident memory of the process (daemon + the in-memory "cloud"
	// holding n instances + this harness), after a GC.
	runtime.GC()
	debug.FreeOSMemory()
	rss, err := report.RSS()
	if err != nil {
		return err
	}
	var mst runtime.MemStats
	runtime.ReadMemStats(&mst)
	fmt.Printf("%s: Go heap in use %.1f MiB\n", name, float64(mst.HeapInuse)/(1<<20))
	r.Check(name+".rss", float64(rss)/(1<<20), "MiB", report.Less, rssTargetMiB)

	// 4. Interruption storm.
	return storm(ctx, r, bd, name, p)
}

// daemonPasses measures the running daemon's own reconcile passes over
// window and returns their mean in ms. Passes run on the 2 s tick.
// /metrics is read twice only: its fleet collector reads state too, and
// must not weigh on the passes.
func daemonPasses(ctx context.Context, bd *benchDaemon, name string, window, firstWithin time.Duration) (float64, error) {
	first, err := waitPasses(ctx, bd, 2, firstWithin)
	if err != nil {
		return 0, err
	}
	time.Sleep(window)
	last, err := bd.reconcileStats(ctx, "0.05")
	if err != nil {
		return 0, err
	}
	passes := last.Count - first.Count
	if passes < 1 {
		return 0, fmt.Errorf("the daemon made no reconcile pass in %s", window)
	}
	mean := (last.Sum - first.Sum) / passes * 1000
	fmt.Printf("%s: daemon passes: %.0f measured, mean %.1fms, %.0f of them ≤ 50ms\n", name, passes, mean, last.UnderLE-first.UnderLE)
	return mean, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// reconcileInput assembles a reconcile.Input the way the daemon does.
func reconcileInput(ctx context.Context, bd *benchDaemon) (reconcile.Input, error) {
	var f state.Fleet
	var nodes []state.Node
	err := bd.Store().View(ctx, func(tx state.Tx) error {
		var err error
		if f, err = tx.Fleet(bd.fleet); err != nil {
			return err
		}
		nodes, err = tx.Nodes(bd.fleet)
		return err
	})
	if err != nil {
		return reconcile.Input{}, err
	}
	file, diags := spec.Parse(f.Filename, f.Source, spec.Options{Schema: func(name string) (providers.ConfigSchema, bool) {
		return providertest.MemSchema, name == providertest.MemName
	}})
	if diags.HasErrors() {
		return reconcile.Input{}, fmt.Errorf("spec: %s", diags.Error())
	}
	fl := file.Fleets[0]
	pcfg := providers.Config{Fleet: bd.fleet, Raw: fl.Providers[0].Config}
	insts, err := bd.mem.List(ctx, pcfg, map[string]string{providers.TagFleet: bd.fleet})
	if err != nil {
		return reconcile.Input{}, err
	}
	offs, err := bd.mem.Offerings(ctx, pcfg)
	if err != nil {
		return reconcile.Input{}, err
	}
	joined := map[string]bool{}
	for _, n := range nodes {
		joined[n.ID] = n.State == state.NodeRunning || n.State == state.NodeJoined
	}
	now := time.Now()
	return reconcile.Input{Fleet: fl, Name: f.Name, Generation: f.Generation, DaemonID: bd.DaemonID(), Nodes: nodes,
		Instances: insts, ObservedOK: map[string]bool{providertest.MemName: true}, Offerings: offs,
		Records: map[string]state.OfferingRecord{}, Joined: joined, InRound: map[string]bool{}, Now: now, StartedAt: now.Add(-time.Hour)}, nil
}

// waitPasses waits until the daemon has made at least count passes.
func waitPasses(ctx context.Context, bd *benchDaemon, count float64, timeout time.Duration) (reconcileStats, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, err := bd.reconcileStats(ctx, "0.05")
		if err == nil && st.Count >= count {
			return st, nil
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("daemon made %.0f reconcile passes, waited for %.0f (%v)", st.Count, count, err)
		}
		time.Sleep(time.Second)
	}
}

// storm posts p.StormNotices spot notices, evenly over p.StormSpread, the way
// agents report them (POST /v1/agent/{fleet}/{node}/notice, node token),
// and measures when the daemon asked the provider for each replacement.
// Replacements are matched to notices in order (the k-th Create answers
// the k-th notice): the lag is how far launches trail notices.
func storm(ctx context.Context, r *report.Reporter, bd *benchDaemon, name string, p params) error {
	stormNotices := p.StormNotices
	baseline := time.Now()
	sent := make([]time.Time, stormNotices)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	// 25 notices every 100 ms: timer granularity on a loaded machine
	// would stretch 500 individual 4 ms sleeps well beyond 2 s.
	const perTick = 25
	tick := p.StormSpread / time.Duration(max(stormNotices/perTick, 1))
	for i := range stormNotices {
		if i%perTick == 0 {
			time.Sleep(time.Until(baseline.Add(time.Duration(i/perTick) * tick)))
		}
		node := bd.nodeID(i)
		sent[i] = time.Now()
		wg.Go(func() {
			if err := postNotice(ctx, bd, node); err != nil {
				mu.Lock()
				failures = append(failures, err.Error())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		return fmt.Errorf("%d notices failed, first: %s", len(failures), failures[0])
	}
	fmt.Printf("%s: storm: %d notices sent over %.2fs, all answered after %.2fs\n", name, stormNotices, sent[len(sent)-1].Sub(baseline).Seconds(), time.Since(baseline).Seconds())
	deadline := time.Now().Add(p.StormWait)
	var creates []launchRecord
	for {
		creates = bd.mem.Creates(baseline)
		if len(creates) >= stormNotices || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	sort.Slice(creates, func(i, j int) bool { return creates[i].At.Before(creates[j].At) })
	var lags []time.Duration
	within := 0
	for k := range min(len(creates), stormNotices) {
		lag := creates[k].At.Sub(sent[k])
		lags = append(lags, lag)
		if lag <= stormTargetSecs*time.Second {
			within++
		}
	}
	fmt.Printf("%s: storm: %d of %d replacements requested; %d within %ds of their notice; lag p50 %.2fs\n", name, len(creates), stormNotices,
		within, stormTargetSecs, report.Quantile(lags, 0.5).Seconds())
	if len(creates) < stormNotices {
		bd.diagnose(ctx, name)
		if counts, err := bd.countStates(ctx); err == nil {
			fmt.Printf("%s: nodes by state: %v\n", name, counts)
		}
		r.Missing(name+".storm_notice_to_replacement_max", "s", report.AtMost, stormTargetSecs,
			fmt.Sprintf("only %d of %d replacements requested within %s (the %d-th %.1f s after its notice)", len(creates), stormNotices, p.StormWait, len(creates), lastLag(lags)))
		return nil
	}
	r.Check(name+".storm_notice_to_replacement_max", report.Quantile(lags, 1).Seconds(), "s", report.AtMost, stormTargetSecs)
	for _, l := range bd.warns.Lines() {
		fmt.Printf("%s: daemon log: %s\n", name, l)
	}
	return nil
}

func postNotice(ctx context.Context, bd *benchDaemon, node string) error {
	body, _ := json.Marshal(api.NoticeRequest{Kind: "spot-interruption", Deadline: time.Now().Add(2 * time.Minute), Source: "imds"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, bd.URL()+"/v1/agent/"+bd.fleet+"/"+node+"/notice", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+bd.NodeToken(bd.fleet, node))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("notice %s: HTTP %d", node, resp.StatusCode)
	}
	return nil
}

func lastLag(lags []time.Duration) float64 {
	if len(lags) == 0 {
		return 0
	}
	return lags[len(lags)-1].Seconds()
}
