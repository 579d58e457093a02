package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

func init() {
	register(command{name: "projects", synopsis: "Show projects: quota, borrowed, lent, spend vs budget, queue", run: runProjects})
	register(command{name: "queue", synopsis: "Show the fleets waiting to start, in order, and why", run: runQueue})
	register(command{name: "resume", synopsis: "Resume a paused fleet", run: runResume})
}

func runProjects(args []string, stdout, stderr io.Writer) int {
	return runRead(args, "projects", stdout, stderr, (*api.Client).Projects, printProjects)
}

// runRead is a command that reads one API resource and prints it (-json:
// as is).
func runRead[T any](args []string, name string, stdout, stderr io.Writer, get func(*api.Client, context.Context) (T, error), print func(io.Writer, T)) int {
	fs := newFlagSet(name, stderr)
	var cf clientFlags
	cf.register(fs)
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		fmt.Fprintf(stderr, "Usage: fleetd %s [-json]\n", name)
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	r, err := get(c, context.Background())
	if err != nil {
		return exitCode(stderr, err)
	}
	if cf.json {
		printJSON(stdout, r)
		return exitOK
	}
	print(stdout, r)
	return exitOK
}

// printProjects renders GET /v1/projects as a table.
func printProjects(w io.Writer, r api.ProjectsResponse) {
	fmt.Fprintf(w, "Pool: %d of %d GPUs allocated\n", r.UsedGPUs, r.PoolGPUs)
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECT\tQUOTA\tMAX\tPRIO\tUSED\tBORROWED\tLENT\tQUEUED\tSPEND\tBUDGET\tSTATE\tFLEETS")
	for _, p := range r.Projects {
		quota, maxG := fmt.Sprint(p.QuotaGPUs), fmt.Sprint(p.MaxGPUs)
		if p.Unlimited {
			quota, maxG = "-", "-"
		}
		spend, limit, st := "-", "-", "-"
		if b := p.Budget; b != nil {
			spend, st = usd(b.SpentUSD), b.State
			var parts []string
			if b.TotalLimit > 0 {
				parts = append(parts, usd(b.TotalLimit))
			}
			if b.PerHourLimit > 0 {
				parts = append(parts, usd(b.PerHourLimit)+"/h")
			}
			limit = strings.Join(parts, " ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", p.Name, quota, maxG, p.Priority, p.UsedGPUs, p.BorrowedGPUs, p.LentGPUs,
			p.Queued, spend, dash(limit), st, dash(strings.Join(p.Fleets, ",")))
	}
	tw.Flush()
}

func runQueue(args []string, stdout, stderr io.Writer) int {
	return runRead(args, "queue", stdout, stderr, (*api.Client).Queue, func(w io.Writer, r api.QueueResponse) { printQueue(w, r, time.Now()) })
}

// printQueue renders GET /v1/queue in start order.
func printQueue(w io.Writer, r api.QueueResponse, now time.Time) {
	if len(r.Queue) == 0 {
		fmt.Fprintln(w, "No fleet is waiting.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tFLEET\tPROJECT\tPRIO\tWAITING\tREASON")
	for _, q := range r.Queue {
		pos := fmt.Sprint(q.Position)
		if q.Reserved {
			pos += " (reserved)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", pos, q.Fleet, q.Project, q.Priority, now.Sub(q.Since).Round(time.Second), q.Reason)
	}
	tw.Flush()
}

func runResume(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("resume", stderr)
	var cf clientFlags
	cf.register(fs)
	rest, err := parseInterleaved(fs, args)
	if err != nil || len(rest) != 1 {
		fmt.Fprintln(stderr, "Usage: fleetd resume [-json] FLEET")
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	if err := c.Resume(context.Background(), rest[0]); err != nil {
		return exitCode(stderr, unknownFleet(err, rest[0]))
	}
	if cf.json {
		printJSON(stdout, map[string]string{"status": "resumed", "fleet": rest[0]})
	} else {
		fmt.Fprintf(stdout, "Fleet %q resumed: it queues to start again (fleetd queue shows its place).\n", rest[0])
	}
	return exitOK
}
