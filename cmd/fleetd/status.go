package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/autoscale"
)

func init() {
	register(command{name: "status", synopsis: "Show fleets and their nodes", run: runStatus})
	register(command{name: "destroy", synopsis: "Terminate a fleet's nodes and forget it", run: runDestroy})
	register(command{name: "events", synopsis: "Show the event log (-f follows)", run: runEvents})
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	fs, cf := newClientFlagSet("status", stderr)
	if err := fs.Parse(args); err != nil || fs.NArg() > 1 {
		fmt.Fprintln(stderr, "Usage: fleetd status [-json] [FLEET]")
		return exitUsage
	}
	if fs.NArg() == 0 {
		return show(cf, stdout, stderr, (*api.Client).Status, printStatus)
	}
	name := fs.Arg(0)
	fleet := func(c *api.Client, ctx context.Context) (api.FleetDetail, error) {
		d, err := c.Fleet(ctx, name)
		if err != nil {
			return d, unknownFleet(err, name)
		}
		return d, nil
	}
	return show(cf, stdout, stderr, fleet, func(w io.Writer, d api.FleetDetail) { printFleetDetail(w, d, time.Now()) })
}

// printStatus renders GET /v1/status for humans.
func printStatus(w io.Writer, st api.Status) {
	fmt.Fprintf(w, "fleetd %s, daemon %s, up %s\n", st.Version, st.DaemonID, age(st.Time.Sub(st.StartedAt)))
	if st.Leader != "" {
		fmt.Fprintf(w, "cluster: asked server %s, leader %s\n", st.Server, st.Leader)
	}
	fmt.Fprintln(w)
	if len(st.Fleets) == 0 {
		fmt.Fprintln(w, "No fleets. Apply one with: fleetd apply FILE")
		return
	}
	printFleets(w, st.Fleets)
	var alerts int
	for _, f := range st.Fleets {
		alerts += f.AlertCount
	}
	if alerts > 0 {
		fmt.Fprintf(w, "\n%d alert(s): see fleetd status FLEET.\n", alerts)
	}
}

func printFleets(w io.Writer, fleets []api.FleetSummary) {
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "FLEET\tGEN\tRUNNING\tTARGET\tMIN..MAX\tOTHER\tROUND\tWORLD\tPROGRESS\t$/H\tSPEND\tSAVED\tINTR\tALERTS\tPROVIDERS")
	for _, f := range fleets {
		name := f.Name
		switch {
		case f.Destroying:
			name += " (destroying)"
		case f.Completed && f.Succeeded:
			name += " (done)"
		case stoppedByBudget(f.Completed, f.CompletedDetail):
			name += " (stopped)"
		case f.Completed:
			name += " (job failed)"
		}
		other := strings.TrimSuffix(strings.TrimPrefix(stateCounts(f.NodesByState), " ("), ")")
		if other == "" {
			other = "-"
		}
		round, world := "-", "-"
		if r := f.Rendezvous; r != nil {
			round, world = fmt.Sprintf("%d %s", r.Round, r.State), fmt.Sprint(r.WorldSize)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d..%d\t%s\t%s\t%s\t%s\t%.2f\t%s\t%s\t%d\t%d\t%s\n", name, f.Generation, f.NodesByState["running"], f.TargetNodes,
			f.MinNodes, f.MaxNodes, other, round, world, progressCell(f.Training), f.CostPerHour, usd(f.SpendUSD), usd(f.SavingsUSD), f.Interruptions, f.AlertCount, strings.Join(f.Providers, ","))
	}
	tw.Flush()
	for _, f := range fleets {
		if a := f.Allocation; a != nil && a.Kind != "unlimited" {
			fmt.Fprintf(w, "%s: %s\n", f.Name, allocationLine(a))
		}
	}
}

// allocationLine is a fleet's allocation: action, size, queue place, why.
func allocationLine(a *api.AllocationInfo) string {
	s := fmt.Sprintf("%s %d nodes (%s)", a.Action, a.Target, a.Kind)
	if a.QueuePosition > 0 {
		s = fmt.Sprintf("queued #%d (%s)", a.QueuePosition, a.Kind)
	}
	s += ": " + a.Reason
	if a.Waiting != "" {
		s += "; " + a.Waiting
	}
	return s
}

func usd(v float64) string { return fmt.Sprintf("$%.2f", v) }

// printFleetDetail renders GET /v1/fleets/{name}: a summary block, the
// nodes, then what happened (alerts, interruptions, recoveries).
func printFleetDetail(w io.Writer, d api.FleetDetail, now time.Time) {
	status := "active"
	switch {
	case d.Destroying:
		status = "destroying"
	case d.Completed && d.Succeeded:
		status = "job succeeded"
	case stoppedByBudget(d.Completed, d.CompletedDetail):
		status = "stopped"
	case d.Completed:
		status = "job failed"
	}
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintf(tw, "Fleet:\t%s (generation %d, %s; spec %s)\n", d.Name, d.Generation, status, d.Filename)
	if d.Incarnation != "" {
		fmt.Fprintf(tw, "Incarnation:\t%s\n", d.Incarnation)
	}
	fmt.Fprintf(tw, "Nodes:\t%d/%d running%s, min %d, max %d\n", d.NodesByState["running"], d.TargetNodes, stateCounts(d.NodesByState), d.MinNodes, d.MaxNodes)
	if sc := d.Scaling; sc != nil {
		how := "scale = " + sc.Policy
		if sc.Reason != sc.Policy {
			how += ", " + sc.Reason
		}
		fmt.Fprintf(tw, "Size:\t%s (%s)\n", sc.Explain, how)
	}
	if a := d.Allocation; a != nil {
		fmt.Fprintf(tw, "Allocation:\t%s\n", allocationLine(a))
	}
	if stoppedByBudget(d.Completed, d.CompletedDetail) {
		fmt.Fprintf(tw, "Outcome:\t%s\n", d.CompletedDetail)
	} else if d.Completed && d.CompletedDetail != "" {
		fmt.Fprintf(tw, "Outcome:\t%s: %s\n", status, d.CompletedDetail)
	}
	if r := d.Rendezvous; r != nil {
		line := fmt.Sprintf("round %d %s, %d nodes, world size %d", r.Round, r.State, r.Nodes, r.WorldSize)
		if r.Master != "" {
			line += ", master " + r.Master
		}
		fmt.Fprintf(tw, "Rendezvous:\t%s\n", line)
	} else {
		fmt.Fprintf(tw, "Rendezvous:\tno round yet\n")
	}
	if tr := d.Training; tr != nil {
		fmt.Fprintf(tw, "Training:\t%s\n", trainingLine(tr, now))
	}
	if line := networkLine(d.Nodes); line != "" {
		fmt.Fprintf(tw, "Network:\t%s\n", line)
	}
	fmt.Fprintf(tw, "Cost:\t$%.2f/h now (on demand: $%.2f/h)\n", d.CostPerHour, d.OnDemandCostPerHour)
	if len(d.PriceSources) > 0 || !d.PricesAsOf.IsZero() {
		fmt.Fprintf(tw, "Prices:\t%s%s\n", strings.Join(d.PriceSources, ", "), priceAge(d.PricesAsOf, now))
	}
	saved := usd(d.SavingsUSD)
	if d.OnDemandEquivalentUSD > 0 {
		saved += fmt.Sprintf(" (%.0f%% of the on-demand %s)", 100*d.SavingsUSD/d.OnDemandEquivalentUSD, usd(d.OnDemandEquivalentUSD))
	}
	fmt.Fprintf(tw, "Spend:\t%s so far, saved %s\n", usd(d.SpendUSD), saved)
	fmt.Fprintf(tw, "Interruptions:\t%d\n", d.Interruptions)
	printCheckpoint(tw, d.Checkpoint, now)
	tw.Flush()

	if len(d.Alerts) > 0 {
		fmt.Fprintln(w, "\nAlerts:")
		for _, a := range d.Alerts {
			subj := ""
			if a.Subject != "" {
				subj = " [" + a.Subject + "]"
			}
			fmt.Fprintf(w, "  ! %s%s: %s\n", a.Kind, subj, a.Message)
		}
	}
	fmt.Fprintln(w)
	printNodes(w, d.Nodes, now)
	if n := len(d.RecentInterruptions); n > 0 {
		fmt.Fprintln(w, "\nRecent interruptions:")
		tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "  WHEN\tNODE\tKIND\tSOURCE")
		for _, i := range lastN(d.RecentInterruptions, 10) {
			fmt.Fprintf(tw, "  %s ago\t%s\t%s\t%s\n", age(now.Sub(i.At)), i.Node, i.Kind, i.Source)
		}
		tw.Flush()
	}
	if len(d.Recoveries) > 0 {
		fmt.Fprintln(w, "\nRecoveries (round-reformed: notice → the survivors' next round closed; training-resumed: notice → their workers report")
		fmt.Fprintln(w, "progress again; replacement-joined: launch → the new node's agent registered):")
		tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "  WHEN\tKIND\tNODE\tDURATION\tLOST STEPS")
		for _, r := range lastN(d.Recoveries, 10) {
			lost := "-"
			if r.LostSteps != nil {
				lost = fmt.Sprint(*r.LostSteps)
			}
			fmt.Fprintf(tw, "  %s ago\t%s\t%s\t%.2fs\t%s\n", age(now.Sub(r.At)), r.Kind, dash(r.Node), r.DurationSeconds, lost)
		}
		tw.Flush()
	}
}

// networkLine says which network the fleet's live nodes got, so a slow
// multi-node job explains itself: "efa ×4, placement group fleetd-… (3
// nodes); standard (1 node); on 1 node the agent found no fabric device
// and its workers use TCP". Empty when every node is on the standard
// network.
func networkLine(nodes []api.NodeInfo) string {
	count := map[string]int{}
	var order []string
	fast, tcp := false, 0
	for _, n := range nodes {
		if n.State == "terminated" || n.State == "failed" {
			continue
		}
		k := n.Network
		if k == "" {
			k = "standard"
		} else {
			fast = true
		}
		if count[k] == 0 {
			order = append(order, k)
		}
		count[k]++
		if strings.Contains(n.Workers, "tcp!") {
			tcp++
		}
	}
	if !fast {
		return ""
	}
	parts := make([]string, 0, len(order)+1)
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%s (%s)", k, plural(count[k], "node")))
	}
	if tcp > 0 {
		parts = append(parts, fmt.Sprintf("on %s the agent found no fabric device: its workers use TCP", plural(tcp, "node")))
	}
	return strings.Join(parts, "; ")
}

// plural is "1 node", "3 nodes".
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func lastN[T any](xs []T, n int) []T {
	if len(xs) > n {
		return xs[len(xs)-n:]
	}
	return xs
}

func printNodes(w io.Writer, nodes []api.NodeInfo, now time.Time) {
	if len(nodes) == 0 {
		fmt.Fprintln(w, "No nodes.")
		return
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tPROVIDER\tZONE\tTYPE\tCAPACITY\t$/H\tAGE\tROUND\tHEARTBEAT\tADDRESS\tREASON")
	for _, n := range nodes {
		hb := "-"
		if n.LastHeartbeat != nil {
			hb = heartbeatAge(now.Sub(*n.LastHeartbeat)) + " ago"
		}
		round := "-"
		switch {
		case n.Round > 0:
			round = fmt.Sprint(n.Round)
		case n.RendezvousState != "":
			round = n.RendezvousState // waiting, standby, excluded
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%s\t%s\t%s\t%s\t%s\n", n.ID, n.State, n.Provider, n.Zone, n.InstanceType, n.CapacityType, n.PricePerHour,
			age(time.Duration(n.AgeSeconds*float64(time.Second))), round, hb, dash(n.Address), n.Reason)
	}
	tw.Flush()
	printStaging(w, nodes)
}

// heartbeatAge renders the age of a heartbeat that comes every second or
// so: tenths under ten seconds.
func heartbeatAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d < 10*time.Second {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return age(d)
}

// trainingLine renders a fleet's training progress: "step 1200 of 5000
// (24%), 4.1k samples/s, 12.3 steps/s, loss 0.231, ETA 12m0s (12:12:00Z)".
func trainingLine(t *api.TrainingInfo, now time.Time) string {
	if t.Source == "round-timing" {
		return fmt.Sprintf("no progress reports yet: %s of training at max_nodes done (round timing); report steps through FLEETD_PROGRESS (docs/agent.md)",
			age(time.Duration(t.WorkDoneSeconds*float64(time.Second))))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "step %d", t.Step)
	if t.TotalSteps > 0 {
		fmt.Fprintf(&b, " of %d (%.0f%%)", t.TotalSteps, 100*float64(t.Step)/float64(t.TotalSteps))
	}
	fmt.Fprintf(&b, ", %s, %.2f steps/s", samplesRate(t.SamplesPerSecond), t.StepsPerSecond)
	if t.Loss != nil {
		fmt.Fprintf(&b, ", loss %.4g", *t.Loss)
	}
	if t.ETA != nil {
		fmt.Fprintf(&b, ", ETA %s (%s)", age(t.ETA.Sub(now).Round(time.Second)), t.ETA.UTC().Format("15:04:05Z"))
	}
	if t.ReportedAt != nil {
		fmt.Fprintf(&b, "; reported %s ago at world size %d", heartbeatAge(now.Sub(*t.ReportedAt)), t.WorldSize)
	}
	return b.String()
}

// samplesRate renders samples per second like the autoscaler's
// explanations.
func samplesRate(v float64) string { return autoscale.Rate(v) }

// progressCell is the fleets table's PROGRESS column.
func progressCell(t *api.TrainingInfo) string {
	switch {
	case t == nil:
		return "-"
	case t.Source == "round-timing":
		return "no reports"
	}
	s := fmt.Sprint(t.Step)
	if t.TotalSteps > 0 {
		s += fmt.Sprintf("/%d", t.TotalSteps)
	}
	if t.SamplesPerSecond > 0 {
		s += " @" + strings.TrimSuffix(autoscale.Rate(t.SamplesPerSecond), " samples/s") + "/s"
	}
	if t.ETASeconds > 0 {
		s += " eta " + age(time.Duration(t.ETASeconds)*time.Second)
	}
	return s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runEvents(args []string, stdout, stderr io.Writer) int {
	fs, cf := newClientFlagSet("events", stderr)
	follow := fs.Bool("f", false, "follow: keep printing new events")
	since := fs.Uint64("since", 0, "only events after this sequence number")
	fleetName := fs.String("fleet", "", "only events of this fleet (or give it as the argument)")
	incarnation := fs.String("incarnation", "", "with a fleet: the events of this incarnation of its name (an id from `fleetd status` or an earlier event), or \"all\"; default: the current one")
	rest, err := parseInterleaved(fs, args)
	if err == nil && len(rest) == 1 && *fleetName == "" {
		*fleetName = rest[0]
	} else if err == nil && len(rest) > 0 {
		err = fmt.Errorf("too many arguments")
	}
	if err != nil || (*incarnation != "" && *fleetName == "") {
		fmt.Fprintln(stderr, "Usage: fleetd events [-f] [-since N] [-incarnation ID|all] [-json] [FLEET]")
		return exitUsage
	}
	c, err := cf.client()
	if err != nil {
		return exitCode(stderr, err)
	}
	ctx := context.Background()
	// Which incarnation's events to show: "" shows every event of the name.
	inc := *incarnation
	if inc == "all" {
		inc = ""
	} else if inc == "" && *fleetName != "" {
		f, err := c.Fleet(ctx, *fleetName)
		switch {
		case err == nil:
			inc = f.Incarnation
		case *follow || !api.IsNotFound(err):
			// Following a name that is not a fleet would wait forever.
			return exitCode(stderr, unknownFleet(err, *fleetName))
		}
		// A destroyed fleet's name: every incarnation's events.
	}
	next, matched := *since, 0
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
			if *fleetName != "" && (e.Fleet != *fleetName || (inc != "" && e.Incarnation != inc)) {
				continue
			}
			matched++
			if cf.json {
				printJSONLine(stdout, e) // a stream: one event a line
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
			if *fleetName != "" && matched == 0 && *since == 0 {
				// No event of it at all: a typo, unless it exists and is quiet.
				if err := fleetExists(c, *fleetName); err != nil {
					return exitCode(stderr, err)
				}
			}
			return exitOK
		}
	}
}

// stoppedByBudget: the daemon ended the fleet (on_exhausted = "stop"), it
// did not fail; the daemon says so in the completion detail.
func stoppedByBudget(completed bool, detail string) bool {
	return completed && strings.HasPrefix(detail, "stopped: ")
}
