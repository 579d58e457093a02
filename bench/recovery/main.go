// Command recovery runs one PyTorch DDP job (examples/pytorch/ddp_train.py,
// Debian's python3-torch, gloo, checkpointing) on three local "nodes",
// under torchrun at fleetd's timeouts, torchrun at its defaults and fleetd,
// in one run on one machine, and plays the same scenarios on each:
//
//   - kill:   a node is killed without notice (SIGKILL to its whole session:
//     its connections are reset, so peers learn of it at once);
//   - add:    a node is added (torchrun: another agent process is started;
//     fleetd: the replacement it launched for the killed node joins), timed
//     from the new agent process's start under both;
//   - notice: a node gets a spot interruption notice and dies at its
//     deadline. torchrun has nothing that reads the notice: its figure is
//     timed from the node's death; fleetd's from the notice, which is
//     earlier by the lead (reported on its own);
//   - kill_silent: a node goes silent (SIGSTOP to its session), as a VM that
//     vanishes does: peers learn of it only through their timeouts (the
//     workers' collective timeout is the same under both systems).
//
// Per scenario it prints the seconds from the event until every surviving
// worker runs training steps again, the lost steps, and the ratio
// torchrun/fleetd, as FIGURE lines (see bench/internal/report).
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
	"github.com/fleetd/fleetd/bench/internal/report"
)

// Systems, as named in figures.
const (
	sysTorchrun         = "torchrun" // at fleetd's timeouts
	sysTorchrunDefaults = "torchrun_defaults"
	sysFleetd           = "fleetd"
)

// targets are fleetd's bounds per scenario (seconds), and the speed-up over
// torchrun at fleetd's timeouts each must show. Other figures must recover
// within the scenario timeout.
var targets = map[string]float64{driver.ScenNotice: 5, driver.ScenKill: 10, driver.ScenAdd: 5}

const ratioTarget = 4

// stableSpan is how long a restarted worker must train without another
// restart for the to_stable figure.
const stableSpan = 10 * time.Second

// config is what both systems run.
type config struct {
	driver.Config
	steps int
}

// trainArgs are the worker's arguments, identical under both systems.
func (c config) trainArgs(ckpt string) []string {
	return []string{"--steps", strconv.Itoa(c.steps), "--step-time", strconv.FormatFloat(c.StepTime, 'f', -1, 64),
		"--ckpt", ckpt, "--ckpt-every", strconv.Itoa(c.CkptEvery)}
}

// result is one system's figure for one scenario.
type result struct {
	rec     Recovery
	shift   time.Duration // from an event this long before the measured one
	missing string
	extra   map[string]float64
}

func (r result) seconds() float64 {
	if r.missing != "" {
		return math.NaN()
	}
	return (r.rec.Duration + r.shift).Seconds()
}

// fromEarlier times r from an event d before the one it was measured from,
// keeping the measured figure as extra[name].
func (r *result) fromEarlier(d time.Duration, name string) {
	if r.missing != "" {
		return
	}
	r.extra[name] = r.seconds()
	r.shift += d
}

// say prints a progress line with the wall-clock time.
var say = driver.Say

// measure waits until every node in nodes runs steps in an incarnation
// started after t0 (at world size ws when ws > 0).
func measure(ctx context.Context, sys, scen string, tl func() *Timeline, nodes []string, t0 time.Time, ws int, timeout time.Duration) result {
	deadline := time.Now().Add(timeout)
	for {
		if rec, ok := tl().Recovered(nodes, t0, ws); ok {
			say("%s: %s: %v training again (world size %d) %.2fs after the event; %d step(s) lost", sys, scen, nodes, rec.WorldSize, rec.Duration.Seconds(), rec.LostSteps)
			r := result{rec: rec, extra: map[string]float64{}}
			// Then wait for the restart that lasts (stableSpan of steps
			// without another restart), for the to_stable figure.
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if d, ok := tl().Stable(nodes, t0, stableSpan); ok {
					r.extra["to_stable"] = d.Seconds()
					if d > rec.Duration+time.Second {
						say("%s: %s: restarted again; training ran %s without a restart from %.2fs after the event", sys, scen, stableSpan, d.Seconds())
					}
					break
				}
				time.Sleep(250 * time.Millisecond)
			}
			return r
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			why := fmt.Sprintf("%v not training again within %s", nodes, timeout)
			say("%s: %s: %s", sys, scen, why)
			return result{missing: why}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// note is one line of a recovery's explanation.
type note = driver.Note

// explain prints what happened between t0 and the recovery (plus a
// second), in time order: the system's own log lines and events (notes)
// and the worker starts of the timeline.
func explain(sys, scen string, t0 time.Time, r result, tl *Timeline, notes []note) {
	end := t0.Add(r.rec.Duration + time.Second)
	if r.missing != "" {
		end = t0.Add(time.Minute)
	}
	for _, s := range tl.Starts(t0, end) {
		w := fmt.Sprintf("worker start: node %s rank %d world size %d", s.Node, s.Rank, s.WorldSize)
		if !s.FirstStep.IsZero() {
			w += fmt.Sprintf(", first step +%.2fs", s.FirstStep.Sub(t0).Seconds())
		} else {
			w += ", no step (stopped before its first)"
		}
		notes = append(notes, note{At: s.At, What: w})
	}
	sort.SliceStable(notes, func(i, j int) bool { return notes[i].At.Before(notes[j].At) })
	for _, n := range notes {
		if n.At.Before(t0.Add(-time.Second)) || n.At.After(end) {
			continue
		}
		fmt.Printf("    %s %s +%6.2fs  %s\n", sys, scen, n.At.Sub(t0).Seconds(), n.What)
	}
}

// waitSteady waits until nodes train steadily at world size ws.
func waitSteady(ctx context.Context, tl func() *Timeline, nodes []string, ws int, span, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !tl().Steady(nodes, ws, span, time.Now()) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%v not training at world size %d within %s", nodes, ws, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

func main() {
	var cfg config
	cfg.Flags(driver.Config{Script: "examples/pytorch/ddp_train.py", CkptEvery: 10, StartTimeout: 3 * time.Minute, ScenarioTimeout: 3 * time.Minute})
	flag.IntVar(&cfg.steps, "steps", 1000000, "--steps of the job (large: the job must outlive the benchmark)")
	only := flag.String("only", "both", "torchrun, fleetd or both")
	profiles := flag.String("torchrun", "fleetd-timeouts,defaults", "torchrun profiles, comma-separated: at fleetd-timeouts (the headline) and at its defaults")
	jsonOut := flag.String("json", "", "also write the figures to this JSON file")
	keep := flag.Bool("keep", false, "keep the work directory (logs of every node) even when all went well")
	flag.Parse()
	if *only != "both" && *only != "torchrun" && *only != "fleetd" {
		fmt.Fprintf(os.Stderr, "recovery: -only %q: want torchrun, fleetd or both\n", *only)
		os.Exit(2)
	}

	run, ctx, err := cfg.Begin("recovery", *keep)
	if err != nil {
		fatal(err)
	}
	defer run.End()

	runs := map[string]map[string]result{} // system → scenario
	if *only == "both" || *only == "torchrun" {
		for _, p := range strings.Split(*profiles, ",") {
			if p != "fleetd-timeouts" && p != "defaults" {
				fatal(fmt.Errorf("-torchrun: unknown profile %q", p))
			}
			t, err := newTorchrun(cfg, p == "defaults", "")
			if err != nil {
				fatal(err)
			}
			t.SetDir(filepath.Join(run.Work, t.name()))
			_ = os.MkdirAll(t.Dir, 0o755)
			say("=== %s (%s; %s) ===", t.name(), cfg.Python, p)
			res, err := t.run(ctx)
			if err != nil {
				say("%s: ERROR: %v", t.name(), err)
				run.Failed = true
			}
			runs[t.name()] = res
		}
	}
	if *only == "both" || *only == "fleetd" {
		if err := cfg.NeedFleetd(); err != nil {
			fatal(err)
		}
		dir := filepath.Join(run.Work, "fleetd")
		_ = os.MkdirAll(dir, 0o755)
		say("=== fleetd (%s serve -dev, local provider) ===", cfg.Fleetd)
		res, err := newFleetd(cfg, dir).run(ctx)
		if err != nil {
			say("fleetd: ERROR: %v", err)
			run.Failed = true
		}
		runs[sysFleetd] = res
	}
	for _, res := range runs {
		for _, x := range res {
			if x.missing != "" {
				run.Failed = true // keep the logs of a scenario that did not recover
			}
		}
	}
	r := report.New(os.Stdout)
	fmt.Println()
	r.Info("recovery.notice.lead", cfg.Lead.Seconds(), "s")
	for _, sc := range driver.Scenarios {
		figures(r, cfg, sc, runs)
	}
	run.Finish(r, *jsonOut)
}

// figures reports one scenario: each system's seconds (a miss when it did
// not recover within its bound) and lost steps, and the ratios over fleetd.
func figures(r *report.Reporter, cfg config, sc string, runs map[string]map[string]result) {
	name := "recovery." + sc
	for _, sys := range []string{sysTorchrun, sysTorchrunDefaults, sysFleetd} {
		res, ran := runs[sys]
		if !ran {
			continue
		}
		op, bound := report.AtMost, cfg.ScenarioTimeout.Seconds()
		if t, ok := targets[sc]; ok && sys == sysFleetd {
			bound = t
		}
		x, ok := res[sc]
		if !ok || x.missing != "" {
			r.Missing(name+"."+sys, "s", op, bound, missingWhy(x, ok))
			continue
		}
		r.Check(name+"."+sys, x.seconds(), "s", op, bound)
		r.Info(name+"."+sys+"_lost_steps", float64(x.rec.LostSteps), "steps")
		printExtra(r, name+"."+sys+"_", x.extra)
	}
	fd, fok := runs[sysFleetd][sc]
	for _, sys := range []string{sysTorchrun, sysTorchrunDefaults} {
		res, ran := runs[sys]
		if !ran || runs[sysFleetd] == nil {
			continue
		}
		t, tok := res[sc]
		ratio := name + ".ratio_" + sys + "_over_fleetd"
		// The headline (torchrun at fleetd's timeouts) carries the target
		// where the scenario has one; the defaults' ratio is beside it.
		_, hasTarget := targets[sc]
		op, bound := report.NoTarget, 0.0
		if sys == sysTorchrun && hasTarget {
			op, bound = report.AtLeast, ratioTarget
		}
		if tok && fok && t.missing == "" && fd.missing == "" {
			r.Check(ratio, t.seconds()/fd.seconds(), "x", op, bound)
		} else {
			r.Missing(ratio, "x", op, bound, "a side has no figure")
		}
	}
}

// printExtra reports a result's extra durations, sorted by name.
func printExtra(r *report.Reporter, prefix string, extra map[string]float64) {
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		r.Info(prefix+k, extra[k], "s")
	}
}

func missingWhy(r result, ok bool) string {
	if !ok {
		return "scenario not reached"
	}
	return r.missing
}

func fatal(err error) { driver.Fatal("recovery", err) }
