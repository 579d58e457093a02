package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec"
)

func init() {
	register(command{name: "apply", synopsis: "Create or update the fleets of a spec file", run: runApply})
	register(command{name: "plan", synopsis: "Show what apply would do", run: runPlan})
}

// specRequest parses the file locally first, so spec errors are reported
// with snippets before anything is sent, then builds the request.
func specRequest(path string, vars []string, stderr io.Writer) (api.ApplyRequest, error) {
	f, files, diags := loadSpec(path, vars)
	if diags.HasErrors() {
		_ = spec.WriteDiagnostics(stderr, files, diags, 100, false)
		return api.ApplyRequest{}, usageError{fmt.Errorf("%s is not a valid fleet spec", path)}
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return api.ApplyRequest{}, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return api.ApplyRequest{}, err
	}
	// Send exactly the inputs the local parse used (variables, files read,
	// env() values), so the daemon's parse gives the same fleets.
	return api.ApplyRequest{Filename: path, Source: string(src), Vars: f.Inputs, BaseDir: filepath.Dir(abs), Files: f.ReadFiles, Env: f.EnvUsed}, nil
}

// daemonError renders spec errors the daemon found (e.g. provider schemas it
// knows and the CLI does not) like local ones.
func daemonError(stderr io.Writer, err error) error {
	var he *api.HTTPError
	if errors.As(err, &he) && he.Body.Preflight != nil {
		printCheck(stderr, *he.Body.Preflight)
		return errors.New(he.Body.Error)
	}
	if errors.As(err, &he) && he.Body.Rendered != "" {
		fmt.Fprint(stderr, he.Body.Rendered)
		return usageError{errors.New(he.Body.Error)}
	}
	return err
}

func printPlan(w io.Writer, p api.Plan) {
	for _, f := range p.Fleets {
		sym := map[api.PlanAction]string{api.ActionCreate: "+", api.ActionUpdate: "~", api.ActionNoop: "=", api.ActionDestroy: "-"}[f.Action]
		fmt.Fprintf(w, "%s fleet %q: %s\n", sym, f.Fleet, f.Action)
		if len(f.Changes) > 0 {
			fmt.Fprintf(w, "    changes: %s\n", strings.Join(f.Changes, ", "))
		}
		fmt.Fprintf(w, "    nodes: %d now, target %d (min %d, max %d)", f.CurrentNodes, f.TargetNodes, f.MinNodes, f.MaxNodes)
		if f.Launch > 0 {
			fmt.Fprintf(w, "; launch %d", f.Launch)
		}
		if f.Terminate > 0 {
			fmt.Fprintf(w, "; terminate %d", f.Terminate)
		}
		fmt.Fprintln(w)
		if len(f.Offerings) > 0 {
			tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
			fmt.Fprintln(tw, "    NODES\tPROVIDER\tZONE\tTYPE\tCAPACITY\t$/H")
			for _, o := range f.Offerings {
				fmt.Fprintf(tw, "    %d\t%s\t%s\t%s\t%s\t%.3f\n", o.Nodes, o.Provider, o.Zone, o.InstanceType, o.CapacityType, o.PricePerHour)
			}
			tw.Flush()
			fmt.Fprintf(w, "    cost at target: $%.2f/h\n", f.CostPerHour)
		}
		for _, n := range f.Notes {
			fmt.Fprintf(w, "    note: %s\n", n)
		}
	}
}

func runPlan(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	var vars varFlag
	fs.Var(&vars, "var", "set a spec variable NAME=VALUE (repeatable)")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(stderr, "Usage: fleetd plan [-var NAME=VALUE] [-json] FILE")
		return exitUsage
	}
	req, err := specRequest(fs.Arg(0), vars, stderr)
	if err != nil {
		return exitCode(stderr, err)
	}
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	p, err := c.Plan(context.Background(), req)
	if err != nil {
		return exitCode(stderr, daemonError(stderr, err))
	}
	if cf.json {
		printJSON(stdout, p)
	} else {
		printPlan(stdout, p)
	}
	return exitOK
}

func runApply(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("apply", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	var vars varFlag
	fs.Var(&vars, "var", "set a spec variable NAME=VALUE (repeatable)")
	auto := fs.Bool("auto-approve", false, "do not ask for confirmation")
	wait := fs.Bool("wait", false, "follow progress until every fleet reaches its target")
	timeout := fs.Duration("timeout", 30*time.Minute, "with -wait: give up after this long")
	skipCheck := fs.Bool("skip-check", false, "do not run the preflight (fleetd check -quick) before applying")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(stderr, "Usage: fleetd apply [-auto-approve] [-wait] [-skip-check] [-var NAME=VALUE] [-json] FILE")
		return exitUsage
	}
	req, err := specRequest(fs.Arg(0), vars, stderr)
	if err != nil {
		return exitCode(stderr, err)
	}
	req.SkipCheck = *skipCheck
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if !*auto {
		p, err := c.Plan(ctx, req)
		if err != nil {
			return exitCode(stderr, daemonError(stderr, err))
		}
		printPlan(stdout, p)
		fmt.Fprint(stdout, "\nApply this plan? Only 'yes' is accepted: ")
		line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		if strings.TrimSpace(line) != "yes" {
			fmt.Fprintln(stderr, "Apply cancelled.")
			return exitError
		}
	}
	resp, err := c.Apply(ctx, req)
	if err != nil {
		return exitCode(stderr, daemonError(stderr, err))
	}
	if cf.json && !*wait {
		printJSON(stdout, resp)
		return exitOK
	}
	if *auto && !cf.json {
		printPlan(stdout, resp.Plan)
	}
	for _, f := range resp.Fleets {
		if !cf.json {
			fmt.Fprintf(stdout, "Applied fleet %q (generation %d).\n", f.Name, f.Generation)
		}
	}
	if !*wait {
		return exitOK
	}
	names := make([]string, 0, len(resp.Fleets))
	for _, f := range resp.Fleets {
		names = append(names, f.Name)
	}
	if err := waitConverged(ctx, c, names, *timeout, stdout); err != nil {
		return exitCode(stderr, err)
	}
	return exitOK
}

// waitConverged shows progress (counts by state, elapsed) until every named
// fleet has its target number of running nodes.
func waitConverged(ctx context.Context, c *api.Client, names []string, timeout time.Duration, w io.Writer) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last, lastPrint := "", time.Time{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		st, err := c.Status(ctx)
		if err != nil && ctx.Err() == nil {
			return err
		}
		done := err == nil
		var parts []string
		for _, f := range st.Fleets {
			if !contains(names, f.Name) {
				continue
			}
			if f.NodesByState["running"] != f.TargetNodes {
				done = false
			}
			parts = append(parts, progressLine(f))
		}
		line := strings.Join(parts, " | ")
		// A line on every change, and now and then while nothing changes,
		// so a long boot does not look like a hang.
		if line != last || time.Since(lastPrint) >= 15*time.Second {
			fmt.Fprintf(w, "[%6s] %s\n", time.Since(start).Truncate(time.Second), line)
			last, lastPrint = line, time.Now()
		}
		if done {
			fmt.Fprintf(w, "All fleets converged in %s.\n", time.Since(start).Truncate(time.Second))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleets did not converge within %s (last: %s)", timeout, last)
		case <-tick.C:
		}
	}
}

// progressLine is one fleet's progress while apply -wait follows it.
func progressLine(f api.FleetSummary) string {
	line := fmt.Sprintf("%s: %d/%d running%s", f.Name, f.NodesByState["running"], f.TargetNodes, stateCounts(f.NodesByState))
	if r := f.Rendezvous; r != nil {
		line += fmt.Sprintf(", round %d %s", r.Round, r.State)
		if r.State == "closed" {
			line += fmt.Sprintf(" (world size %d)", r.WorldSize)
		}
	}
	if f.CostPerHour > 0 {
		line += fmt.Sprintf(", $%.2f/h", f.CostPerHour)
	}
	if f.AlertCount > 0 {
		line += fmt.Sprintf(", %d alert(s)", f.AlertCount)
	}
	return line
}

func stateCounts(m map[string]int) string {
	var ks []string
	for k, v := range m {
		if k != "running" && k != "terminated" && v > 0 {
			ks = append(ks, fmt.Sprintf("%s=%d", k, v))
		}
	}
	sort.Strings(ks)
	if len(ks) == 0 {
		return ""
	}
	return " (" + strings.Join(ks, " ") + ")"
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}
