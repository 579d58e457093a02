package fleet

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/rendezvous"
)

// scaleView is what the API shows of a fleet's training and sizing: a
// copy made after each pass (the tracker itself belongs to the pass).
type scaleView struct {
	decision autoscale.Decision
	latest   *autoscale.Latest
	series   []autoscale.SeriesPoint
	eta      time.Time
	hasETA   bool
	// roundTiming: no report yet; progress is the rendezvous' measure.
	roundTiming bool
	done        time.Duration // Progress.Done (time at max_nodes)
}

// roundOf describes the fleet's current rendezvous round for the tracker.
func roundOf(st *rendezvous.Status, nodes []state.Node) autoscale.Round {
	if st == nil {
		return autoscale.Round{}
	}
	r := autoscale.Round{Number: st.Round, Closed: st.State == rendezvous.RoundClosed, Nodes: st.Nodes, WorldSize: st.WorldSize, ClosedAt: st.ClosedAt}
	if !r.Closed {
		return r
	}
	byID := make(map[string]string, len(nodes))
	for _, n := range nodes {
		byID[n.ID] = n.Offering.InstanceType
	}
	for i, m := range st.Members {
		if m.GroupRank == nil {
			continue
		}
		t := byID[m.NodeID]
		if i == 0 {
			r.InstanceType = t
		} else if t != r.InstanceType {
			r.InstanceType = "" // mixed
			break
		}
	}
	return r
}

// newestReport is the freshest progress report of the fleet's members:
// the highest round, then the latest received.
func newestReport(st *rendezvous.Status) *autoscale.Report {
	if st == nil {
		return nil
	}
	var best *autoscale.Report
	for _, m := range st.Members {
		if m.Progress == nil {
			continue
		}
		if best == nil || m.Progress.Round > best.Progress.Round ||
			(m.Progress.Round == best.Progress.Round && m.ProgressAt.After(best.ReceivedAt)) {
			best = &autoscale.Report{Progress: *m.Progress, ReceivedAt: m.ProgressAt}
		}
	}
	return best
}

// autoscale feeds the fleet's progress reports to its tracker, asks the
// autoscaler for the fleet's size and puts it into the reconciler's
// input. It runs in the fleet's pass (under its lock).
func (d *Daemon) autoscale(ctx context.Context, f state.Fleet, fl *spec.Fleet, rt *fleetRuntime, nodes []state.Node, st *rendezvous.Status, in *reconcile.Input) {
	now := in.Now
	if rt.Training == nil {
		rt.Training = &autoscale.Tracker{}
	}
	tr := rt.Training
	round := roundOf(st, nodes)
	if start := tr.Observe(now, round, newestReport(st)); start != nil {
		d.noteTrainingResumed(f.Name, *start)
	}
	model := d.params.Model
	if model.InterruptionCost <= 0 {
		model.InterruptionCost = placement.DefaultInterruptionCost
	}
	ain := autoscale.Input{
		Now: now, Policy: autoscale.Policy(fl.Placement.ScalePolicy()), Min: fl.MinNodes, Max: fl.MaxNodes, Desired: fl.DesiredNodes,
		State: rt.Scale, Round: round, Tracker: tr, InstanceType: round.InstanceType,
		Prices: autoscale.NodePrices(fl, nodes, in.Offerings, in.Records, rt.plan.Group, rt.plan.Capacity, now),
		Rate:   autoscale.InterruptionRate(model, nodes, in.Records), Changeover: model.InterruptionCost,
		Params: d.autoscaleParams,
	}
	if round.InstanceType == "" && tr.Latest != nil {
		for _, n := range nodes {
			if reconcile.Live(n.State) {
				ain.InstanceType = n.Offering.InstanceType
				break
			}
		}
	}
	if fl.Deadline != nil {
		ain.Deadline = *fl.Deadline
		if l := tr.Latest; l != nil && l.TotalSteps > l.Step && tr.SamplesPerStep() > 0 {
			ain.WorkLeft = float64(l.TotalSteps-l.Step) * tr.SamplesPerStep()
		} else if fl.Work > 0 {
			ain.WorkLeftAtMax = max(fl.Work-rt.Progress.Done, 0)
		}
	}
	dec := autoscale.Decide(ain)
	if dec.Changed {
		d.appendEvent(ctx, state.Event{Fleet: f.Name, Type: "fleet.scaled",
			Message: fmt.Sprintf("target %d → %d nodes: %s", rt.Scale.Target, dec.Target, dec.Explain),
			Data:    map[string]string{"from": strconv.Itoa(rt.Scale.Target), "to": strconv.Itoa(dec.Target), "reason": dec.Reason}})
		d.log.Info("autoscaler", "fleet", f.Name, "from", rt.Scale.Target, "to", dec.Target, "why", dec.Explain)
	}
	rt.Scale = dec.State
	if fl.DesiredNodes == 0 {
		in.Target, in.TargetAt = dec.Target, rt.Scale.ChangedAt
		in.WorkScale = workScale(dec)
	} else {
		// The spec's desired_nodes is the target; when an apply changed
		// it, the user asked for that size now, not after the cooldowns
		// that space the daemon's own scale steps.
		in.TargetAt = rt.Scale.ChangedAt
	}
	v := &scaleView{decision: dec, roundTiming: tr.Latest == nil, done: rt.Progress.Done}
	if tr.Latest != nil {
		l := *tr.Latest
		v.latest = &l
		v.eta, v.hasETA = tr.ETA()
	}
	v.series = append([]autoscale.SeriesPoint(nil), tr.Series...)
	d.rtMu.Lock()
	rt.view = v
	d.rtMu.Unlock()
}

// mergeAutoscale takes a's fields, b's where a's are zero.
func mergeAutoscale(a, b autoscale.Params) autoscale.Params {
	if a.MeasureFor == 0 {
		a.MeasureFor = b.MeasureFor
	}
	if a.MinInterval == 0 {
		a.MinInterval = b.MinInterval
	}
	if a.MarginalEfficiency == 0 {
		a.MarginalEfficiency = b.MarginalEfficiency
	}
	if a.Hysteresis == 0 {
		a.Hysteresis = b.Hysteresis
	}
	if a.NoReportsAfter == 0 {
		a.NoReportsAfter = b.NoReportsAfter
	}
	return a
}

// workScale is X(max_nodes)/X(target) when both are known: how much
// longer the work (given at max_nodes) takes at the target.
func workScale(dec autoscale.Decision) float64 {
	var xt, xm float64
	for _, o := range dec.Options {
		if o.Nodes == dec.Target {
			xt = o.SamplesPerSec * o.Useful
		}
		xm = o.SamplesPerSec * o.Useful // the last option is max_nodes
	}
	if xt <= 0 || xm <= 0 || xt >= xm {
		return 0
	}
	return xm / xt
}

// scaleOf returns the fleet's last sizing view; nil before its first pass.
func (d *Daemon) scaleOf(name string) *scaleView {
	d.rtMu.Lock()
	defer d.rtMu.Unlock()
	if rt, ok := d.runtimes[name]; ok {
		return rt.view
	}
	return nil
}

// trainingInfo is the API's view of a fleet's training progress and size
// decision; nil before the fleet's first pass.
func (d *Daemon) trainingInfo(name string, now time.Time) (*api.TrainingInfo, *api.ScalingInfo) {
	v := d.scaleOf(name)
	if v == nil {
		return nil, nil
	}
	ti := &api.TrainingInfo{Source: "reports"}
	if v.roundTiming {
		ti.Source = "round-timing"
		ti.Note = "no progress report from the workers yet (FLEETD_PROGRESS, docs/agent.md): until one comes, progress is the rendezvous' measure, training time at max_nodes"
		ti.WorkDoneSeconds = v.done.Seconds()
	}
	if l := v.latest; l != nil {
		ti.Round, ti.Nodes, ti.WorldSize = l.Round, l.Nodes, l.WorldSize
		ti.Step, ti.Samples, ti.Loss, ti.TotalSteps = l.Step, l.Samples, l.Loss, l.TotalSteps
		ti.SamplesPerSecond, ti.StepsPerSecond = finiteOr0(l.SamplesPerSec), finiteOr0(l.StepsPerSec)
		at := l.At
		ti.ReportedAt = &at
		if v.hasETA {
			eta := v.eta
			ti.ETA = &eta
			ti.ETASeconds = math.Max(0, eta.Sub(now).Seconds())
		}
	}
	for _, p := range v.series {
		ti.History = append(ti.History, api.TrainingPoint{At: p.At, Round: p.Round, Nodes: p.Nodes, WorldSize: p.WorldSize, Step: p.Step,
			SamplesPerSecond: finiteOr0(p.SamplesPerSec), Loss: p.Loss})
	}
	dec := v.decision
	si := &api.ScalingInfo{Policy: string(dec.Policy), Target: dec.Target, Reason: dec.Reason, Explain: dec.Explain}
	for _, o := range dec.Options {
		si.Options = append(si.Options, api.ScaleOption{Nodes: o.Nodes, SamplesPerSecond: finiteOr0(o.SamplesPerSec), Low: finiteOr0(o.Low), High: finiteOr0(o.High),
			Measured: o.Measured, MeasuredSeconds: o.Seconds, CostPerHour: o.CostPerHour, Useful: o.Useful,
			CostPerMillionSamples: finiteOr0(o.CostPerMillion), FinishSeconds: finiteOr0(o.FinishSeconds), Note: o.Note})
	}
	if m := dec.Model; m != nil {
		si.Model = &api.ScaleModel{A: m.A, B: m.B, Sizes: m.Sizes, Points: m.Points, Sigma: m.Sigma, Fixed: m.Fixed,
			Formula: "node-seconds per sample y(N) = N/X(N) = A + B·(N−1)"}
		if c := m.Ceiling(); !math.IsInf(c, 0) && c > 0 {
			si.Model.CeilingSamplesPerSecond = c
		}
	}
	return ti, si
}

func finiteOr0(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}
