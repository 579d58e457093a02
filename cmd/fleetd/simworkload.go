package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/simulate/multijob"
	"github.com/fleetd/fleetd/providers/sim"
)

// workloadFlags are `fleetd sim -workload`'s own flags: the multi-job
// simulation (docs/sim.md, "Multi-job simulation").
type workloadFlags struct {
	path, apps, pool, setting, trace, chart, placement string
	scale                                              int
	budget                                             float64
	offset                                             durationFlag
}

func addWorkloadFlags(fs *flag.FlagSet) *workloadFlags {
	w := &workloadFlags{}
	fs.StringVar(&w.path, "workload", "", "multi-job mode: a workload `FILE.csv` in Pollux's format (name,time,application,num_replicas,batch_size) instead of -spec")
	fs.StringVar(&w.apps, "apps", "", "with -workload: application models `DIR`, one directory per application (default: ../traces next to the workload's directory)")
	fs.StringVar(&w.pool, "pool", "16x4", "with -workload: the fixed pool, `NODESxGPUS` (with -setting cloud: their GPUs are the daemon's max_gpus)")
	fs.StringVar(&w.setting, "setting", "pool", "with -workload: `pool` (a fixed pool) or cloud (1-GPU nodes bought on spot through -trace, on-demand fallback, a project per application; adds the per-fleet policy)")
	fs.IntVar(&w.scale, "capacity-scale", multijob.DefaultCapacityScale, "with -setting cloud: nodes one available instance of the trace stands for")
	fs.Float64Var(&w.budget, "budget", 0, "with -setting cloud: each project's budget in `$/h` (0: none)")
	fs.StringVar(&w.chart, "chart", "", "with -workload: write `DIR`/gpus.csv (every job's GPUs over time, per policy) and DIR/POLICY.svg (a stacked chart of GPUs per job)")
	fs.StringVar(&w.placement, "placement", "nodes", "with -setting pool: packed (every job on as few nodes as its GPU count allows, as if the pool never fragmented) or `nodes` (each node's free GPUs tracked: the gang baselines take the emptiest nodes first as the published simulator's Tiresias does, fleetd the best fit)")
	fs.Var(&w.offset, "trace-offset", "with -setting cloud: where the workload starts after the trace's start (default 0)")
	return w
}

// workloadReport is the -json output.
type workloadReport struct {
	Workload string            `json:"workload"`
	Nodes    int               `json:"nodes"`
	PerNode  int               `json:"gpus_per_node"`
	Interval time.Duration     `json:"interval"`
	Results  []multijob.Result `json:"results"`
	// Wall is each policy's run time in seconds.
	Wall   map[string]float64     `json:"wall_seconds"`
	Pollux *multijob.PublishedJCT `json:"published,omitempty"`
	// Placement is the pool's (packed or nodes); Changeover the stall of
	// every (re)allocation.
	Placement  string        `json:"placement,omitempty"`
	Changeover time.Duration `json:"changeover"`
	// Setting is pool or cloud; Trace and Budget the cloud's.
	Setting string  `json:"setting"`
	Trace   string  `json:"trace,omitempty"`
	Budget  float64 `json:"budget_per_hour,omitempty"`
}

func (w *workloadFlags) run(policies string, interval, changeover time.Duration, asJSON bool, stdout, stderr io.Writer) int {
	nodes, per, err := parsePool(w.pool)
	if err != nil {
		return exitCode(stderr, usageError{err})
	}
	jobs, err := multijob.LoadWorkload(w.path)
	if err != nil {
		return exitCode(stderr, usageError{err})
	}
	dir := w.apps
	if dir == "" {
		dir = filepath.Join(filepath.Dir(w.path), "..", "traces")
	}
	apps, err := multijob.LoadApps(dir)
	if err != nil {
		return exitCode(stderr, usageError{err})
	}
	names := multijob.Policies
	if policies != "" {
		names = strings.Split(policies, ",")
	}
	cfg := multijob.Config{Apps: apps, Jobs: jobs, Nodes: nodes, PerNode: per, Interval: interval, Changeover: changeover, Placement: w.placement}
	rep := workloadReport{Workload: w.path, Nodes: nodes, PerNode: per, Interval: interval, Wall: map[string]float64{}, Setting: w.setting}
	switch w.setting {
	case "pool":
		if cfg.Changeover <= 0 {
			cfg.Changeover = multijob.PolluxChangeover
		}
		rep.Placement = w.placement
	case "cloud":
		dir := w.trace
		if dir == "" {
			dir = filepath.Join("configs", "traces", "aws-v100-2023-02-15")
		}
		tr, err := sim.Load(dir)
		if err != nil {
			return exitCode(stderr, usageError{fmt.Errorf("-setting cloud: %w", err)})
		}
		cfg.Cloud = &multijob.Cloud{Trace: tr, Offset: w.offset.d, Scale: w.scale, BudgetPerHour: w.budget}
		rep.Trace, rep.Budget = dir, w.budget
		if policies == "" {
			names = multijob.CloudPolicies
		}
	default:
		return exitCode(stderr, usageError{fmt.Errorf("-setting %q: want pool or cloud", w.setting)})
	}
	if interval <= 0 {
		rep.Interval = time.Minute // multijob.Run's default, Pollux's
	}
	rep.Changeover = cmp.Or(cfg.Changeover, allocator.DefaultRestartChangeover)
	for _, p := range names {
		began := time.Now()
		res, err := multijob.Run(cfg, strings.TrimSpace(p))
		if err != nil {
			return exitCode(stderr, usageError{err})
		}
		rep.Wall[res.Policy] = time.Since(began).Seconds()
		rep.Results = append(rep.Results, res)
	}
	if w.chart != "" {
		if err := writeCharts(w.chart, rep.Results); err != nil {
			return exitCode(stderr, err)
		}
	}
	if pub, ok := multijob.Published[multijob.WorkloadNumber(w.path)]; ok && nodes*per == 64 && cfg.Cloud == nil {
		rep.Pollux = &pub
	}
	if asJSON {
		doc, err := secondsJSON(rep)
		if err != nil {
			return exitCode(stderr, err)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return exitCode(stderr, enc.Encode(doc))
	}
	return exitCode(stderr, rep.writeText(stdout))
}

func (r *workloadReport) writeText(out io.Writer) error {
	cloud := r.Setting == "cloud"
	if cloud {
		budget := "no budget"
		if r.Budget > 0 {
			budget = fmt.Sprintf("$%.2f/h per project", r.Budget)
		}
		fmt.Fprintf(out, "workload %s: %d jobs, cloud: 1-GPU nodes on spot through %s, at most %d GPUs for the pooled policies, %s, a decision every %s\n\n",
			r.Workload, len(r.Results[0].Jobs), r.Trace, r.Nodes*r.PerNode, budget, r.Interval)
	} else {
		fmt.Fprintf(out, "workload %s: %d jobs, pool %dx%d GPUs (%s placement), a decision every %s, %s stall per (re)allocation\n\n",
			r.Workload, len(r.Results[0].Jobs), r.Nodes, r.PerNode, r.Placement, r.Interval, r.Changeover)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "policy\tavg JCT s\tp90 JCT s\tp99 JCT s\tmakespan s\tGPU-h\trestarts\tunfinished\t"
	if cloud {
		head += "cost $\t$/job\ton-demand h\tpreemptions\t"
	}
	if r.Pollux != nil {
		head += "avg / Pollux's\t"
	}
	fmt.Fprintln(tw, head+"run time\t")
	for _, res := range r.Results {
		line := fmt.Sprintf("%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%d\t%d\t", res.Policy, res.AvgJCT.Seconds(), res.P90JCT.Seconds(), res.P99JCT.Seconds(), res.Makespan.Seconds(), res.GPUHours, res.Restarts, res.Unfinished)
		if cloud {
			line += fmt.Sprintf("%.0f\t%.2f\t%.0f\t%d\t", res.Cost, res.CostPerJob, res.OnDemandHours, res.Preemptions)
		}
		if r.Pollux != nil {
			line += fmt.Sprintf("%.2f\t", res.AvgJCT.Seconds()/r.Pollux.Pollux)
		}
		fmt.Fprintln(tw, line+(time.Duration(r.Wall[res.Policy]*float64(time.Second))).Round(time.Millisecond).String()+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Pollux != nil {
		_, err := fmt.Fprintf(out, "\npublished (Pollux's simulator, 16x4): avg JCT Pollux %.0f s, Tiresias %.0f s, Optimus+Oracle %.0f s\n", r.Pollux.Pollux, r.Pollux.Tiresias, r.Pollux.Optimus)
		return err
	}
	return nil
}

// parsePool reads NODESxGPUS.
func parsePool(s string) (int, int, error) {
	a, b, ok := strings.Cut(strings.ToLower(s), "x")
	n, err1 := strconv.Atoi(a)
	g, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || n < 1 || g < 1 {
		return 0, 0, fmt.Errorf("-pool %q: want NODESxGPUS, such as 16x4", s)
	}
	return n, g, nil
}

// writeCharts writes -chart's files.
func writeCharts(dir string, results []multijob.Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("-chart: %w", err)
	}
	write := func(name string, fn func(io.Writer) error) error {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("-chart: %w", err)
		}
		if err := fn(f); err != nil {
			f.Close()
			return fmt.Errorf("-chart %s: %w", name, err)
		}
		return f.Close()
	}
	if err := write("gpus.csv", func(w io.Writer) error { return multijob.WriteGPUsCSV(w, results) }); err != nil {
		return err
	}
	for _, r := range results {
		if err := write(r.Policy+".svg", func(w io.Writer) error { return multijob.WriteChart(w, r) }); err != nil {
			return err
		}
	}
	return nil
}
