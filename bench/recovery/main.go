// Command recovery runs one PyTorch DDP job (examples/pytorch/ddp_train.py,
// Debian's python3-torch, gloo, checkpointing) on three local "nodes",
// first under torchrun and then under fleetd, in one run on one machine,
// and plays the same three scenarios on each:
//
//   - kill:   a node is killed without notice (SIGKILL to its whole session);
//   - notice: a node gets a spot interruption notice and dies at its
//     deadline (torchrun has nothing that reads the notice);
//   - add:    a node is added (torchrun: a fourth agent process is started;
//     fleetd: the replacement it launched for the killed node joins).
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
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/bench/internal/report"
)

// Scenarios.
const (
	scenKill   = "kill"
	scenNotice = "notice"
	scenAdd    = "add"
)

// targets are fleetd's bounds per scenario (seconds), and the speed-up over
// torchrun each must show.
var targets = map[string]float64{scenNotice: 5, scenKill: 10, scenAdd: 5}

const ratioTarget = 4

// stableSpan is how long a restarted worker must train without another
// restart for the to_stable figure.
const stableSpan = 10 * time.Second

// config is what both systems run.
type config struct {
	python, script, fleetd string
	steps                  int
	stepTime               float64
	ckptEvery              int
	lead                   time.Duration
	startTimeout           time.Duration
	scenarioTimeout        time.Duration
}

// trainArgs are the worker's arguments, identical under both systems.
func (c config) trainArgs(ckpt string) []string {
	return []string{"--steps", strconv.Itoa(c.steps), "--step-time", strconv.FormatFloat(c.stepTime, 'f', -1, 64),
		"--ckpt", ckpt, "--ckpt-every", strconv.Itoa(c.ckptEvery)}
}

// result is one system's figure for one scenario.
type result struct {
	rec     Recovery
	missing string
	extra   map[string]float64
}

func (r result) seconds() float64 {
	if r.missing != "" {
		return math.NaN()
	}
	return r.rec.Duration.Seconds()
}

func say(format string, args ...any) {
	fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, args...))
}

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
type note struct {
	At   time.Time
	What string
}

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
		notes = append(notes, note{s.At, w})
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
	flag.StringVar(&cfg.python, "python", "/usr/bin/python3", "the Python with torch (Debian python3-torch)")
	flag.StringVar(&cfg.script, "script", "examples/pytorch/ddp_train.py", "the training script")
	flag.StringVar(&cfg.fleetd, "fleetd", "bin/fleetd", "the fleetd binary")
	flag.IntVar(&cfg.steps, "steps", 1000000, "--steps of the job (large: the job must outlive the benchmark)")
	flag.Float64Var(&cfg.stepTime, "step-time", 0.1, "--step-time of the job (seconds of simulated compute per step)")
	flag.IntVar(&cfg.ckptEvery, "ckpt-every", 10, "--ckpt-every of the job")
	flag.DurationVar(&cfg.lead, "lead", 30*time.Second, "spot notice lead (GCE gives 30 s, AWS 2 min)")
	flag.DurationVar(&cfg.startTimeout, "start-timeout", 3*time.Minute, "time for the job to start training")
	flag.DurationVar(&cfg.scenarioTimeout, "scenario-timeout", 3*time.Minute, "time for training to resume after an event")
	only := flag.String("only", "both", "torchrun, fleetd or both")
	jsonOut := flag.String("json", "", "also write the figures to this JSON file")
	keep := flag.Bool("keep", false, "keep the work directory (logs of every node) even when all went well")
	flag.Parse()
	if *only != "both" && *only != "torchrun" && *only != "fleetd" {
		fmt.Fprintf(os.Stderr, "recovery: -only %q: want torchrun, fleetd or both\n", *only)
		os.Exit(2)
	}

	var err error
	for _, p := range []*string{&cfg.script, &cfg.fleetd} {
		if *p, err = filepath.Abs(*p); err != nil {
			fatal(err)
		}
	}
	if _, err := os.Stat(cfg.script); err != nil {
		fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	work, err := os.MkdirTemp("", "fleetd-bench-recovery-")
	if err != nil {
		fatal(err)
	}
	failedRun := false
	defer func() {
		if *keep || failedRun {
			fmt.Printf("recovery: logs kept in %s\n", work)
			return
		}
		os.RemoveAll(work)
	}()

	var tr, fd map[string]result
	if *only == "both" || *only == "torchrun" {
		dir := filepath.Join(work, "torchrun")
		_ = os.MkdirAll(dir, 0o755)
		t, err := newTorchrun(cfg, dir)
		if err != nil {
			fatal(err)
		}
		say("=== torchrun (%s -m torch.distributed.run) ===", cfg.python)
		if tr, err = t.run(ctx); err != nil {
			say("torchrun: ERROR: %v", err)
			failedRun = true
		}
	}
	if *only == "both" || *only == "fleetd" {
		if _, err := os.Stat(cfg.fleetd); err != nil {
			fatal(fmt.Errorf("%w (run `make build`)", err))
		}
		dir := filepath.Join(work, "fleetd")
		_ = os.MkdirAll(dir, 0o755)
		say("=== fleetd (%s serve -dev, local provider) ===", cfg.fleetd)
		if fd, err = newFleetd(cfg, dir).run(ctx); err != nil {
			say("fleetd: ERROR: %v", err)
			failedRun = true
		}
	}
	for _, res := range []map[string]result{tr, fd} {
		for _, x := range res {
			if x.missing != "" {
				failedRun = true // keep the logs of a scenario that did not recover
			}
		}
	}
	r := report.New(os.Stdout)
	fmt.Println()
	for _, sc := range []string{scenNotice, scenKill, scenAdd} {
		figures(r, sc, tr, fd)
	}
	failed := r.Summary("recovery")
	if *jsonOut != "" {
		if err := r.WriteJSON(*jsonOut); err != nil {
			fmt.Fprintln(os.Stderr, "write json:", err)
		}
	}
	fmt.Printf("recovery: %d figure(s) missed their target\n", failed)
	if failed > 0 {
		// os.Exit skips the deferred clean-up: the logs of a miss stay.
		fmt.Printf("recovery: logs kept in %s\n", work)
		os.Exit(1) // bench/run.sh counts a program that fails as a miss
	}
}

// figures reports one scenario: each system's seconds and lost steps, and
// the ratio.
func figures(r *report.Reporter, sc string, tr, fd map[string]result) {
	t, tok := tr[sc]
	f, fok := fd[sc]
	name := "recovery." + sc
	if tok && t.missing == "" {
		r.Info(name+".torchrun", t.seconds(), "s")
		r.Info(name+".torchrun_lost_steps", float64(t.rec.LostSteps), "steps")
		printExtra(r, name+".torchrun_", t.extra)
	} else if tr != nil {
		r.Missing(name+".torchrun", "s", report.NoTarget, 0, missingWhy(t, tok))
	}
	if fok && f.missing == "" {
		r.Check(name+".fleetd", f.seconds(), "s", report.AtMost, targets[sc])
		r.Info(name+".fleetd_lost_steps", float64(f.rec.LostSteps), "steps")
		printExtra(r, name+".fleetd_", f.extra)
	} else if fd != nil {
		r.Missing(name+".fleetd", "s", report.AtMost, targets[sc], missingWhy(f, fok))
	}
	if tok && fok && t.missing == "" && f.missing == "" {
		r.Check(name+".ratio_torchrun_over_fleetd", t.seconds()/f.seconds(), "x", report.AtLeast, ratioTarget)
	} else if tr != nil && fd != nil {
		r.Missing(name+".ratio_torchrun_over_fleetd", "x", report.AtLeast, ratioTarget, "a side has no figure")
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

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "recovery:", err)
	os.Exit(1)
}
