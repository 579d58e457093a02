package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/simulate/multijob"
)

// workloadFlags are `fleetd sim -workload`'s own flags: the multi-job
// simulation (docs/sim.md, "Multi-job simulation").
type workloadFlags struct {
	path, apps, pool string
}

func addWorkloadFlags(fs *flag.FlagSet) *workloadFlags {
	w := &workloadFlags{}
	fs.StringVar(&w.path, "workload", "", "multi-job mode: a workload `FILE.csv` in Pollux's format (name,time,application,num_replicas,batch_size) instead of -spec")
	fs.StringVar(&w.apps, "apps", "", "with -workload: application models `DIR`, one directory per application (default: ../traces next to the workload's directory)")
	fs.StringVar(&w.pool, "pool", "16x4", "with -workload: the fixed pool, `NODESxGPUS`")
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
	cfg := multijob.Config{Apps: apps, Jobs: jobs, Nodes: nodes, PerNode: per, Interval: interval, Changeover: changeover}
	rep := workloadReport{Workload: w.path, Nodes: nodes, PerNode: per, Interval: interval, Wall: map[string]float64{}}
	if interval <= 0 {
		rep.Interval = time.Minute // multijob.Run's default, Pollux's
	}
	for _, p := range names {
		began := time.Now()
		res, err := multijob.Run(cfg, strings.TrimSpace(p))
		if err != nil {
			return exitCode(stderr, usageError{err})
		}
		rep.Wall[res.Policy] = time.Since(began).Seconds()
		rep.Results = append(rep.Results, res)
	}
	if pub, ok := multijob.Published[multijob.WorkloadNumber(w.path)]; ok && nodes*per == 64 {
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
	fmt.Fprintf(out, "workload %s: %d jobs, pool %dx%d GPUs, a decision every %s\n\n", r.Workload, len(r.Results[0].Jobs), r.Nodes, r.PerNode, r.Interval)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "policy\tavg JCT s\tp99 JCT s\tmakespan s\tGPU-h\trestarts\tunfinished\t"
	if r.Pollux != nil {
		head += "avg / Pollux's\t"
	}
	fmt.Fprintln(tw, head+"run time\t")
	for _, res := range r.Results {
		line := fmt.Sprintf("%s\t%.0f\t%.0f\t%.0f\t%.0f\t%d\t%d\t", res.Policy, res.AvgJCT.Seconds(), res.P99JCT.Seconds(), res.Makespan.Seconds(), res.GPUHours, res.Restarts, res.Unfinished)
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
