package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
)

// autoscaleSpec is a PyTorch DDP fleet of 2..4 local nodes sized by the
// goodput autoscaler. The example's simulated compute shrinks with the
// world size (--sample-time: a rank's share of the global batch), so
// throughput grows with the nodes; with TRAIN_SCALE_LIMIT=2 (the knob,
// docs/examples.md) a step beyond world size 2 lasts as long as at 2, so
// throughput stops growing there.
func autoscaleSpec(name, repo, ckpt string, port int, limit string) string {
	env := ""
	if limit != "" {
		env = fmt.Sprintf("env = { TRAIN_SCALE_LIMIT = %q }", limit)
	}
	return localFleet{name: name, sizes: `
  min_nodes = 2
  max_nodes = 4`, provider: `
    zones = ["local-a", "local-b"]`, training: fmt.Sprintf(`
    command        = [%q, "examples/pytorch/ddp_train.py", "--steps", "1000000", "--step-time", "0", "--sample-time", "0.006", "--timeout", "20"]
    workdir        = %q
    nproc_per_node = 1
    max_restarts   = 20
    master_port    = %d
    drain_grace    = "10s"
    checkpoint_uri = "file://%s"
    warm_start     = false # 8 idle interpreters would hold ~1 GiB for nothing here
    %s`, torchPython, repo, port, ckpt, env), rendezvous: `
    last_call  = "1s"
    heartbeat  = "1s"
    dead_after = "4s"`}.hcl()
}

// autoscaleDaemonConfig: sizes are judged after 3 s of measured
// throughput and changed at most every 2 s (defaults: 1 m and 3 m).
const autoscaleDaemonConfig = `
autoscale {
  measure_for  = "3s"
  min_interval = "2s"
}
`

// TestAutoscalerSettlesByThroughput is the autoscaler's acceptance test:
// real PyTorch DDP on local nodes, max_nodes 4, the workers reporting
// progress through FLEETD_PROGRESS. Each fleet starts at max_nodes, the
// autoscaler halves it to measure 2 nodes, and then
//   - "knee" (throughput stops scaling beyond 2 nodes) settles at 2 and
//     says why: 4 would add no throughput for 100% more cost;
//   - "linear" (the knob off) grows back to 4: the 2 extra nodes pay.
//
// Both say so in status, status -json, plan and /metrics, and the
// dashboard (headless Chromium) shows the knee fleet's throughput chart
// with its world-size change, the ETA and the explanation.
func TestAutoscalerSettlesByThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("real PyTorch training on local nodes")
	}
	if !haveTorch() {
		t.Skip("python3-torch not installed for /usr/bin/python3 (apt-get install python3-torch; .ci/run installs it)")
	}
	began := time.Now()
	bin := fleetdBinary(t)
	d, repo, dir := e2eDaemon(t, bin, autoscaleDaemonConfig)
	defer d.stop(t)
	specs := map[string]string{
		"knee":   autoscaleSpec("knee", repo, filepath.Join(dir, "ckpt-knee"), 29610, "2"),
		"linear": autoscaleSpec("linear", repo, filepath.Join(dir, "ckpt-linear"), 29710, ""),
	}
	for name, src := range specs {
		applySpec(t, d, bin, dir, name, src)
	}
	defer func() {
		if t.Failed() || os.Getenv("FLEETD_TEST_VERBOSE") != "" {
			out, _, _ := d.cli(t, bin, "events")
			t.Logf("events:\n%s", out)
			for name := range specs {
				out, _, _ = d.cli(t, bin, "status", name)
				t.Logf("status %s:\n%s", name, out)
			}
		}
	}()
	detail := func(name string) api.FleetDetail {
		var det api.FleetDetail
		if out, _, code := d.cli(t, bin, "status", "-json", name); code == 0 {
			_ = json.Unmarshal([]byte(out), &det)
		}
		return det
	}
	// settledAt: the fleet trains at world size n in a closed round, the
	// autoscaler's decision is a goodput one (not exploring, measuring or
	// holding) for n nodes, and the workers report from that round.
	settledAt := func(det api.FleetDetail, n int) bool {
		r, s, tr := det.Rendezvous, det.Scaling, det.Training
		return r != nil && s != nil && tr != nil && r.State == "closed" && r.WorldSize == n &&
			s.Reason == "goodput" && s.Target == n && tr.Source == "reports" && tr.Round == r.Round && tr.SamplesPerSecond > 0
	}
	var knee, linear api.FleetDetail
	var kneeAt, linearAt time.Duration
	waitUntil(t, "knee settled at 2 nodes and linear back at 4", 150*time.Second, func() bool {
		if kneeAt == 0 {
			if knee = detail("knee"); settledAt(knee, 2) {
				kneeAt = time.Since(began)
			}
		}
		if linearAt == 0 {
			if linear = detail("linear"); settledAt(linear, 4) && scaledTo(t, d, bin, "linear", 2) {
				linearAt = time.Since(began)
			}
		}
		return kneeAt > 0 && linearAt > 0
	})
	t.Logf("knee settled at 2 nodes after %s: %s", kneeAt.Round(time.Second), knee.Scaling.Explain)
	t.Logf("linear grew back to 4 nodes after %s: %s", linearAt.Round(time.Second), linear.Scaling.Explain)

	// The explanations: the knee's extra nodes buy nothing, the linear
	// fleet's pay.
	kneeWhy := regexp.MustCompile(`^2 nodes: [0-9.]+k? samples/s at \$0\.60/h; 4 would (add no throughput|add [0-9]% throughput|lose [0-9]+% throughput) for 100% more cost$`)
	if !kneeWhy.MatchString(knee.Scaling.Explain) {
		t.Errorf("knee's explanation %q does not match %s", knee.Scaling.Explain, kneeWhy)
	}
	linearWhy := regexp.MustCompile(`^4 nodes: [0-9.]+k? samples/s at \$1\.20/h \(max_nodes\); 2 would cost .* per sample and lose [0-9]+% throughput$`)
	if !linearWhy.MatchString(linear.Scaling.Explain) {
		t.Errorf("linear's explanation %q does not match %s", linear.Scaling.Explain, linearWhy)
	}
	x2, x4 := measured(knee, 2), measured(knee, 4)
	if x2 <= 0 || x4 <= 0 || x4 > 1.15*x2 {
		t.Errorf("knee measured %.0f samples/s at 2 nodes, %.0f at 4: the knob should keep 4 at 2's", x2, x4)
	}
	l2, l4 := measured(linear, 2), measured(linear, 4)
	if l2 <= 0 || l4 < 1.5*l2 {
		t.Errorf("linear measured %.0f samples/s at 2 nodes, %.0f at 4: want close to twice", l2, l4)
	}
	if knee.Training.TotalSteps != 1000000 || knee.Training.ETA == nil || knee.Training.Step <= 0 {
		t.Errorf("knee's training %+v: want steps, a total and an ETA", knee.Training)
	}

	// It stays settled: no flapping while it keeps measuring.
	time.Sleep(5 * time.Second)
	if k := detail("knee"); k.Scaling == nil || k.Scaling.Target != 2 || k.Rendezvous.WorldSize != 2 {
		t.Errorf("knee moved on: %+v", k.Scaling)
	}
	if l := detail("linear"); l.Scaling == nil || l.Scaling.Target != 4 {
		t.Errorf("linear moved on: %+v", l.Scaling)
	}

	// Humans see it in status, plan and the metrics.
	out, _, _ := d.cli(t, bin, "status", "knee")
	for _, want := range []string{"Size:           2 nodes: ", "4 would", "Training:       step ", "ETA "} {
		if !strings.Contains(out, want) {
			t.Errorf("status knee lacks %q:\n%s", want, out)
		}
	}
	out, _, _ = d.cli(t, bin, "plan", filepath.Join(dir, "knee.hcl"))
	for _, want := range []string{"size (scale = goodput, goodput): 2 nodes:", "model: y(N) = N/X(N) =", "NODES  SAMPLES/S"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan lacks %q:\n%s", want, out)
		}
	}
	metrics := httpGet(t, d, "/metrics")
	for _, want := range []string{`fleetd_training_samples_per_second{fleet="knee"}`, `fleetd_training_eta_seconds{fleet="knee"}`,
		`fleetd_target_nodes{fleet="knee"} 2`, `fleetd_autoscale_samples_per_second{fleet="linear",nodes="4",source="measured"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	requireChromium(t)
	checkDashboardProgress(t, d)
	t.Logf("whole test: %s", time.Since(began).Round(time.Second))
}

// scaledTo reports whether the fleet's event log has it scaled to n nodes.
func scaledTo(t *testing.T, d *devDaemon, bin, fleet string, n int) bool {
	for _, e := range fleetEvents(t, d, bin, fleet) {
		if e.Type == "fleet.scaled" && e.Data["to"] == fmt.Sprint(n) {
			return true
		}
	}
	return false
}

// fleetEvents is the fleet's event log as `fleetd events -json` prints
// it; nil when the command fails.
func fleetEvents(t *testing.T, d *devDaemon, bin, fleet string) []state.Event {
	out, _, code := d.cli(t, bin, "events", "-json", "-fleet", fleet)
	if code != 0 {
		return nil
	}
	var evs []state.Event
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var e state.Event
		if dec.Decode(&e) != nil {
			return evs
		}
		evs = append(evs, e)
	}
	return evs
}

// measured is the autoscaler's measured throughput at n nodes; 0 if none.
func measured(det api.FleetDetail, n int) float64 {
	if det.Scaling == nil {
		return 0
	}
	for _, o := range det.Scaling.Options {
		if o.Nodes == n && o.Measured {
			return o.SamplesPerSecond
		}
	}
	return 0
}

func httpGet(t *testing.T, d *devDaemon, path string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", d.addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// progressPage is what checkDashboardProgress reads from the page.
type progressPage struct {
	Selected      string `json:"selected"`
	Explain       string `json:"explain"`
	Reason        string `json:"reason"`
	Throughput    string `json:"throughput"`
	Step          string `json:"step"`
	ETA           string `json:"eta"`
	Points        int    `json:"points"`
	WorldChanges  int    `json:"world_changes"`
	FleetProgress string `json:"fleet_progress"`
	NodeRounds    []string
}

// readProgressPage selects the knee fleet (a click on its row) until it
// is the one shown, and reads the page.
const readProgressPage = `(() => {
  const $ = (id) => document.getElementById(id);
  const knee = document.querySelector('#fleets tbody tr[data-fleet="knee"]');
  if (knee && $('fleet-name').textContent !== 'knee') knee.click();
  const tp = $('chart-throughput');
  const row = document.querySelector('#fleets tbody tr.selected');
  return {
    selected: $('fleet-name').textContent,
    explain: $('scaling-explain').textContent,
    reason: $('scaling').getAttribute('data-reason') || '',
    throughput: $('kpi-throughput').textContent,
    step: $('kpi-step').textContent,
    eta: $('kpi-eta').textContent,
    points: Number(tp.getAttribute('data-points')),
    world_changes: Number(tp.getAttribute('data-world-changes')),
    fleet_progress: row ? row.querySelector('.fleet-progress').textContent : '',
    NodeRounds: Array.from(document.querySelectorAll('#nodes tbody tr[data-state="running"] .node-round')).map((c) => c.textContent),
  };
})()`

// checkDashboardProgress opens the dashboard in headless Chromium on the
// knee fleet and waits for its training progress: step, throughput and
// ETA, the size explanation, and the throughput chart with the world-size
// change from 4 to 2 marked; then saves a screenshot.
func checkDashboardProgress(t *testing.T, d *devDaemon) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	browser := openDashboard(t, ctx, d, 1500)
	var p progressPage
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := chromedp.Run(browser, chromedp.Evaluate[progressPage](readProgressPage))
		if err != nil {
			t.Fatalf("read page: %v", err)
		}
		p = s
		if p.Selected == "knee" && strings.HasPrefix(p.Explain, "2 nodes: ") && p.Reason == "goodput" && strings.HasSuffix(p.Throughput, "samples/s") &&
			strings.Contains(p.Step, "/ 1000000") && p.ETA != "–" && p.Points >= 3 && p.WorldChanges >= 1 &&
			strings.Contains(p.FleetProgress, "/s") && len(p.NodeRounds) == 2 && p.NodeRounds[0] != "–" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dashboard never showed the knee fleet's progress; last %+v", p)
		}
		time.Sleep(300 * time.Millisecond)
	}
	shot := filepath.Join(os.TempDir(), "fleetd-dashboard-progress.png")
	saveScreenshot(t, browser, shot)
	if dir := os.Getenv("FLEETD_SCREENSHOT_DIR"); dir != "" {
		if b, err := os.ReadFile(shot); err == nil {
			_ = os.WriteFile(filepath.Join(dir, filepath.Base(shot)), b, 0o644)
		}
	}
	t.Logf("dashboard: %+v; screenshot %s", p, shot)
}
