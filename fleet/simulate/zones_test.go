package simulate

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers/sim"
)

// handMadeTrace writes a three-zone trace with 5-minute ticks: two cheap
// zones ($1.00, $1.005) whose capacity is preempted every few hours
// (heavy-tailed up-runs of 5 h mean, 5–20 min gaps) and a zone 6 %
// dearer whose capacity stays up for days (150 h mean).
func handMadeTrace(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(42, 19))
	const ticks = 21 * 24 * 12
	series := func(meanUpH float64, gapLo, gapHi int) string {
		var b strings.Builder
		b.WriteString("availability\n")
		for n := 0; n < ticks; {
			// Lomax (Pareto II) of shape 3: a heavy tail, as measured spot
			// up-runs have (docs/placement.md).
			up := 2 * meanUpH * (math.Pow(1-rng.Float64(), -1.0/3) - 1)
			for k := max(int(up*12), 1); k > 0 && n < ticks; k, n = k-1, n+1 {
				b.WriteString("1\n")
			}
			for k := gapLo + rng.IntN(gapHi-gapLo+1); k > 0 && n < ticks; k, n = k-1, n+1 {
				b.WriteString("0\n")
			}
		}
		return b.String()
	}
	files := map[string]string{"cheap/a.csv": series(5, 1, 4), "cheap/b.csv": series(5, 1, 4), "stable.csv": series(150, 1, 2)}
	for name, rows := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(rows), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Series in a subdirectory, named by the manifest.
	manifest := `{"name": "hand-made", "tick": "5m", "start": "2024-01-01T00:00:00Z",
	  "defaults": {"gpus": 1, "gpu_type": "V100", "on_demand_price": 3.06},
	  "series": [
	    {"file": "cheap/a.csv", "zone": "x-1a", "spot_price": 1.00},
	    {"file": "cheap/b.csv", "zone": "x-1b", "spot_price": 1.005},
	    {"file": "stable.csv", "zone": "y-1a", "spot_price": 1.06}]}`
	if err := os.WriteFile(filepath.Join(dir, sim.ManifestFile), []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runHandMade runs pols over 20 windows (seed 7) of the hand-made trace
// in dir and returns their summaries, in order, and every run.
func runHandMade(t *testing.T, dir string, tr *sim.Trace, pols []Policy, job Job, warm bool) ([]Summary, []Result) {
	t.Helper()
	s := &Setup{Trace: tr, Fleet: testFleet(t, map[string]any{"trace": dir, "cloud": "aws"}), Seed: 7, Windows: 20,
		Job: job, Policies: pols, Warm: warm}
	if err := s.Prepare(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return Summarize(pols, len(s.market.Offers), res), res
}

// TestZoneChoiceOnHandMadeTrace: fleetd's zone choice against the
// baselines' cheapest-zone choice on a cheap-but-flaky vs dear-but-stable
// market. A long job with little slack goes to the stable zone and costs
// far less than greedy (whose changeovers eat the slack and end on
// on-demand); a short job stays on the cheap zones, where it belongs.
// Both from the prior and from a warm history (what a long-running
// deployment knows).
func TestZoneChoiceOnHandMadeTrace(t *testing.T) {
	dir := handMadeTrace(t)
	tr, err := sim.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	pols, err := SelectPolicies([]string{"fleetd", "greedy"})
	if err != nil {
		t.Fatal(err)
	}
	for _, warm := range []bool{false, true} {
		for _, job := range []Job{{Work: 40 * time.Hour, Deadline: 42 * time.Hour}, {Work: 2 * time.Hour, Deadline: 4 * time.Hour}} {
			t.Run(fmt.Sprintf("warm=%v work=%s", warm, job.Work), func(t *testing.T) {
				sum, res := runHandMade(t, dir, tr, pols, job, warm)
				fl, gr := sum[0], sum[1]
				t.Logf("fleetd $%.2f (%.2f preemptions, %.1f h on-demand); greedy $%.2f (%.2f preemptions, %.1f h on-demand)",
					fl.MeanCost, fl.Preemptions, fl.OnDemandHours, gr.MeanCost, gr.Preemptions, gr.OnDemandHours)
				if fl.Misses+gr.Misses > 0 {
					t.Fatalf("misses: fleetd %d, greedy %d", fl.Misses, gr.Misses)
				}
				spotPrice := 0.0
				for _, r := range res {
					if r.Policy == "fleetd" {
						spotPrice += r.SpotCost / r.SpotHours / float64(len(res)/2)
					}
				}
				if job.Work > 10*time.Hour {
					if fl.MeanCost >= 0.95*gr.MeanCost || fl.Preemptions >= gr.Preemptions/1.5 {
						t.Errorf("long job: fleetd $%.2f with %.2f preemptions, want well below greedy's $%.2f and %.2f", fl.MeanCost, fl.Preemptions, gr.MeanCost, gr.Preemptions)
					}
					if spotPrice < 1.03 {
						t.Errorf("long job: fleetd's mean spot price $%.3f/h; want mostly the stable $1.06 zone", spotPrice)
					}
				} else if spotPrice > 1.01 || fl.MeanCost > 1.005*gr.MeanCost {
					t.Errorf("short job: fleetd $%.2f at $%.3f/h spot; want the cheap zones, as greedy ($%.2f)", fl.MeanCost, spotPrice, gr.MeanCost)
				}
			})
		}
	}
}

// TestForesightBound: the foresight policy's forecast is the trace's own
// future (exactly the time to the first tick without capacity), and told
// it, fleetd's zone choice on the hand-made market is preempted less
// often than fleetd's and costs no more.
func TestForesightBound(t *testing.T) {
	dir := handMadeTrace(t)
	tr, err := sim.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	mkt, err := sim.NewMarket(tr, sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	fc := upRunForecast(mkt, 1)
	checked := 0
	for _, o := range mkt.Offers {
		av := o.Series.Avail
		for i := 0; i < len(av); i += 97 {
			at := o.TickStart(i).Add(time.Minute)
			got, ok := fc(o.Spot.Key(), at)
			if !ok {
				t.Fatalf("%s: no forecast at tick %d", o.Meta.Zone, i)
			}
			j := i
			for j < len(av) && av[j] > 0 {
				j++
			}
			if want := max(o.TickStart(j).Sub(at), 0); got != want {
				t.Fatalf("%s tick %d: forecast %s, want %s", o.Meta.Zone, i, got, want)
			}
			checked++
		}
		if _, ok := fc(o.OnDemand.Key(), o.TickStart(0)); ok {
			t.Errorf("%s: a forecast for on-demand", o.Meta.Zone)
		}
	}
	if _, ok := fc("sim/nowhere/x-9z/v100/spot", mkt.Offers[0].TickStart(0)); ok {
		t.Error("a forecast for an unknown offering")
	}
	t.Logf("%d forecasts checked against the series", checked)

	pols, err := SelectPolicies([]string{"fleetd", "fleetd-foresight"})
	if err != nil {
		t.Fatal(err)
	}
	sum, _ := runHandMade(t, dir, tr, pols, Job{Work: 40 * time.Hour, Deadline: 42 * time.Hour}, false)
	fl, fs := sum[0], sum[1]
	t.Logf("fleetd $%.2f (%.2f preemptions); foresight $%.2f (%.2f preemptions)", fl.MeanCost, fl.Preemptions, fs.MeanCost, fs.Preemptions)
	if fs.Misses > 0 || fs.Preemptions >= fl.Preemptions || fs.MeanCost > fl.MeanCost {
		t.Errorf("foresight: $%.2f, %.2f preemptions, %d misses; want at most fleetd's $%.2f and fewer than its %.2f preemptions, no miss",
			fs.MeanCost, fs.Preemptions, fs.Misses, fl.MeanCost, fl.Preemptions)
	}
}
