package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/fleet/projects"
)

func init() {
	register(command{name: "projects", synopsis: "Show projects (quota, borrowed, lent, spend vs budget, queue); set or delete one", run: runProjects})
	register(command{name: "queue", synopsis: "Show the fleets waiting to start, in order, and why", run: runQueue})
	register(command{name: "resume", synopsis: "Resume a paused fleet", run: runResume})
}

func runProjects(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "set":
			return runProjectSet(args[1:], stdout, stderr)
		case "delete":
			return runProjectDelete(args[1:], stdout, stderr)
		}
	}
	return runRead(args, "projects", stdout, stderr, (*api.Client).Projects, printProjects)
}

func projectSetUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: fleetd projects set NAME -quota GPUS [-max GPUS] [-priority N]")
	fmt.Fprintln(w, "         [-budget-per-hour USD] [-budget-total USD] [-warn-at FRACTION] [-on-exhausted pause|stop] [-json]")
	fmt.Fprintln(w, "Creates or replaces a project (its whole settings: flags left out take their defaults).")
	fmt.Fprintln(w, "Stored by the daemon, it overrides daemon.hcl's project of that name and survives restarts.")
	fmt.Fprintln(w, "Needs the admin token in FLEETD_TOKEN.")
}

// runProjectSet is `fleetd projects set NAME …`.
func runProjectSet(args []string, stdout, stderr io.Writer) int {
	fs, cf := newClientFlagSet("projects set", stderr)
	fs.Usage = func() { projectSetUsage(stderr) }
	quota := fs.Int("quota", 0, "guaranteed GPUs (required)")
	maxG := fs.Int("max", 0, "most GPUs with borrowing (default: the quota)")
	prio := fs.Int("priority", 0, "queue order and borrowing weight (higher first)")
	perHour := fs.Float64("budget-per-hour", 0, "burn-rate cap in $/h: at it no nodes are added")
	total := fs.Float64("budget-total", 0, "total spend in $: at it on-exhausted happens")
	warnAt := fs.Float64("warn-at", 0, "fraction of a limit that raises an alert (default 0.8)")
	onEx := fs.String("on-exhausted", "", "pause or stop (default pause)")
	rest, err := parseInterleaved(fs, args)
	if err != nil {
		return exitUsage
	}
	quotaSet := false
	fs.Visit(func(f *flag.Flag) { quotaSet = quotaSet || f.Name == "quota" })
	if len(rest) != 1 || !quotaSet {
		projectSetUsage(stderr)
		return exitUsage
	}
	req := api.ProjectRequest{QuotaGPUs: *quota, MaxGPUs: *maxG, Priority: *prio}
	if *perHour != 0 || *total != 0 || *warnAt != 0 || *onEx != "" {
		req.Budget = &budget.Limits{PerHour: *perHour, Total: *total, WarnAt: *warnAt, OnExhausted: budget.Action(*onEx)}
	}
	// The daemon checks the same; checking here makes a mistake a usage
	// error before anything is sent.
	check := projects.Project{Name: rest[0], QuotaGPUs: req.QuotaGPUs, MaxGPUs: req.MaxGPUs, Budget: req.Budget}
	if check.MaxGPUs == 0 {
		check.MaxGPUs = check.QuotaGPUs
	}
	if err := projects.Validate(check); err != nil {
		return exitCode(stderr, usageError{err})
	}
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	out, err := c.SetProject(context.Background(), rest[0], req)
	if err != nil {
		return exitCode(stderr, adminError(err, "changing projects"))
	}
	if cf.json {
		printJSON(stdout, out)
		return exitOK
	}
	fmt.Fprintf(stdout, "Project %s %s: quota %d, max %d GPUs, priority %d%s.\n", out.Name, out.Action, out.QuotaGPUs, out.MaxGPUs, out.Priority, budgetSummary(out.Budget))
	return exitOK
}

func budgetSummary(b *budget.Limits) string {
	if b == nil {
		return ", no budget"
	}
	var parts []string
	if b.PerHour > 0 {
		parts = append(parts, usd(b.PerHour)+"/h")
	}
	if b.Total > 0 {
		parts = append(parts, usd(b.Total)+" total")
	}
	return fmt.Sprintf(", budget %s (warn at %g, on exhausted %s)", dash(strings.Join(parts, ", ")), b.WarnAt, b.OnExhausted)
}

// runProjectDelete is `fleetd projects delete NAME`.
func runProjectDelete(args []string, stdout, stderr io.Writer) int {
	fs, cf := newClientFlagSet("projects delete", stderr)
	rest, err := parseInterleaved(fs, args)
	if err != nil || len(rest) != 1 {
		fmt.Fprintln(stderr, "Usage: fleetd projects delete [-json] NAME")
		fmt.Fprintln(stderr, "Deletes a project (daemon.hcl's too: the deletion is stored). Refused while fleets of it run.")
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	out, err := c.DeleteProject(context.Background(), rest[0])
	if err != nil {
		return exitCode(stderr, adminError(err, "changing projects"))
	}
	if cf.json {
		printJSON(stdout, out)
		return exitOK
	}
	fmt.Fprintf(stdout, "Project %s deleted.\n", out.Name)
	return exitOK
}

// adminError explains a 403 on an admin-only call.
func adminError(err error, what string) error {
	var he *api.HTTPError
	if errors.As(err, &he) && he.StatusCode == http.StatusForbidden {
		return fmt.Errorf("%w (%s needs the admin token in FLEETD_TOKEN)", err, what)
	}
	return err
}

// runRead is a command that reads one API resource and prints it (-json:
// as is).
func runRead[T any](args []string, name string, stdout, stderr io.Writer, get func(*api.Client, context.Context) (T, error), print func(io.Writer, T)) int {
	fs, cf := newClientFlagSet(name, stderr)
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		fmt.Fprintf(stderr, "Usage: fleetd %s [-json]\n", name)
		return exitUsage
	}
	return show(cf, stdout, stderr, get, print)
}

// show gets one API resource and prints it (-json: as is).
func show[T any](cf *clientFlags, stdout, stderr io.Writer, get func(*api.Client, context.Context) (T, error), print func(io.Writer, T)) int {
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

// setBy names where a project's settings come from (api.Project.Source).
var setBy = map[string]string{"config": "daemon.hcl", "api": "admin"}

// printProjects renders GET /v1/projects as a table.
func printProjects(w io.Writer, r api.ProjectsResponse) {
	fmt.Fprintf(w, "Pool: %d of %d GPUs allocated\n", r.UsedGPUs, r.PoolGPUs)
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECT\tQUOTA\tMAX\tPRIO\tUSED\tBORROWED\tLENT\tQUEUED\tSPEND\tBUDGET\tSTATE\tFLEETS\tSET BY")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", p.Name, quota, maxG, p.Priority, p.UsedGPUs, p.BorrowedGPUs, p.LentGPUs,
			p.Queued, spend, dash(limit), st, dash(strings.Join(p.Fleets, ",")), dash(setBy[p.Source]))
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
	fs, cf := newClientFlagSet("resume", stderr)
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
