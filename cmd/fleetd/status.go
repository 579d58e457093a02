package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

func init() {
	register(command{name: "status", synopsis: "Show fleets and their nodes", run: runStatus})
	register(command{name: "destroy", synopsis: "Terminate a fleet's nodes and forget it", run: runDestroy})
	register(command{name: "events", synopsis: "Show the event log (-f follows)", run: runEvents})
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	if err := fs.Parse(args); err != nil || fs.NArg() > 1 {
		fmt.Fprintln(stderr, "Usage: fleetd status [-json] [FLEET]")
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	ctx := context.Background()
	if fs.NArg() == 1 {
		d, err := c.Fleet(ctx, fs.Arg(0))
		if err != nil {
			return exitCode(stderr, err)
		}
		if cf.json {
			printJSON(stdout, d)
			return exitOK
		}
		printFleets(stdout, []api.FleetSummary{d.FleetSummary})
		fmt.Fprintln(stdout)
		printNodes(stdout, d.Nodes)
		return exitOK
	}
	st, err := c.Status(ctx)
	if err != nil {
		return exitCode(stderr, err)
	}
	if cf.json {
		printJSON(stdout, st)
		return exitOK
	}
	fmt.Fprintf(stdout, "fleetd %s, daemon %s, up %s\n\n", st.Version, st.DaemonID, age(st.Time.Sub(st.StartedAt)))
	if len(st.Fleets) == 0 {
		fmt.Fprintln(stdout, "No fleets. Apply one with: fleetd apply FILE")
		return exitOK
	}
	printFleets(stdout, st.Fleets)
	return exitOK
}

func printFleets(w io.Writer, fleets []api.FleetSummary) {
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "FLEET\tGEN\tRUNNING\tTARGET\tMIN..MAX\tOTHER\t$/H\tPROVIDERS")
	for _, f := range fleets {
		name := f.Name
		if f.Destroying {
			name += " (destroying)"
		}
		other := strings.TrimSuffix(strings.TrimPrefix(stateCounts(f.NodesByState), " ("), ")")
		if other == "" {
			other = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d..%d\t%s\t%.2f\t%s\n", name, f.Generation, f.NodesByState["running"], f.TargetNodes, f.MinNodes, f.MaxNodes, other, f.CostPerHour, strings.Join(f.Providers, ","))
	}
	tw.Flush()
}

func printNodes(w io.Writer, nodes []api.NodeInfo) {
	if len(nodes) == 0 {
		fmt.Fprintln(w, "No nodes.")
		return
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tPROVIDER\tZONE\tTYPE\tCAPACITY\t$/H\tAGE\tROUND\tADDRESS\tREASON")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%s\t%d\t%s\t%s\n", n.ID, n.State, n.Provider, n.Zone, n.InstanceType, n.CapacityType, n.PricePerHour,
			age(time.Duration(n.AgeSeconds*float64(time.Second))), n.Round, dash(n.Address), n.Reason)
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runDestroy(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("destroy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(stderr, "Usage: fleetd destroy [-json] FLEET")
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	f, err := c.Destroy(context.Background(), fs.Arg(0))
	if err != nil {
		return exitCode(stderr, err)
	}
	if cf.json {
		printJSON(stdout, f)
	} else {
		fmt.Fprintf(stdout, "Fleet %q is being destroyed; its nodes are terminated and the fleet is removed when none is left.\n", f.Name)
	}
	return exitOK
}

func runEvents(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	follow := fs.Bool("f", false, "follow: keep printing new events")
	since := fs.Uint64("since", 0, "only events after this sequence number")
	fleetName := fs.String("fleet", "", "only events of this fleet")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "Usage: fleetd events [-f] [-since N] [-fleet NAME] [-json]")
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	ctx := context.Background()
	next := *since
	for {
		wait := time.Duration(0)
		if *follow {
			wait = 30 * time.Second
		}
		r, err := c.Events(ctx, next, 1000, wait)
		if err != nil {
			if *follow {
				// The daemon may be restarting; keep following.
				fmt.Fprintln(stderr, "fleetd events:", err, "(retrying)")
				time.Sleep(2 * time.Second)
				continue
			}
			return exitCode(stderr, err)
		}
		for _, e := range r.Events {
			if *fleetName != "" && e.Fleet != *fleetName {
				continue
			}
			if cf.json {
				printJSON(stdout, e)
				continue
			}
			who := e.Fleet
			if e.Node != "" {
				who += "/" + e.Node
			}
			fmt.Fprintf(stdout, "%6d  %s  %-18s %-22s %s\n", e.Seq, e.Time.Local().Format("15:04:05.000"), e.Type, dash(who), e.Message)
		}
		next = r.Next
		if !*follow && len(r.Events) < 1000 {
			return exitOK
		}
	}
}
