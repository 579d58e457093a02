package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/simulate"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers/sim"
)

func init() {
	register(command{name: "sim", synopsis: "Simulate a deadline job over a spot trace and compare policies", run: runSim})
}

// durationFlag is an optional duration flag (zero: unset).
type durationFlag struct{ d time.Duration }

func (f *durationFlag) String() string { return f.d.String() }

func (f *durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Errorf("want a positive duration such as 48h, got %q", s)
	}
	f.d = d
	return nil
}

func runSim(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("sim", stderr)
	fs.SetOutput(stderr)
	traceDir := fs.String("trace", "", "trace `DIR` (default: the spec's sim provider block; with -workload -setting cloud: configs/traces/aws-v100-2023-02-15)")
	specPath := fs.String("spec", "", "fleet spec `FILE` with a provider \"sim\" block (required)")
	fleetName := fs.String("fleet", "", "fleet `NAME` when the spec has several")
	starts := fs.String("start", "", "comma-separated window starts instead of random ones: RFC 3339 times or offsets from the trace start (e.g. 72h)")
	windows := fs.Int("windows", 300, "number of random start windows (ignored with -start)")
	seed := fs.Uint64("seed", 1, "seed of the window draw")
	zones := fs.String("zones", "", "comma-separated zones to use (default: the spec's, else every zone of the trace)")
	policies := fs.String("policies", "", "comma-separated policies (default: all but goodput, fleetd-foresight and gang-dp): optimum (the lower bound), fleetd, up, greedy, up-1z, greedy-1z, on-demand, goodput, "+
		"fleetd-foresight (not realizable: knows each zone's remaining up-run), lookahead-<duration> (not realizable: the DP knowing the trace that far ahead, run on the market, e.g. lookahead-2h), "+
		"gang-dp (the DP for a rigid gang of max_nodes in one zone; not a lower bound when max_nodes > 1)")
	parallel := fs.Int("parallel", 0, "windows simulated at once (default: GOMAXPROCS)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	results := fs.Bool("results", false, "with -json, include every window's result")
	warm := fs.Bool("warm", false, "start each window's fleet with the spot market history of the trace before the window, as a long-running deployment would know it (default: from the prior, a fresh daemon)")
	ckptGB := fs.Float64("checkpoint-gb", -1, "checkpoint size in GB restored at every (re)start, charged egress and restore time (default: the sim block's checkpoint_gb; 0: none)")
	ckptRegion := fs.String("checkpoint-region", "", "region of the checkpoint store (default: the sim block's checkpoint_region, else the first zone's region)")
	noEgress := fs.Bool("no-egress", false, "hide the checkpoint's egress from placement (still charged): the comparison run for -checkpoint-gb")
	verbose := fs.Bool("v", false, "log every run's plan actions and rounds on stderr (use with -start and few policies)")
	jobShapes := fs.String("job-shapes", "", "comma-separated job shapes (throughput per node count, docs/sim.md): near-linear, comm-bound, knee-4; "+
		"compares the policies (default: the optimum, fleetd at max_nodes and goodput, the autoscaler) per shape")
	var work, deadline, changeover, latency, interval durationFlag
	fs.Var(&work, "work", "job length at max_nodes (default: the spec's work)")
	fs.Var(&deadline, "deadline", "deadline after each window's start (default: the spec's deadline minus the trace start)")
	fs.Var(&changeover, "changeover", "cost of one (re)start, launch included (default: the block's changeover, 12m; with -workload: 30s in the pool setting, the published Pollux simulator's, and 1m in the cloud setting, the daemon's restart_changeover)")
	fs.Var(&latency, "launch-latency", "launch until the agent joins (default: the block's launch_latency, 2m)")
	fs.Var(&interval, "interval", "how often the deadline policy is consulted off steady spot (default: the trace tick; with -workload: the scheduling interval, 1m)")
	var vars varFlag
	varFiles := registerVars(fs, &vars)
	wl := addWorkloadFlags(fs)
	setUsage(fs, stderr,
		"Usage: fleetd sim -spec FILE [-trace DIR] [-start T,...] [-windows N] [-seed S] [-json] [flags]",
		"\nRuns fleetd's reconciler, placement and deadline policies in virtual time over a spot",
		"trace, for many start windows, and compares them with baselines and the omniscient optimum.",
	)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if wl.path != "" && *specPath == "" && fs.NArg() == 0 {
		wl.trace = *traceDir
		return wl.run(*policies, interval.d, changeover.d, *asJSON, stdout, stderr)
	}
	if *specPath == "" || fs.NArg() > 0 {
		fs.Usage()
		return exitUsage
	}
	if err := varFiles.report(stderr); err != nil {
		return exitCode(stderr, err)
	}
	f, files, diags := loadSpec(*specPath, vars)
	if len(diags) > 0 {
		width, color := diagStyle(stderr)
		_ = spec.WriteDiagnostics(stderr, files, diags, width, color)
	}
	if diags.HasErrors() {
		return exitUsage
	}
	fl, err := pickFleet(f, *fleetName)
	if err != nil {
		return exitCode(stderr, usageError{err})
	}
	setup, err := simSetup(fl, *traceDir, *zones, *starts)
	if err != nil {
		return exitCode(stderr, usageError{err})
	}
	setup.Windows, setup.Seed, setup.Parallel, setup.Interval, setup.Warm = *windows, *seed, *parallel, interval.d, *warm
	if *verbose {
		setup.Log, setup.Parallel = stderr, 1
	}
	setup.Job = simulate.Job{Work: work.d, Deadline: deadline.d, Changeover: changeover.d, LaunchLatency: latency.d}
	switch {
	case *ckptGB == 0:
		setup.Job.CheckpointBytes = -1 // none, whatever the block says
	case *ckptGB > 0:
		setup.Job.CheckpointBytes = int64(*ckptGB * 1e9)
	}
	setup.Job.CheckpointRegion = *ckptRegion
	setup.NoEgress = *noEgress
	if *policies != "" {
		if setup.Policies, err = simulate.SelectPolicies(strings.Split(*policies, ",")); err != nil {
			return exitCode(stderr, usageError{err})
		}
	}
	if err := setup.Prepare(); err != nil {
		return exitCode(stderr, usageError{err})
	}
	if len(setup.Starts) == 0 && setup.Windows < 1 {
		return exitCode(stderr, usageError{fmt.Errorf("-windows must be at least 1")})
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *jobShapes != "" {
		return simShapes(ctx, setup, fl, *jobShapes, *policies == "", *asJSON, stdout, stderr)
	}
	began := time.Now()
	res, err := setup.Run(ctx)
	if err != nil {
		return exitCode(stderr, err)
	}
	m := setup.Market()
	rep := simulate.Report{Trace: setup.Trace.Name, Fleet: fl.Name, Zones: m.Zones(), Tick: m.Offers[0].Series.Tick,
		Job: setup.Job, Windows: max(len(setup.Starts), setup.Windows), Seed: setup.Seed, Interval: setup.Interval, Warm: setup.Warm, NoEgress: setup.NoEgress,
		Wall: time.Since(began), Policies: simulate.Summarize(setup.Policies, len(m.Offers), res)}
	if len(setup.Starts) > 0 {
		rep.Windows = len(setup.Starts)
	}
	if *asJSON {
		if *results {
			rep.Results = res
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return exitCode(stderr, enc.Encode(rep))
	}
	return exitCode(stderr, rep.WriteText(stdout))
}

func pickFleet(f *spec.File, name string) (*spec.Fleet, error) {
	if name != "" {
		if fl := f.Fleet(name); fl != nil {
			return fl, nil
		}
		return nil, fmt.Errorf("spec %s has no fleet %q", f.Filename, name)
	}
	if len(f.Fleets) != 1 {
		return nil, fmt.Errorf("spec %s has %d fleets: choose one with -fleet", f.Filename, len(f.Fleets))
	}
	return f.Fleets[0], nil
}

// simSetup loads the trace and applies -trace and -zones to the fleet's
// sim provider block.
func simSetup(fl *spec.Fleet, traceDir, zones, starts string) (*simulate.Setup, error) {
	pb, ok := fl.Provider(sim.Name)
	if !ok {
		return nil, fmt.Errorf("fleet %s has no provider %q block", fl.Name, sim.Name)
	}
	var raw map[string]any
	if err := json.Unmarshal(pb.Config, &raw); err != nil {
		return nil, fmt.Errorf("sim provider block: %w", err)
	}
	if traceDir != "" {
		raw["trace"] = traceDir
	}
	if zones != "" {
		var zs []string
		for _, z := range strings.Split(zones, ",") {
			if z = strings.TrimSpace(z); z != "" {
				zs = append(zs, z)
			}
		}
		raw["zones"] = zs
	}
	dir, _ := raw["trace"].(string)
	tr, err := sim.Load(dir)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	copyFl := *fl
	copyFl.Providers = []spec.Provider{{Name: sim.Name, Config: b}}
	for _, p := range fl.Providers {
		if p.Name != sim.Name {
			return nil, fmt.Errorf("fleet %s: the simulator runs only the %q provider, not %q", fl.Name, sim.Name, p.Name)
		}
	}
	setup := &simulate.Setup{Trace: tr, Fleet: &copyFl}
	if starts != "" {
		for _, s := range strings.Split(starts, ",") {
			s = strings.TrimSpace(s)
			t, err := time.Parse(time.RFC3339, s)
			if err != nil {
				d, derr := time.ParseDuration(s)
				if derr != nil {
					return nil, fmt.Errorf("-start %q: want an RFC 3339 time or an offset such as 72h", s)
				}
				t = tr.Start.Add(d)
			}
			setup.Starts = append(setup.Starts, t)
		}
	}
	return setup, nil
}

// simShapes runs the goodput comparison: the policies (fleetd at
// max_nodes and goodput unless -policies says) per job shape.
func simShapes(ctx context.Context, setup *simulate.Setup, fl *spec.Fleet, names string, defaultPolicies, asJSON bool, stdout, stderr io.Writer) int {
	var shapes []simulate.Shape
	for _, n := range strings.Split(names, ",") {
		sh, err := simulate.ShapeByName(strings.TrimSpace(n))
		if err != nil {
			return exitCode(stderr, usageError{err})
		}
		shapes = append(shapes, sh)
	}
	if defaultPolicies {
		pols, _ := simulate.SelectPolicies([]string{"optimum", "fleetd", "goodput"})
		setup.Policies = pols
	}
	rows, err := simulate.CompareShapes(ctx, setup, shapes)
	if err != nil {
		return exitCode(stderr, err)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return exitCode(stderr, enc.Encode(map[string]any{"trace": setup.Trace.Name, "fleet": fl.Name, "job": setup.Job,
			"max_nodes": fl.MaxNodes, "windows": max(len(setup.Starts), setup.Windows), "shapes": shapes, "rows": rows}))
	}
	return exitCode(stderr, simulate.WriteScalingTable(stdout, rows, shapes, setup.Job, fl.MaxNodes, max(len(setup.Starts), setup.Windows)))
}
