package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

// progressEvent is one line of `apply -wait -json`: the fleets' progress
// when it changed, and a last line with converged true, or false and the
// fleets' full last state on timeout.
type progressEvent struct {
	ElapsedSeconds float64           `json:"elapsed_seconds"`
	Fleets         []fleetProgress   `json:"fleets,omitempty"`
	Converged      *bool             `json:"converged,omitempty"`
	LastState      []api.FleetDetail `json:"last_state,omitempty"`
	Error          string            `json:"error,omitempty"`
}

// fleetProgress is one fleet in a progressEvent.
type fleetProgress struct {
	Name         string              `json:"name"`
	Running      int                 `json:"running"`
	Target       int                 `json:"target"`
	NodesByState map[string]int      `json:"nodes_by_state"`
	Rendezvous   *api.RendezvousInfo `json:"rendezvous,omitempty"`
	CostPerHour  float64             `json:"cost_per_hour,omitempty"`
	// Alerts are what the fleet is waiting on (quota, capacity, boot
	// failures): the reason a wait takes long.
	Alerts []api.AlertInfo `json:"alerts,omitempty"`
}

// waitConverged shows progress (counts by state, elapsed, the alerts a
// fleet is held by) until every named fleet has its target number of
// running nodes. On timeout it prints each fleet's last state.
func waitConverged(ctx context.Context, c *api.Client, names []string, timeout time.Duration, asJSON bool, w io.Writer) error {
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last, lastAlerts, lastPrint := "", "", time.Time{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	elapsed := func() time.Duration { return time.Since(start).Truncate(time.Second) }
	for {
		st, err := c.Status(wctx)
		if err != nil && wctx.Err() == nil {
			return err
		}
		done := err == nil
		var parts []string
		var fleets []fleetProgress
		for _, f := range st.Fleets {
			if !contains(names, f.Name) {
				continue
			}
			if f.NodesByState["running"] != f.TargetNodes {
				done = false
			}
			parts = append(parts, progressLine(f))
			fp := fleetProgress{Name: f.Name, Running: f.NodesByState["running"], Target: f.TargetNodes,
				NodesByState: f.NodesByState, Rendezvous: f.Rendezvous, CostPerHour: f.CostPerHour}
			if f.AlertCount > 0 {
				if d, err := c.Fleet(wctx, f.Name); err == nil {
					fp.Alerts = d.Alerts
				}
			}
			fleets = append(fleets, fp)
		}
		line, alerts := strings.Join(parts, " | "), alertLines(fleets)
		// A line on every change, and now and then while nothing changes,
		// so a long boot does not look like a hang.
		if line != last || alerts != lastAlerts || time.Since(lastPrint) >= 15*time.Second {
			if asJSON {
				printJSONLine(w, progressEvent{ElapsedSeconds: elapsed().Seconds(), Fleets: fleets})
			} else {
				fmt.Fprintf(w, "[%6s] %s\n", elapsed(), line)
				if alerts != lastAlerts {
					fmt.Fprint(w, alerts)
				}
			}
			last, lastAlerts, lastPrint = line, alerts, time.Now()
		}
		if done {
			if asJSON {
				ok := true
				printJSONLine(w, progressEvent{ElapsedSeconds: elapsed().Seconds(), Converged: &ok})
			} else {
				fmt.Fprintf(w, "All fleets converged in %s.\n", elapsed())
			}
			return nil
		}
		select {
		case <-wctx.Done():
			err := fmt.Errorf("fleets did not converge within %s (last: %s)", timeout, last)
			if ctx.Err() != nil {
				err = fmt.Errorf("stopped waiting after %s (last: %s): %w", elapsed(), last, ctx.Err())
			}
			printLastState(c, names, asJSON, elapsed(), err, w)
			return err
		case <-tick.C:
		}
	}
}

// alertLines says which alerts the wait is held by, one line each.
func alertLines(fleets []fleetProgress) string {
	var b strings.Builder
	for _, f := range fleets {
		for _, a := range f.Alerts {
			subj := ""
			if a.Subject != "" {
				subj = " " + a.Subject
			}
			fmt.Fprintf(&b, "         waiting on alert %s%s (fleet %s): %s\n", a.Kind, subj, f.Name, a.Message)
		}
	}
	return b.String()
}

// printLastState shows each fleet as `fleetd status FLEET` would, after a
// wait gave up, so the reason is on screen without another command.
func printLastState(c *api.Client, names []string, asJSON bool, elapsed time.Duration, cause error, w io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var details []api.FleetDetail
	var errs []error
	for _, n := range names {
		d, err := c.Fleet(ctx, n)
		if err != nil {
			errs = append(errs, fmt.Errorf("fleet %q: %w", n, err))
			continue
		}
		details = append(details, d)
	}
	if asJSON {
		no := false
		ev := progressEvent{ElapsedSeconds: elapsed.Seconds(), Converged: &no, LastState: details, Error: cause.Error()}
		if err := errors.Join(errs...); err != nil {
			ev.Error += "; " + err.Error()
		}
		printJSONLine(w, ev)
		return
	}
	fmt.Fprintln(w, "\nLast state:")
	for _, d := range details {
		fmt.Fprintln(w)
		printFleetDetail(w, d, time.Now())
	}
	for _, err := range errs {
		fmt.Fprintln(w, "  (could not read", err.Error()+")")
	}
}
