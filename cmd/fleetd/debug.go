package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/placement"
)

func init() {
	register(command{name: "debug", synopsis: "Operator tools: inject an interruption (debug interrupt FLEET NODE)", run: runDebug})
	register(command{name: "logs", synopsis: "Show the tail of a fleet's worker logs", run: runLogs})
	register(command{name: "offerings", synopsis: "Show the ranked market view for a spec's fleets", run: runOfferings})
}

func runDebug(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "interrupt" {
		fmt.Fprintln(stderr, "Usage: fleetd debug interrupt [-kind KIND] [-lead D] FLEET NODE")
		return exitUsage
	}
	fs, cf := newClientFlagSet("debug interrupt", stderr)
	kind := fs.String("kind", "spot-interruption", "spot-interruption, rebalance, maintenance, preempted or lost")
	lead := fs.Duration("lead", 0, "time until the node is reclaimed (default: the provider's notice lead)")
	rest, err := parseInterleaved(fs, args[1:])
	if err != nil || len(rest) != 2 {
		fmt.Fprintln(stderr, "Usage: fleetd debug interrupt [-kind KIND] [-lead D] FLEET NODE")
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	var out map[string]string
	path := "/v1/fleets/" + url.PathEscape(rest[0]) + "/nodes/" + url.PathEscape(rest[1]) + "/interrupt"
	if err := c.Do(context.Background(), http.MethodPost, path, nil, api.InterruptRequest{Kind: *kind, Lead: *lead}, &out); err != nil {
		return exitCode(stderr, err)
	}
	if cf.json {
		printJSON(stdout, out)
	} else {
		fmt.Fprintf(stdout, "Injected %s on %s/%s (instance %s).\n", out["kind"], rest[0], rest[1], out["instance"])
	}
	return exitOK
}

func runLogs(args []string, stdout, stderr io.Writer) int {
	fs, cf := newClientFlagSet("logs", stderr)
	tail := fs.Int("n", 100, "number of lines")
	follow := fs.Bool("f", false, "keep printing new lines")
	incarnation := fs.String("incarnation", "", "the logs of this incarnation of the fleet name (an id from `fleetd events`), or \"all\"; default: the current one")
	rest, err := parseInterleaved(fs, args)
	if err != nil || len(rest) < 1 || len(rest) > 2 {
		fmt.Fprintln(stderr, "Usage: fleetd logs [-n N] [-f] [-incarnation ID|all] FLEET [NODE]")
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	q := url.Values{"tail": {fmt.Sprint(*tail)}}
	switch *incarnation {
	case "":
	case "all":
		q.Set("incarnation", "*")
	default:
		q.Set("incarnation", *incarnation)
	}
	if len(rest) == 2 {
		q.Set("node", rest[1])
	}
	var last time.Time
	for {
		var lines []api.LogLine
		if err := c.Do(context.Background(), http.MethodGet, "/v1/fleets/"+url.PathEscape(rest[0])+"/logs", q, nil, &lines); err != nil {
			return exitCode(stderr, err)
		}
		// The daemon keeps logs of a destroyed fleet and answers [] for a
		// name it never saw: with no lines, make sure the fleet exists.
		if len(lines) == 0 && last.IsZero() && *incarnation == "" {
			if err := fleetExists(c, rest[0]); err != nil {
				return exitCode(stderr, err)
			}
		}
		for _, l := range lines {
			if !l.Time.After(last) && !last.IsZero() {
				continue
			}
			if cf.json {
				printJSONLine(stdout, l) // a stream: one line a line
			} else {
				fmt.Fprintf(stdout, "%s r%d/%d  %s\n", l.Node, l.Round, l.Rank, l.Line)
			}
		}
		if len(lines) > 0 {
			last = lines[len(lines)-1].Time
		}
		if !*follow {
			return exitOK
		}
		time.Sleep(time.Second)
	}
}

func runOfferings(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("offerings", stderr)
	var sf specFlags
	sf.register(fs, stderr)
	all := fs.Bool("all", false, "also list excluded offerings")
	req, c, code, ok := sf.parse(fs, args, stderr, "Usage: fleetd offerings [-all] [-var NAME=VALUE] [-json] FILE")
	if !ok {
		return code
	}
	var views []fleet.OfferingsView
	if err := c.Do(context.Background(), http.MethodPost, "/v1/offerings", nil, req, &views); err != nil {
		return exitCode(stderr, daemonError(stderr, err))
	}
	if sf.json {
		printJSON(stdout, views)
		return exitOK
	}
	printOfferings(stdout, views, *all, time.Now())
	return exitOK
}

// printOfferings renders the offerings views as tables, with the notes
// and price sources under each.
func printOfferings(w io.Writer, views []fleet.OfferingsView, all bool, now time.Time) {
	for _, v := range views {
		fmt.Fprintf(w, "fleet %q\n", v.Fleet)
		tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
		// The network column shows only when a fast path is on offer.
		showNet := slices.ContainsFunc(v.Offerings, func(o placement.Ranked) bool { return o.Offering.Network.Fast() })
		netHdr := ""
		if showNet {
			netHdr = "NETWORK\t"
		}
		fmt.Fprintln(tw, "  #\tPROVIDER\tZONE\tTYPE\t"+netHdr+"CAPACITY\t$/H\t$/GPU-H\tINTR/H\tEXP-RUN\tINTR-$/H\tSCORE\tSPS\tAVAIL\tSTATUS")
		i := 0
		excluded := map[string]int{}
		for _, o := range v.Offerings {
			if o.Excluded != "" && !all {
				excluded[o.Excluded]++
				continue
			}
			i++
			status := "ok"
			if o.Excluded != "" {
				status = o.Excluded
			}
			avail := "?"
			if o.Offering.Available >= 0 {
				avail = fmt.Sprint(o.Offering.Available)
			}
			sps := "-"
			if o.Offering.PlacementScore > 0 {
				sps = fmt.Sprint(o.Offering.PlacementScore)
			}
			run := "-"
			if o.ExpectedRun > 0 {
				run = fmt.Sprintf("%.1fh", o.ExpectedRun)
			}
			typ := o.Offering.InstanceType
			if showNet {
				typ += "\t" + o.Offering.Network.String()
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%.3f\t%.3f\t%.3f\t%s\t%.3f\t%.3f\t%s\t%s\t%s\n", i, o.Offering.Provider, o.Offering.Zone, typ,
				o.Offering.CapacityType, o.Offering.PricePerHour, o.PricePerGPUHour, o.Rate, run, o.InterruptionCost, o.Score, sps, avail, strings.TrimSpace(status))
		}
		tw.Flush()
		if i == 0 {
			fmt.Fprintln(w, "  "+emptyOfferingsNote(len(v.Offerings), excluded))
		}
		for _, n := range v.Notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
		for _, n := range priceNotes(offeringsOf(v), now) {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
}

// emptyOfferingsNote says why the table of usable offerings is empty:
// the market had none, or every offering is excluded, counted by reason
// (most common first), so a spec whose zones, GPU type or price cap match
// nothing in the market says so.
func emptyOfferingsNote(n int, excluded map[string]int) string {
	if n == 0 {
		return "no offerings from the fleet's providers (see the notes below)"
	}
	reasons := make([]string, 0, len(excluded))
	for r := range excluded {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if excluded[reasons[i]] != excluded[reasons[j]] {
			return excluded[reasons[i]] > excluded[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	const show = 3
	var parts []string
	for i, r := range reasons {
		if i == show {
			parts = append(parts, fmt.Sprintf("%d more reasons", len(reasons)-show))
			break
		}
		parts = append(parts, fmt.Sprintf("%d × %s", excluded[r], r))
	}
	return fmt.Sprintf("no usable offering: all %d are excluded (-all lists them): %s", n, strings.Join(parts, "; "))
}
