// Command elastic compares how much a membership change costs a PyTorch
// DDP job (examples/pytorch/elastic_train.py, Debian's torch 1.13, gloo,
// a checkpoint every 50 steps) on three local nodes under torchrun,
// fleetd's restart mode and fleetd's in-process mode, for models holding
// about 100 MiB and 1 GiB of parameters plus optimizer state. torchrun runs
// at fleetd's timeouts (the headline) and at its defaults (package trargs).
// Scenarios, in order: an unannounced node loss (SIGKILL to a node's
// session), a node added (timed from its agent process's start under every
// system), a spot notice (torchrun, which cannot act on it, timed from the
// node's death), a silent node loss (SIGSTOP to a node's session). Per scenario and system it prints the seconds
// until every survivor trains again, the longest pause, the lost steps,
// the checkpoint data read, and for a joiner the seconds until it trains
// and the rate its state reached it (FIGURE lines, bench/internal/report).
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleetd/bench/internal/driver"
	"github.com/fleetd/fleetd/bench/internal/report"
)

// Systems.
const (
	sysTorchrun         = "torchrun" // at fleetd's timeouts
	sysTorchrunDefaults = "torchrun-defaults"
)

var systemNames = []string{sysTorchrun, sysTorchrunDefaults, "restart", "in-process"}

type config struct {
	driver.Config
	stateMiB float64
	offset   int
}

// trainArgs are the worker's arguments under every system: an embedding
// model (sparse gradients, SparseAdam: parameters and both moments are
// dense, so the state is 3× the table) with a small dense head, sized to
// stateMiB; --step-time adds simulated compute to each step.
func (c config) trainArgs(ckpt string) []string {
	return []string{"--steps", "10000000", "--step-time", strconv.FormatFloat(c.StepTime, 'f', -1, 64),
		"--ckpt", ckpt, "--ckpt-every", strconv.Itoa(c.CkptEvery),
		"--arch", "embedding", "--sparse", "--state-mib", strconv.FormatFloat(c.stateMiB, 'f', -1, 64),
		"--optimizer", "adam", "--dim", "64", "--hidden", "64", "--lr", "0.001", "--samples", "100000", "--batch", "8",
		"--timeout", "60"}
}

// system is one way of running the job.
type system interface {
	name() string
	start(ctx context.Context) error
	timeline() *Timeline
	live() []string
	victim() (string, error)
	kill(node string) error
	// add brings a fourth node: returns it, when it entered the rendezvous
	// and when its agent process started (the event a joiner is timed from).
	add(ctx context.Context, since time.Time) (node string, joined, started time.Time, err error)
	// silence stops the node's processes (SIGSTOP), as a VM that vanishes:
	// nothing is reset. Returns how many it stopped.
	silence(node string) int
	// notice gives node a spot notice: death is when it died (torchrun,
	// which cannot act on it), known when fleetd's daemon had it.
	notice(ctx context.Context, node string) (death, known time.Time, err error)
	// lossKnown is when the control plane knew of node's loss (zero: n/a).
	lossKnown(node string, since time.Time) time.Time
	notes(from, to time.Time) []note
	stop()
}

// note is one line of a change's explanation.
type note = driver.Note

// result is one system's outcome of one scenario.
type result struct {
	Outcome
	missing   string
	fromKnown float64 // TrainAgain from when the control plane knew (fleetd)
	fromDeath float64 // TrainAgain from the node's death (torchrun notice)
	fromJoin  float64 // TrainAgain from the joiner's rendezvous entry (add)
}

// say prints a progress line with the wall-clock time.
var say = driver.Say

func main() {
	var cfg config
	cfg.Flags(driver.Config{Script: "examples/pytorch/elastic_train.py", CkptEvery: 50, StartTimeout: 5 * time.Minute, ScenarioTimeout: 4 * time.Minute})
	sizes := flag.String("sizes", "100,1024", "model sizes: MiB of parameters plus optimizer state, comma-separated")
	systems := flag.String("systems", "torchrun,torchrun-defaults,restart,in-process", "which systems, comma-separated (torchrun: at fleetd's timeouts)")
	flag.IntVar(&cfg.offset, "offset", 25, "the kill and the notice come this many steps after a periodic checkpoint")
	jsonOut := flag.String("json", "", "also write the figures to this JSON file")
	keep := flag.Bool("keep", false, "keep the work directory")
	flag.Parse()

	run, ctx, err := cfg.Begin("elastic", *keep)
	if err != nil {
		fatal(err)
	}
	defer run.End()

	all := map[string]map[string]map[string]result{} // size → system → scenario
	var sizeList []string
	for _, s := range strings.Split(*sizes, ",") {
		mib, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || mib <= 0 {
			fatal(fmt.Errorf("-sizes: %q", s))
		}
		size := sizeName(mib)
		sizeList = append(sizeList, size)
		all[size] = map[string]map[string]result{}
		c := cfg
		c.stateMiB = mib
		for _, sysName := range strings.Split(*systems, ",") {
			dir := filepath.Join(run.Work, size, sysName)
			_ = os.MkdirAll(dir, 0o755)
			var sys system
			switch sysName {
			case sysTorchrun, sysTorchrunDefaults:
				t, err := newTorchrun(c, sysName == sysTorchrunDefaults, dir)
				if err != nil {
					fatal(err)
				}
				sys = t
			case "restart", "in-process":
				if err := c.NeedFleetd(); err != nil {
					fatal(err)
				}
				sys = newFleetd(c, sysName, dir)
			default:
				fatal(fmt.Errorf("-systems: unknown %q", sysName))
			}
			say("=== %s, %s of parameters and optimizer state ===", sys.name(), size)
			res, err := play(ctx, c, sys)
			if err != nil {
				say("%s: ERROR: %v", sys.name(), err)
				run.Failed = true
			}
			all[size][sysName] = res
			for _, r := range res {
				if r.missing != "" {
					run.Failed = true
				}
			}
			if ctx.Err() != nil {
				break
			}
		}
	}
	r := report.New(os.Stdout)
	fmt.Println()
	for _, size := range sizeList {
		figures(r, cfg, size, all[size])
	}
	table(sizeList, all)
	run.Finish(r, *jsonOut)
}

func sizeName(mib float64) string {
	if mib >= 1024 && math.Mod(mib, 1024) == 0 {
		return fmt.Sprintf("%.0fGiB", mib/1024)
	}
	return fmt.Sprintf("%.0fMiB", mib)
}

// play runs the three scenarios on one system: kill, add, notice.
func play(ctx context.Context, cfg config, sys system) (map[string]result, error) {
	res := map[string]result{}
	defer sys.stop()
	if err := sys.start(ctx); err != nil {
		return res, err
	}
	nodes, err := waitSteady(ctx, sys, 3, cfg.StartTimeout)
	if err != nil {
		return res, err
	}
	say("%s: training at world size 3 (%.0f MiB of state per worker)", sys.name(), sys.timeline().StateMiB(nodes))

	// 1. A node killed without notice, mid checkpoint interval.
	r, survivors, t0, err := lose(ctx, cfg, sys, nodes, driver.ScenKill, func(v string) (string, error) {
		return "killed", sys.kill(v)
	})
	if err != nil {
		return res, err
	}
	res[driver.ScenKill] = r
	if _, ok := sys.(*torchrun); ok { // fleetd's replacement joins on its own, usually before
		if _, err := waitSteady(ctx, sys, 2, cfg.ScenarioTimeout); err != nil {
			return res, err
		}
	}

	// 2. A node added (fleetd: the replacement it launched for the lost
	// node), measured from its entering the rendezvous and reported from
	// its agent process's start, the same event under every system.
	joiner, joinAt, started, err := sys.add(ctx, t0)
	if err != nil {
		return res, err
	}
	say("%s: node %s entered the rendezvous %.2fs after the kill, %.2fs after its agent started", sys.name(), joiner,
		joinAt.Sub(t0).Seconds(), joinAt.Sub(started).Seconds())
	r = measure(ctx, sys, driver.ScenAdd, append(slices.Clone(survivors), joiner), joiner, joinAt, t0, cfg.ScenarioTimeout)
	if r.missing == "" {
		lead := joinAt.Sub(started).Seconds()
		r.fromJoin = r.TrainAgain
		r.TrainAgain += lead
		r.JoinerTrains += lead
	}
	res[driver.ScenAdd] = r
	explain(sys, driver.ScenAdd, joinAt, r)
	if nodes, err = waitSteady(ctx, sys, 3, cfg.ScenarioTimeout); err != nil {
		return res, err
	}

	// 3. A spot notice, mid checkpoint interval.
	if err := waitOffset(ctx, sys, nodes, cfg); err != nil {
		return res, err
	}
	v, err := sys.victim()
	if err != nil {
		return res, err
	}
	survivors = driver.Without(nodes, v)
	t0 = time.Now()
	say("%s: spot notice for node %s at step %d", sys.name(), v, sys.timeline().MaxStep(nodes))
	death, known, err := sys.notice(ctx, v)
	if err != nil {
		return res, err
	}
	r = measure(ctx, sys, driver.ScenNotice, survivors, "", t0, time.Time{}, cfg.Lead+cfg.ScenarioTimeout)
	if !known.IsZero() && r.missing == "" {
		r.fromKnown = r.TrainAgain - known.Sub(t0).Seconds()
	}
	if !death.IsZero() && r.missing == "" {
		r.fromDeath = r.TrainAgain - death.Sub(t0).Seconds()
	}
	res[driver.ScenNotice] = r
	explain(sys, driver.ScenNotice, t0, r)

	// 4. A node silenced (SIGSTOP), mid checkpoint interval: three nodes
	// first (torchrun: another agent; fleetd: the notice's replacement).
	if _, ok := sys.(*torchrun); ok {
		if _, err := waitSteady(ctx, sys, 2, cfg.ScenarioTimeout); err != nil {
			return res, err
		}
		if _, _, _, err := sys.add(ctx, time.Now()); err != nil {
			return res, err
		}
	}
	if nodes, err = waitSteady(ctx, sys, 3, cfg.Lead+cfg.ScenarioTimeout); err != nil {
		return res, err
	}
	r, _, _, err = lose(ctx, cfg, sys, nodes, driver.ScenKillSilent, func(v string) (string, error) {
		return fmt.Sprintf("silenced (SIGSTOP to %d processes)", sys.silence(v)), nil
	})
	if err != nil {
		return res, err
	}
	res[driver.ScenKillSilent] = r
	return res, nil
}

// lose takes a node other than rank 0's out, mid checkpoint interval, with
// act (which says what it did), and measures the survivors' recovery.
func lose(ctx context.Context, cfg config, sys system, nodes []string, scen string, act func(v string) (string, error)) (result, []string, time.Time, error) {
	if err := waitOffset(ctx, sys, nodes, cfg); err != nil {
		return result{}, nil, time.Time{}, err
	}
	v, err := sys.victim()
	if err != nil {
		return result{}, nil, time.Time{}, err
	}
	survivors := driver.Without(nodes, v)
	t0 := time.Now()
	what, err := act(v)
	if err != nil {
		return result{}, nil, time.Time{}, err
	}
	say("%s: node %s %s at step %d", sys.name(), v, what, sys.timeline().MaxStep(nodes))
	r := measure(ctx, sys, scen, survivors, "", t0, time.Time{}, cfg.ScenarioTimeout)
	if known := sys.lossKnown(v, t0); !known.IsZero() && r.missing == "" {
		r.fromKnown = r.TrainAgain - known.Sub(t0).Seconds()
	}
	explain(sys, scen, t0, r)
	return r, survivors, t0, nil
}

// waitSteady waits until n live nodes train at world size n for 3 s.
func waitSteady(ctx context.Context, sys system, n int, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		nodes := sys.live()
		if len(nodes) == n && sys.timeline().Steady(nodes, n, 3*time.Second, time.Now()) {
			return nodes, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: %d nodes not training at world size %d within %s (live: %v)", sys.name(), n, n, timeout, nodes)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitOffset waits until the job is cfg.offset steps past a periodic
// checkpoint.
func waitOffset(ctx context.Context, sys system, nodes []string, cfg config) error {
	s := sys.timeline().MaxStep(nodes)
	target := (s/int64(cfg.CkptEvery))*int64(cfg.CkptEvery) + int64(cfg.offset)
	if target <= s {
		target += int64(cfg.CkptEvery)
	}
	target = max(target, int64(cfg.CkptEvery+cfg.offset)) // after the first periodic checkpoint
	deadline := time.Now().Add(cfg.ScenarioTimeout)
	for sys.timeline().MaxStep(nodes) < target {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: step %d not reached", sys.name(), target)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

func measure(ctx context.Context, sys system, scen string, nodes []string, joiner string, t0, prev time.Time, timeout time.Duration) result {
	deadline := time.Now().Add(timeout)
	for {
		if o, ok := sys.timeline().Recovered(nodes, joiner, t0, prev); ok {
			r := result{Outcome: o}
			say("%s: %s: %v train again %.2fs after the event (world size %d; longest pause %.2fs; %d step(s) lost; %.0f MiB of checkpoint read)",
				sys.name(), scen, nodes, o.TrainAgain, o.World, o.Pause, o.LostSteps, o.CkptMiB)
			if joiner != "" {
				say("%s: %s: joiner %s trains %.2fs after it joined; state %.0f MiB at %.0f MiB/s", sys.name(), scen, joiner,
					o.JoinerTrains, o.TransferMiB, o.TransferMiBs)
			}
			return r
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			why := fmt.Sprintf("%v not training again within %s", nodes, timeout)
			say("%s: %s: %s", sys.name(), scen, why)
			return result{missing: why}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// explain prints the system's log lines and the worker starts around a
// change, in time order.
func explain(sys system, scen string, t0 time.Time, r result) {
	end := r.Recovered.Add(500 * time.Millisecond)
	if r.missing != "" {
		end = t0.Add(time.Minute)
	}
	notes := append(sys.notes(t0.Add(-time.Second), end), sys.timeline().Starts(sys.live(), t0.Add(-time.Second), end)...)
	sort.SliceStable(notes, func(i, j int) bool { return notes[i].At.Before(notes[j].At) })
	for _, n := range notes {
		fmt.Printf("    %s %s %+7.2fs  %s\n", sys.name(), scen, n.At.Sub(t0).Seconds(), n.What)
	}
}

// Targets of the in-process mode (issue 17).
const (
	targetNoticeS   = 0.5 // survivors train again after a notice
	targetKillS     = 1.0 // … after an unannounced loss
	targetTransfer  = 200 // MiB/s, joiner state transfer
	targetLostSteps = 0   // notice, both fleetd modes
)

// bound is how long a scenario may take to recover before it is a miss:
// the time measure waits (a notice adds its lead).
func (c config) bound(sc string) float64 {
	if sc == driver.ScenNotice {
		return (c.Lead + c.ScenarioTimeout).Seconds()
	}
	return c.ScenarioTimeout.Seconds()
}

func isTorchrun(sysName string) bool { return sysName == sysTorchrun || sysName == sysTorchrunDefaults }

// headline is a result's train_again figure: torchrun cannot act on a
// notice, so its notice figure is timed from the node's death (the lead,
// spent training, is not recovery); every other from the event.
func (x result) headline(sysName, sc string) float64 {
	if sc == driver.ScenNotice && isTorchrun(sysName) {
		return x.fromDeath
	}
	return x.TrainAgain
}

func figures(r *report.Reporter, cfg config, size string, bySys map[string]map[string]result) {
	for _, sysName := range systemNames {
		res, ok := bySys[sysName]
		if !ok {
			continue
		}
		for _, sc := range driver.Scenarios {
			x, ok := res[sc]
			name := fmt.Sprintf("elastic.%s.%s.%s", size, sc, strings.ReplaceAll(sysName, "-", "_"))
			if !ok || x.missing != "" {
				why := "scenario not reached"
				if ok {
					why = x.missing
				}
				// A run that never recovers is a miss for every system,
				// torchrun included: its figure would be the baseline.
				r.Missing(name+".train_again", "s", report.AtMost, cfg.bound(sc), why)
				continue
			}
			switch {
			case sysName == "in-process" && sc == driver.ScenNotice:
				r.Check(name+".train_again", x.TrainAgain, "s", report.AtMost, targetNoticeS)
			case sysName == "in-process" && sc == driver.ScenKill:
				r.Check(name+".train_again", x.TrainAgain, "s", report.AtMost, targetKillS)
			default:
				r.Check(name+".train_again", x.headline(sysName, sc), "s", report.AtMost, cfg.bound(sc))
			}
			if x.fromKnown != 0 {
				r.Info(name+".train_again_from_daemon_knowing", x.fromKnown, "s")
			}
			if sc == driver.ScenNotice && isTorchrun(sysName) {
				r.Info(name+".train_again_from_notice", x.TrainAgain, "s")
			}
			if x.fromJoin != 0 {
				r.Info(name+".train_again_from_join", x.fromJoin, "s")
			}
			r.Info(name+".pause", x.Pause, "s")
			if sc == driver.ScenNotice && !isTorchrun(sysName) {
				r.Check(name+".lost_steps", float64(x.LostSteps), "steps", report.AtMost, targetLostSteps)
			} else {
				r.Info(name+".lost_steps", float64(x.LostSteps), "steps")
			}
			r.Info(name+".checkpoint_read", x.CkptMiB, "MiB")
			if sc == driver.ScenAdd {
				r.Info(name+".joiner_trains", x.JoinerTrains, "s")
				if sysName == "in-process" {
					r.Check(name+".joiner_state_transfer", x.TransferMiBs, "MiB/s", report.AtLeast, targetTransfer)
				} else if x.TransferMiBs > 0 {
					r.Info(name+".joiner_state_transfer", x.TransferMiBs, "MiB/s")
				}
			}
		}
	}
	for _, sc := range driver.Scenarios {
		for _, sysName := range []string{sysTorchrun, sysTorchrunDefaults} {
			t, tok := bySys[sysName][sc]
			ip, iok := bySys["in-process"][sc]
			if tok && iok && t.missing == "" && ip.missing == "" && ip.TrainAgain > 0 {
				r.Info(fmt.Sprintf("elastic.%s.%s.ratio_%s_over_in_process", size, sc, strings.ReplaceAll(sysName, "-", "_")),
					t.headline(sysName, sc)/ip.TrainAgain, "x")
			}
		}
	}
}

// table prints the comparison as a Markdown table (docs/benchmarks.md).
func table(sizes []string, all map[string]map[string]map[string]result) {
	fmt.Println()
	fmt.Println("| Model state | Scenario | System | Survivors train again | Longest pause | Lost steps | Checkpoint read | Joiner trains | Joiner state transfer |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, size := range sizes {
		for _, sc := range driver.Scenarios {
			for _, sysName := range systemNames {
				x, ok := all[size][sysName][sc]
				if _, sysRan := all[size][sysName]; !sysRan {
					continue
				}
				label := map[string]string{sysTorchrun: "torchrun at fleetd's timeouts", sysTorchrunDefaults: "torchrun at its defaults",
					"restart": "fleetd restart", "in-process": "fleetd in-process"}[sysName]
				if !ok || x.missing != "" {
					fmt.Printf("| %s | %s | %s | — | — | — | — | — | — |\n", size, sc, label)
					continue
				}
				again := fmt.Sprintf("%.2f s", x.headline(sysName, sc))
				if x.fromKnown != 0 {
					again += fmt.Sprintf(" (%.2f s after the daemon knew)", x.fromKnown)
				}
				if sc == driver.ScenNotice && isTorchrun(sysName) {
					again += fmt.Sprintf(" after the node died (%.2f s after the notice)", x.TrainAgain)
				}
				if x.fromJoin != 0 {
					again += fmt.Sprintf(" from the agent's start (%.2f s from the join)", x.fromJoin)
				}
				joiner, transfer := "", ""
				if sc == driver.ScenAdd {
					joiner = fmt.Sprintf("%.2f s", x.JoinerTrains)
					if x.TransferMiBs > 0 {
						transfer = fmt.Sprintf("%.0f MiB at %.0f MiB/s", x.TransferMiB, x.TransferMiBs)
					}
				}
				fmt.Printf("| %s | %s | %s | %s | %.2f s | %d | %.0f MiB | %s | %s |\n", size, sc, label, again, x.Pause,
					x.LostSteps, x.CkptMiB, joiner, transfer)
			}
		}
	}
	fmt.Println()
}

func fatal(err error) { driver.Fatal("elastic", err) }
