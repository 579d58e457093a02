// Command scale measures fleetd's control plane at scale and prints one
// FIGURE line per figure (see bench/internal/report):
//
//		scale [flags] [all|state|rendezvous|reconcile]
//
//	  - state: sustained durable event appends (batched) and state file size
//	    per 10,000 nodes;
//	  - rendezvous: N agents (a separate process of goroutines using the real
//	    rendezvous HTTP client) register, join and heartbeat against a real
//	    daemon on loopback: last join → every agent assigned, heartbeat rate
//	    and the daemon's CPU;
//	  - reconcile: a real daemon with a 10,000-node fleet on the in-memory
//	    provider: one reconcile pass (pure and as the daemon runs it), the
//	    resident memory, and an interruption storm.
//
// Every phase is bounded in time; `make bench` runs them all.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/bench/internal/report"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "agents" {
		// The agent swarm child (see agents.go).
		if err := runSwarm(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "agents:", err)
			os.Exit(1)
		}
		return
	}
	p := defaultParams()
	agents := flag.String("agents", "1000,5000", "comma-separated agent counts for the rendezvous benchmark")
	flag.IntVar(&p.Nodes, "nodes", p.Nodes, "fleet size for the reconcile benchmark")
	flag.IntVar(&p.StormNotices, "storm", p.StormNotices, "notices of the interruption storm")
	flag.DurationVar(&p.CPUWindow, "cpu-window", p.CPUWindow, "how long the daemon's CPU is measured under steady heartbeats")
	flag.DurationVar(&p.StateWindow, "state-window", p.StateWindow, "how long events are appended")
	appenders := flag.String("appenders", "64,256", "comma-separated counts of concurrent event appenders (the last one is checked against the target)")
	jsonOut := flag.String("json", "", "also write the figures to this JSON file")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (daemon included) to this file")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: scale [flags] [all|state|rendezvous|reconcile|stores]...")
		flag.PrintDefaults()
	}
	flag.Parse()
	what := flag.Args()
	if len(what) == 0 {
		what = []string{"all"}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	r := report.New(os.Stdout)
	run := func(name string, fn func() error) {
		start := time.Now()
		fmt.Printf("\n---- %s ----\n", name)
		if err := fn(); err != nil {
			fmt.Printf("%s: ERROR: %v\n", name, err)
			r.Missing(name+".completed", "", report.AtLeast, 1, err.Error())
		}
		fmt.Printf("%s: took %.1fs\n", name, time.Since(start).Seconds())
	}
	p.Agents, p.Appenders = intList("agents", *agents), intList("appenders", *appenders)
	benches := map[string]func(){
		"state": func() { run("state", func() error { return benchState(ctx, r, p) }) },
		"rendezvous": func() {
			for _, n := range p.Agents {
				run(fmt.Sprintf("rendezvous.%d", n), func() error { return benchRendezvous(ctx, r, n, p) })
			}
		},
		"reconcile": func() {
			run(fmt.Sprintf("reconcile.%d", p.Nodes), func() error { return benchReconcile(ctx, r, p) })
		},
		"stores": func() {
			run(fmt.Sprintf("stores.%d", p.Nodes), func() error { return benchStores(ctx, r, p) })
		},
	}
	for _, w := range what {
		if w == "all" {
			for _, b := range []string{"state", "rendezvous", "reconcile", "stores"} {
				benches[b]()
			}
			continue
		}
		b, ok := benches[w]
		if !ok {
			fmt.Fprintf(os.Stderr, "unknown benchmark %q\n", w)
			os.Exit(2)
		}
		b()
	}
	if r.Finish("scale", *jsonOut) > 0 {
		pprof.StopCPUProfile() // os.Exit skips the deferred one
		os.Exit(1)             // bench/run.sh counts a program that fails as a miss
	}
}

// params size every benchmark; the defaults are the figures.
type params struct {
	Agents    []int         // rendezvous: agents per run
	CPUWindow time.Duration // rendezvous: steady-heartbeat CPU window
	Flood     time.Duration // rendezvous: flat-out heartbeat window
	Nodes     int           // reconcile: fleet size
	// StormNotices notices are sent evenly over StormSpread; replacements
	// are awaited for StormWait.
	StormNotices           int
	StormSpread, StormWait time.Duration
	DaemonPasses           time.Duration // reconcile: how long daemon passes are observed
	StateWindow            time.Duration // state: append window per caller count
	Appenders              []int         // state: concurrent appenders (last one checked)
	SizeNodes              int           // state: nodes written for the file size
}

func defaultParams() params {
	return params{Agents: []int{1000, 5000}, CPUWindow: 20 * time.Second, Flood: 5 * time.Second,
		Nodes: 10000, StormNotices: 500, StormSpread: 2 * time.Second, StormWait: 75 * time.Second, DaemonPasses: 13 * time.Second,
		StateWindow: 10 * time.Second, Appenders: []int{64, 256}, SizeNodes: 10000}
}

// intList parses a comma-separated list of positive integers or exits 2.
func intList(flagName, v string) []int {
	var out []int
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bad -%s value %q\n", flagName, s)
			os.Exit(2)
		}
		out = append(out, n)
	}
	return out
}

// scratch is a benchmark's temporary directory (fleetd-bench-NAME-*) and
// ctx bounded by timeout; done ends the one and removes the other.
func scratch(ctx context.Context, name string, timeout time.Duration) (string, context.Context, func(), error) {
	dir, err := os.MkdirTemp("", "fleetd-bench-"+name+"-")
	if err != nil {
		return "", nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return dir, ctx, func() { cancel(); os.RemoveAll(dir) }, nil
}
