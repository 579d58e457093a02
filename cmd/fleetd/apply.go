package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/autoscale"
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
		printScaling(w, f.Scaling)
	}
}

// printScaling renders the autoscaler's decision and model in a plan.
func printScaling(w io.Writer, s *api.ScalingInfo) {
	if s == nil {
		return
	}
	fmt.Fprintf(w, "    size (scale = %s, %s): %s\n", s.Policy, s.Reason, s.Explain)
	if m := s.Model; m != nil {
		if m.Fixed {
			fmt.Fprintf(w, "    model: one size measured (%v, %d rounds): %.4g node-seconds per sample there; other sizes are bounds only\n", m.Sizes, m.Points, m.A)
		} else {
			fmt.Fprintf(w, "    model: y(N) = N/X(N) = %.4g + %.4g·(N−1) node-seconds per sample (σ %.2g), fitted to sizes %v (%d rounds)", m.A, m.B, m.Sigma, m.Sizes, m.Points)
			if m.CeilingSamplesPerSecond > 0 {
				fmt.Fprintf(w, "; throughput ceiling %s", autoscale.Rate(m.CeilingSamplesPerSecond))
			}
			fmt.Fprintln(w)
		}
	}
	if len(s.Options) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "    NODES\tSAMPLES/S\tRANGE\tMEASURED\t$/H\t$/1M SAMPLES\tUSEFUL\tNOTE")
	for _, o := range s.Options {
		x, rng, meas, per := "-", "-", "-", "-"
		if o.SamplesPerSecond > 0 {
			x = fmt.Sprintf("%.4g", o.SamplesPerSecond)
			per = fmt.Sprintf("%.4g", o.CostPerMillionSamples)
		}
		if o.High > 0 {
			rng = fmt.Sprintf("%.4g–%.4g", o.Low, o.High)
		}
		if o.Measured {
			meas = age(time.Duration(o.MeasuredSeconds * float64(time.Second)))
		}
		fmt.Fprintf(tw, "    %d\t%s\t%s\t%s\t%.2f\t%s\t%.0f%%\t%s\n", o.Nodes, x, rng, meas, o.CostPerHour, per, 100*o.Useful, o.Note)
	}
	tw.Flush()
}

func runPlan(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("plan", stderr)
	var sf specFlags
	sf.register(fs, stderr)
	detailed := fs.Bool("detailed-exitcode", false, "exit 0 when nothing would change, 1 on error, 2 when apply would change something")
	// With -detailed-exitcode every failure is 1, as in Terraform, so 2
	// means only "changes".
	detailedCode := func(code int) int {
		if *detailed && code != exitOK {
			return exitError
		}
		return code
	}
	req, c, code, ok := sf.parse(fs, args, stderr, "Usage: fleetd plan [-var NAME=VALUE] [-var-file FILE] [-detailed-exitcode] [-json] FILE")
	if !ok {
		return detailedCode(code)
	}
	p, err := c.Plan(context.Background(), req)
	if err != nil {
		return detailedCode(exitCode(stderr, daemonError(stderr, err)))
	}
	if sf.json {
		printJSON(stdout, p)
	} else {
		printPlan(stdout, p)
	}
	if *detailed && planChanges(p) {
		return exitUsage // 2: changes, by -detailed-exitcode's convention
	}
	return exitOK
}

// planChanges says whether applying p would change anything: a fleet to
// create, update or destroy, or nodes to launch or terminate.
func planChanges(p api.Plan) bool {
	for _, f := range p.Fleets {
		if f.Action != api.ActionNoop || f.Launch > 0 || f.Terminate > 0 {
			return true
		}
	}
	return false
}

func runApply(args []string, stdout, stderr io.Writer) int {
	return apply(args, os.Stdin, stdout, stderr)
}

// apply is the apply command with its confirmation read from in.
func apply(args []string, in io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("apply", stderr)
	var sf specFlags
	sf.register(fs, stderr)
	auto := fs.Bool("auto-approve", false, "do not ask for confirmation")
	wait := fs.Bool("wait", false, "follow progress until every fleet reaches its target")
	timeout := fs.Duration("timeout", 30*time.Minute, "with -wait: give up after this long")
	skipCheck := fs.Bool("skip-check", false, "do not run the preflight (fleetd check -quick) before applying")
	rest, err := parseInterleaved(fs, args)
	if err != nil || len(rest) != 1 {
		fmt.Fprintln(stderr, "Usage: fleetd apply [-auto-approve] [-wait] [-timeout D] [-skip-check] [-var NAME=VALUE] [-var-file FILE] [-json] FILE")
		return exitUsage
	}
	if sf.json && !*auto {
		// The plan and its question are for a person; a program reading
		// JSON approves explicitly, as with terraform apply -json.
		return exitCode(stderr, usageError{errors.New("-json needs -auto-approve")})
	}
	req, err := sf.request(rest[0], stderr)
	if err != nil {
		return exitCode(stderr, err)
	}
	req.SkipCheck = *skipCheck
	c, ctx, stop, err := sf.interruptible()
	if err != nil {
		return exitCode(stderr, err)
	}
	defer stop()
	if !*auto {
		p, err := c.Plan(ctx, req)
		if err != nil {
			return exitCode(stderr, daemonError(stderr, err))
		}
		printPlan(stdout, p)
		fmt.Fprint(stdout, "\nApply this plan? Only 'yes' is accepted: ")
		line, rerr := bufio.NewReader(in).ReadString('\n')
		if strings.TrimSpace(line) == "" && rerr != nil && !isTerminal(in) {
			fmt.Fprintln(stdout)
			return exitCode(stderr, errors.New("apply needs confirmation, and stdin is not a terminal: pass -auto-approve to apply without asking"))
		}
		if strings.TrimSpace(line) != "yes" {
			fmt.Fprintln(stderr, "Apply cancelled.")
			return exitError
		}
	}
	resp, err := c.Apply(ctx, req)
	if err != nil {
		return exitCode(stderr, daemonError(stderr, err))
	}
	if sf.json && !*wait {
		printJSON(stdout, resp)
		return exitOK
	}
	if sf.json {
		// -wait -json: a stream, one object a line, the apply result first.
		printJSONLine(stdout, resp)
	}
	if *auto && !sf.json {
		printPlan(stdout, resp.Plan)
	}
	for _, f := range resp.Fleets {
		if !sf.json {
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
	if err := waitConverged(ctx, c, names, *timeout, sf.json, stdout); err != nil {
		return exitCode(stderr, err)
	}
	return exitOK
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
