package simulate

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/rendezvous"
)

// Shape is a job's throughput per node count, in the scaling model's form
// (fleet/autoscale): one node's time per sample A, and each further node
// adding K·A, so X(n) ∝ n / (1 + K·(n−1)); beyond Knee nodes (when set)
// throughput stops growing. The zero Shape is linear scaling: the
// simulator's job model before job shapes, work advancing at n/max_nodes.
type Shape struct {
	Name string `json:"name"`
	// K is B/A: 0 is linear scaling.
	K float64 `json:"k"`
	// Knee, above 0: no gain beyond this many nodes.
	Knee   int    `json:"knee,omitempty"`
	Source string `json:"source,omitempty"`
}

// Speedup is the throughput at n nodes over one node's.
func (s Shape) Speedup(n int) float64 {
	if n <= 0 {
		return 0
	}
	if s.Knee > 0 && n > s.Knee {
		n = s.Knee
	}
	return float64(n) / (1 + s.K*float64(n-1))
}

// rate is how fast work (time at max_nodes) advances at n nodes.
func (s Shape) rate(n, maxNodes int) float64 {
	if maxNodes <= 0 {
		return 0
	}
	return s.Speedup(n) / s.Speedup(maxNodes)
}

// Efficiency is the speedup at n nodes over n: 1 is linear.
func (s Shape) Efficiency(n int) float64 { return s.Speedup(n) / float64(n) }

// Shapes are job models after published measurements, and the issue's
// synthetic knee.
var Shapes = []Shape{
	{Name: "near-linear", K: 0.0074,
		Source: "MosaicML, 1.3B-parameter GPT on AWS p4d (400 Gbps): 3.9× the throughput on 4 nodes, 14.4× on 16 (L. Li, 2022; " +
			"here 97.8% and 90.0% efficiency); Horovod's benchmarks: ResNet-101 and Inception V3 at 90% scaling efficiency on 128 servers"},
	{Name: "comm-bound", K: 0.095,
		Source: "Zhang et al., \"Is Network the Bottleneck of Distributed Training?\" (NetAI'20, arXiv:2006.10103): Horovod reaches " +
			"scaling factors of 60–76% on 8 AWS p3dn servers (64 V100, 100 Gbps); here 60% at 8 nodes"},
	{Name: "knee-4", Knee: 4,
		Source: "synthetic: the job of issue 16, whose throughput stops growing past 4 nodes"},
}

// ShapeByName finds a shape of Shapes.
func ShapeByName(name string) (Shape, error) {
	var names []string
	for _, s := range Shapes {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return Shape{}, fmt.Errorf("unknown job shape %q (known: %s)", name, strings.Join(names, ", "))
}

// GoodputPolicy is fleetd with the goodput autoscaler sizing the fleet;
// the "fleetd" policy is the same at a fixed max_nodes.
func GoodputPolicy() Policy {
	return Policy{Name: "goodput", Deadline: placement.DefaultDeadlinePolicy(), Autoscale: true,
		Description: "fleetd's deadline policy and zone choice, the fleet sized by the goodput autoscaler (docs/autoscale.md)"}
}

// perNodeRate is one node's throughput in the simulated job's samples/s.
const perNodeRate = 100.0

// simAutoscale is the daemon's autoscaler (fleet/autoscaler.go) in a
// simulated run: the rounds' throughput from the job's shape feeds the
// tracker, the decision sets the reconciler's target.
type simAutoscale struct {
	params  autoscale.Params
	tracker autoscale.Tracker
	state   autoscale.State
	dec     autoscale.Decision
	// last is the last pass's plan: its group and capacity price the
	// nodes a larger size would add.
	last reconcile.Plan
}

// SimAutoscaleParams are the autoscaler's timings in simulated runs: a
// size is judged after 10 minutes of measured throughput, and sizes
// change at most every 30 minutes (a change costs a changeover).
var SimAutoscaleParams = autoscale.Params{MeasureFor: 10 * time.Minute, MinInterval: 30 * time.Minute}

func newSimAutoscale(pol Policy) *simAutoscale {
	if !pol.Autoscale {
		return nil
	}
	return &simAutoscale{params: SimAutoscaleParams}
}

// target is the node count the run aims at.
func (r *runner) target() int {
	t := r.fl.TargetNodes()
	if r.as != nil && r.as.state.Target > 0 && r.fl.DesiredNodes == 0 {
		t = max(r.as.state.Target, r.fl.MinNodes)
	}
	return min(max(t, 0), r.fl.MaxNodes)
}

// observe reports the running round's throughput, as its workers would.
func (a *simAutoscale) observe(r *runner) {
	st := r.rdzv.Status()
	if st.State != rendezvous.RoundClosed || r.rate <= 0 || !r.now.After(r.productive) {
		return
	}
	n := st.Nodes
	x := perNodeRate * r.shape.Speedup(n)
	secs := r.now.Sub(r.productive).Seconds()
	itype := ""
	if len(r.nodes) > 0 {
		itype = r.nodes[0].Offering.InstanceType
	}
	step := int64(r.done.Seconds())
	a.tracker.Observe(r.now, autoscale.Round{Number: st.Round, Closed: true, Nodes: n, WorldSize: st.WorldSize, ClosedAt: st.ClosedAt, InstanceType: itype},
		&autoscale.Report{ReceivedAt: r.now, Progress: rendezvous.Progress{Round: st.Round, Nodes: n, WorldSize: st.WorldSize, Step: step, FirstStep: step,
			Samples: float64(step) * 64, SamplesPerSec: x, StepsPerSec: x / 64, RateSeconds: secs, Reports: 3}})
}

// decide runs the autoscaler at a pass.
func (a *simAutoscale) decide(r *runner) {
	a.observe(r)
	model := r.params.Model
	in := autoscale.Input{
		Now: r.now, Policy: autoscale.Goodput, Min: r.fl.MinNodes, Max: r.fl.MaxNodes,
		State: a.state, Tracker: &a.tracker,
		Prices:   autoscale.NodePrices(r.fl, r.nodes, r.offeringsNow(), r.records, a.last.Group, a.last.Capacity, r.now),
		Rate:     autoscale.InterruptionRate(model, r.nodes, r.records),
		Deadline: r.deadline, WorkLeftAtMax: max(r.job.Work-r.done, 0),
		Params: a.params,
	}
	if in.Changeover = model.InterruptionCost; in.Changeover <= 0 {
		in.Changeover = placement.DefaultInterruptionCost
	}
	st := r.rdzv.Status()
	in.Round = autoscale.Round{Number: st.Round, Closed: st.State == rendezvous.RoundClosed, Nodes: st.Nodes, WorldSize: st.WorldSize, ClosedAt: st.ClosedAt}
	a.dec = autoscale.Decide(in)
	if a.dec.Changed {
		r.logf("autoscaler: %d → %d nodes: %s", a.state.Target, a.dec.Target, a.dec.Explain)
		r.res.SizeChanges++
	}
	a.state = a.dec.State
}

// into puts the last decision into the reconciler's input.
func (a *simAutoscale) into(in *reconcile.Input) {
	in.Target, in.TargetAt = a.state.Target, a.state.ChangedAt
	var xt, xm float64
	for _, o := range a.dec.Options {
		if o.Nodes == a.dec.Target {
			xt = o.SamplesPerSec * o.Useful
		}
		xm = o.SamplesPerSec * o.Useful
	}
	if xt > 0 && xm > xt {
		in.WorkScale = xm / xt
	}
}

// wake is when the autoscaler may decide differently: its measurement of
// the running round completes, or its min_interval ends.
func (a *simAutoscale) wake(r *runner) time.Time {
	p := a.params.WithDefaults()
	var t time.Time
	at := func(c time.Time) {
		if c.After(r.now) && (t.IsZero() || c.Before(t)) {
			t = c
		}
	}
	if r.rate > 0 {
		at(r.productive.Add(p.MeasureFor))
	}
	if !a.state.ChangedAt.IsZero() {
		at(a.state.ChangedAt.Add(p.MinInterval))
	}
	return t
}

// ScalingRow is one (job shape, policy) of a scaling comparison.
type ScalingRow struct {
	Shape   string `json:"shape"`
	Policy  string `json:"policy"`
	Windows int    `json:"windows"`
	// MeanCost is the mean cost of a run; CostPerWorkHour the mean of its
	// cost per hour of work done (work counted at max_nodes' throughput):
	// the cost per unit of progress.
	MeanCost        float64 `json:"mean_cost"`
	CostPerWorkHour float64 `json:"cost_per_work_hour"`
	// MeanHours and P90Hours are the completion times.
	MeanHours float64 `json:"mean_hours"`
	P90Hours  float64 `json:"p90_hours"`
	Misses    int     `json:"deadline_misses"`
	// MeanNodes is the fleet's mean size: billed node-hours over hours.
	MeanNodes   float64 `json:"mean_nodes"`
	SizeChanges float64 `json:"mean_size_changes"`
	Preemptions float64 `json:"mean_preemptions"`
	// Ratio is MeanCost over the optimum's (the lower bound), when the
	// comparison runs it.
	Ratio float64 `json:"ratio_to_optimum,omitempty"`
}

// CompareShapes runs the setup's policies for each job shape over the
// same windows and summarises them per shape and policy.
func CompareShapes(ctx context.Context, base *Setup, shapes []Shape) ([]ScalingRow, error) {
	var rows []ScalingRow
	for _, sh := range shapes {
		s := *base
		s.Shape = sh
		res, err := s.Run(ctx)
		if err != nil {
			return nil, fmt.Errorf("shape %s: %w", sh.Name, err)
		}
		for _, p := range s.Policies {
			row := ScalingRow{Shape: sh.Name, Policy: p.Name}
			var costs, per, hours []float64
			for _, r := range res {
				if r.Policy != p.Name || r.Infeasible {
					continue
				}
				row.Windows++
				costs = append(costs, r.Cost)
				if r.Done > 0 {
					per = append(per, r.Cost/r.Done.Hours())
				}
				hours = append(hours, r.Elapsed.Hours())
				if r.Missed {
					row.Misses++
				}
				if r.Elapsed > 0 {
					row.MeanNodes += (r.SpotHours + r.OnDemandHours) / r.Elapsed.Hours()
				}
				row.SizeChanges += float64(r.SizeChanges)
				row.Preemptions += float64(r.Preemptions)
			}
			if n := float64(row.Windows); n > 0 {
				row.MeanCost, row.MeanHours, row.P90Hours = mean(costs), mean(hours), quantile(hours, 0.9)
				if len(per) > 0 {
					row.CostPerWorkHour = mean(per)
				}
				row.MeanNodes /= n
				row.SizeChanges /= n
				row.Preemptions /= n
			}
			rows = append(rows, row)
		}
		shapeRows := rows[len(rows)-len(s.Policies):]
		for _, o := range shapeRows {
			if o.Policy == "optimum" && o.MeanCost > 0 {
				for i := range shapeRows {
					shapeRows[i].Ratio = shapeRows[i].MeanCost / o.MeanCost
				}
			}
		}
	}
	return rows, nil
}

// WriteScalingTable prints a scaling comparison: per shape, each policy
// and the goodput policy's change against fixed max_nodes ("fleetd").
func WriteScalingTable(w io.Writer, rows []ScalingRow, shapes []Shape, job Job, maxNodes, windows int) error {
	fmt.Fprintf(w, "job: %s of work at max_nodes = %d, deadline %s after the start, changeover %s; %d windows\n\n",
		hours(job.Work), maxNodes, hours(job.Deadline), job.Changeover, windows)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shape\tpolicy\tmean $\t$ per work-hour\tmean hours\tp90 hours\tmisses\tmean nodes\tsize changes\tpreemptions\t× optimum\t")
	byShape := map[string]map[string]ScalingRow{}
	for _, r := range rows {
		if byShape[r.Shape] == nil {
			byShape[r.Shape] = map[string]ScalingRow{}
		}
		byShape[r.Shape][r.Policy] = r
		ratio := "-"
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.3f", r.Ratio)
		}
		if r.Policy == "optimum" || r.Policy == "gang-dp" {
			// A bound, not a run: it has no schedule to time.
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.3f\t-\t-\t-\t-\t-\t-\t%s\t\n", r.Shape, r.Policy, r.MeanCost, r.CostPerWorkHour, ratio)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.3f\t%.1f\t%.1f\t%d\t%.2f\t%.1f\t%.1f\t%s\t\n", r.Shape, r.Policy, r.MeanCost, r.CostPerWorkHour,
			r.MeanHours, r.P90Hours, r.Misses, r.MeanNodes, r.SizeChanges, r.Preemptions, ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, sh := range shapes {
		g, okG := byShape[sh.Name]["goodput"]
		m, okM := byShape[sh.Name]["fleetd"]
		if okG && okM && m.CostPerWorkHour > 0 && m.MeanHours > 0 {
			fmt.Fprintf(w, "%s: goodput vs max_nodes: %+.1f%% cost per unit of progress, %+.1f%% completion time, misses %d vs %d; efficiency at %d nodes %.0f%%\n",
				sh.Name, 100*(g.CostPerWorkHour/m.CostPerWorkHour-1), 100*(g.MeanHours/m.MeanHours-1), g.Misses, m.Misses, maxNodes, 100*sh.Efficiency(maxNodes))
		}
		fmt.Fprintf(w, "  %s: %s\n", sh.Name, sh.Source)
	}
	return nil
}
