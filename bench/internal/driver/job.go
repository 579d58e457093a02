package driver

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fleetd/fleetd/bench/internal/report"
)

// The scenarios both benchmarks play, in the order they report them.
const (
	ScenKill       = "kill"
	ScenAdd        = "add"
	ScenNotice     = "notice"
	ScenKillSilent = "kill_silent" // SIGSTOP: peers learn of it only through timeouts
)

// Scenarios are the scenarios in report order.
var Scenarios = []string{ScenNotice, ScenKill, ScenAdd, ScenKillSilent}

// Config is what every system of a benchmark runs the job with.
type Config struct {
	Python, Script, Fleetd string
	KeepAliveLauncher      string // bench/torchrun_keepalive.py
	StepTime               float64
	CkptEvery              int
	Lead                   time.Duration
	StartTimeout           time.Duration
	ScenarioTimeout        time.Duration
}

// Flags registers the flags every benchmark has on the default flag set,
// with d's script, checkpoint interval and timeouts as defaults.
func (c *Config) Flags(d Config) {
	flag.StringVar(&c.Python, "python", "/usr/bin/python3", "the Python with torch (Debian python3-torch)")
	flag.StringVar(&c.Script, "script", d.Script, "the training script")
	flag.StringVar(&c.Fleetd, "fleetd", "bin/fleetd", "the fleetd binary")
	flag.StringVar(&c.KeepAliveLauncher, "torchrun-launcher", "bench/torchrun_keepalive.py", "torchrun with a settable keep-alive, for torchrun at fleetd's timeouts")
	flag.Float64Var(&c.StepTime, "step-time", 0.1, "--step-time of the job (seconds of simulated compute per step)")
	flag.IntVar(&c.CkptEvery, "ckpt-every", d.CkptEvery, "--ckpt-every of the job (periodic checkpoint interval, steps)")
	flag.DurationVar(&c.Lead, "lead", 30*time.Second, "spot notice lead (GCE gives 30 s, AWS 2 min)")
	flag.DurationVar(&c.StartTimeout, "start-timeout", d.StartTimeout, "time for the job to start training")
	flag.DurationVar(&c.ScenarioTimeout, "scenario-timeout", d.ScenarioTimeout, "time for training to resume after an event")
}

// Begin makes the config's paths absolute (the benchmarks change
// directories for the processes they start), checks that the training
// script is there and begins the run (Begin).
func (c *Config) Begin(prog string, keep bool) (*Run, context.Context, error) {
	if err := Abs(&c.Script, &c.Fleetd, &c.KeepAliveLauncher); err != nil {
		return nil, nil, err
	}
	if _, err := os.Stat(c.Script); err != nil {
		return nil, nil, err
	}
	return Begin(prog, keep)
}

// NeedFleetd says how to get the fleetd binary when it is missing.
func (c Config) NeedFleetd() error {
	if _, err := os.Stat(c.Fleetd); err != nil {
		return fmt.Errorf("%w (run `make build`)", err)
	}
	return nil
}

// Spec is the benchmarks' fleet (Spec) running the job's worker, the same
// command line as under torchrun, with its checkpoint under dir.
func (c Config) Spec(dir, addressPrefix, elastic string, train func(ckpt string) []string) Spec {
	return Spec{StateDir: StateDir(dir), AddressPrefix: addressPrefix, Lead: c.Lead, Elastic: elastic,
		Command: append([]string{c.Python, c.Script}, train(filepath.Join(dir, "ckpt"))...)}
}

// Finish prints the figures' summary, writes them to jsonOut (when set)
// and exits non-zero when a figure missed its target; the run's logs stay
// then (os.Exit skips the deferred End).
func (r *Run) Finish(rep *report.Reporter, jsonOut string) {
	if rep.Finish(r.Prog, jsonOut) > 0 {
		fmt.Printf("%s: logs kept in %s\n", r.Prog, r.Work)
		os.Exit(1) // bench/run.sh counts a program that fails as a miss
	}
}

// Fatal prints err as prog's and exits.
func Fatal(prog string, err error) {
	fmt.Fprintln(os.Stderr, prog+":", err)
	os.Exit(1)
}

// Liner is a timeline fed the nodes' output lines.
type Liner interface{ Add(node, line string) }

// FleetdJob runs the job under a real `fleetd serve -dev` with the
// embedded local provider (Fleetd: every node a real agent process tree in
// a session of its own, booted from the daemon's cloud-init user-data) and
// rebuilds its timeline from the nodes' worker logs (Follow).
type FleetdJob[T Liner] struct {
	Cfg   Config
	Dir   string
	D     *Fleetd
	fresh func() T
	tl    Latest[T]
}

// NewFleetdJob is a job in dir whose timeline starts as fresh().
func NewFleetdJob[T Liner](cfg Config, dir string, fresh func() T) *FleetdJob[T] {
	f := &FleetdJob[T]{Cfg: cfg, Dir: dir, fresh: fresh}
	f.tl.Set(fresh())
	return f
}

// Start runs the dev daemon, applies spec and follows the nodes' logs
// until ctx ends.
func (f *FleetdJob[T]) Start(ctx context.Context, spec Spec) error {
	d, err := StartFleetd(ctx, f.Cfg.Fleetd, f.Dir, spec)
	f.D = d
	if err != nil {
		return err
	}
	go Follow(ctx, d, f.fresh, f.tl.Set)
	return nil
}

// Timeline is the newest timeline.
func (f *FleetdJob[T]) Timeline() T { return f.tl.Get() }

// Stop ends the daemon and its nodes (if it started).
func (f *FleetdJob[T]) Stop() {
	if f.D != nil {
		f.D.Stop()
	}
}

// TorchrunJob runs the job under Debian's torchrun 1.13: agent processes
// on this machine ("nodes" A, B, C, …, each its own session; Torchrun),
// c10d rendezvous hosted by node TorchrunHost, at fleetd's timeouts (the
// headline) or at torchrun's defaults (package trargs).
type TorchrunJob[T Liner] struct {
	Cfg      Config
	Defaults bool // torchrun's defaults, not fleetd's timeouts
	Dir      string
	TL       T
	Agent    Agent
	Nodes    *Torchrun
}

// NewTorchrunJob sets up the agents' command line (train: the worker's
// arguments) with their logs and checkpoint in dir, feeding tl; no agent
// runs yet.
func NewTorchrunJob[T Liner](cfg Config, defaults bool, dir string, train func(ckpt string) []string, tl T) (*TorchrunJob[T], error) {
	t := &TorchrunJob[T]{Cfg: cfg, Defaults: defaults, Dir: dir, TL: tl}
	t.Agent = Agent{Defaults: defaults, Launcher: cfg.KeepAliveLauncher, Script: cfg.Script, Train: train, Dir: dir}
	nodes, err := NewTorchrun(TorchrunConfig{Python: cfg.Python, Dir: dir, Argv: t.Agent.Argv, Line: tl.Add})
	t.Nodes = nodes
	return t, err
}

// SetDir sets where the nodes' logs and the checkpoint go (before the
// first Start).
func (t *TorchrunJob[T]) SetDir(dir string) {
	t.Dir, t.Agent.Dir = dir, dir
	t.Nodes.SetDir(dir)
}
