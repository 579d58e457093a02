package main

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/providers"
)

func init() {
	register(command{name: "check", synopsis: "Preflight: prove credentials, permissions, images, networks and quotas for a spec, launching nothing", run: runCheck})
}

func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("check", stderr)
	var sf specFlags
	sf.register(fs, stderr)
	quick := fs.Bool("quick", false, "only the cheap checks `apply` runs before launching")
	req, c, code, ok := sf.parse(fs, args, stderr,
		"Usage: fleetd check [-quick] [-var NAME=VALUE] [-json] FILE",
		"Runs each provider block's preflight through the daemon (with its credentials); exit 0 when nothing failed, 1 otherwise.")
	if !ok {
		return code
	}
	var rep api.CheckReport
	if err := c.Do(context.Background(), http.MethodPost, "/v1/check", nil, api.CheckRequest{ApplyRequest: req, Quick: *quick}, &rep); err != nil {
		return exitCode(stderr, daemonError(stderr, err))
	}
	if sf.json {
		printJSON(stdout, rep)
	} else {
		printCheck(stdout, rep)
	}
	if !rep.OK {
		return exitError
	}
	return exitOK
}

// checkMark is a result's symbol: ✓ ok, ✗ failed, – could not be checked.
func checkMark(s providers.CheckStatus) string {
	switch s {
	case providers.CheckOK:
		return "✓"
	case providers.CheckFailed:
		return "✗"
	}
	return "–"
}

// printCheck renders a preflight report: one block per provider, one row
// per check, the fix under every row that needs one.
func printCheck(w io.Writer, rep api.CheckReport) {
	failed, unavailable := 0, 0
	for _, pc := range rep.Providers {
		fmt.Fprintf(w, "fleet %q, provider %q\n", pc.Fleet, pc.Provider)
		if pc.Note != "" {
			fmt.Fprintf(w, "  – %s\n", pc.Note)
		}
		// Column widths by hand: fix lines sit between rows, which would
		// restart a tabwriter's alignment.
		wc, ws := 0, 0
		for _, r := range pc.Results {
			wc, ws = max(wc, len(r.Check)), max(ws, len(dash(r.Scope)))
		}
		for _, r := range pc.Results {
			switch r.Status {
			case providers.CheckFailed:
				failed++
			case providers.CheckUnavailable:
				unavailable++
			}
			fmt.Fprintf(w, "  %s  %-*s  %-*s  %s\n", checkMark(r.Status), wc, r.Check, ws, dash(r.Scope), r.Detail)
			if r.Status != providers.CheckOK && r.Fix != "" {
				fmt.Fprintf(w, "      fix: %s\n", r.Fix)
			}
		}
	}
	switch {
	case failed > 0:
		fmt.Fprintf(w, "%d check(s) failed", failed)
	default:
		fmt.Fprint(w, "All checks passed")
	}
	if unavailable > 0 {
		fmt.Fprintf(w, "; %d could not be checked here (–)", unavailable)
	}
	fmt.Fprintln(w, ".")
}
