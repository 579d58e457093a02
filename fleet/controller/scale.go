package controller

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/rendezvous"
)

// ScaleView is what the API shows of a fleet's training and sizing: a
// copy made after each pass (the tracker itself belongs to the pass).
type ScaleView struct {
	Decision autoscale.Decision
	Latest   *autoscale.Latest
	Series   []autoscale.SeriesPoint
	ETA      time.Time
	HasETA   bool
	// RoundTiming: no report yet; progress is the rendezvous' measure.
	RoundTiming bool
	Done        time.Duration // Progress.Done (time at max_nodes)
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
func (c *Controller) autoscale(ctx context.Context, f state.Fleet, fl *spec.Fleet, rt *Runtime, nodes []state.Node, st *rendezvous.Status, in *reconcile.Input) {
	now := in.Now
	if rt.Training == nil {
		rt.Training = &autoscale.Tracker{}
	}
	tr := rt.Training
	round := roundOf(st, nodes)
	if start := tr.Observe(now, round, newestReport(st)); start != nil {
		c.opts.Recorder.TrainingResumed(f.Name, *start)
	}
	model := c.opts.Params.Model
	if model.InterruptionCost <= 0 {
		model.InterruptionCost = placement.DefaultInterruptionCost
	}
	ain := autoscale.Input{
		Now: now, Policy: autoscale.Policy(fl.Placement.ScalePolicy()), Min: fl.MinNodes, Max: fl.MaxNodes, Desired: fl.DesiredNodes,
		State: rt.Scale, Round: round, Tracker: tr, InstanceType: round.InstanceType,
		Prices: autoscale.NodePrices(fl, nodes, in.Offerings, in.Records, rt.plan.Group, rt.plan.Capacity, now),
		Rate:   autoscale.InterruptionRate(model, nodes, in.Records), Changeover: model.InterruptionCost,
		Params: c.opts.Autoscale,
	}
	if round.InstanceType == "" && tr.Latest != nil {
		for _, n := range nodes {
			if reconcile.Live(n.State) {
				ain.InstanceType = n.Offering.InstanceType
				break
			}
		}
	}
	ain.Network = networkPrior(fl, nodes)
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
		c.appendEvent(ctx, state.Event{Fleet: f.Name, Type: "fleet.scaled",
			Message: fmt.Sprintf("target %d → %d nodes: %s", rt.Scale.Target, dec.Target, dec.Explain),
			Data:    map[string]string{"from": strconv.Itoa(rt.Scale.Target), "to": strconv.Itoa(dec.Target), "reason": dec.Reason}})
		c.log.Info("autoscaler", "fleet", f.Name, "from", rt.Scale.Target, "to", dec.Target, "why", dec.Explain)
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
	v := &ScaleView{Decision: dec, RoundTiming: tr.Latest == nil, Done: rt.Progress.Done}
	if tr.Latest != nil {
		l := *tr.Latest
		v.Latest = &l
		v.ETA, v.HasETA = tr.ETA()
	}
	v.Series = append([]autoscale.SeriesPoint(nil), tr.Series...)
	rt.mu.Lock()
	rt.scale = v
	rt.mu.Unlock()
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

// networkPrior is the autoscaler's first guess from the network: the
// job's gradient size and the bandwidth of its slowest live node, when
// every live node is on a fast path whose bandwidth is known (a ring
// all-reduce runs at its slowest link; the standard network's is not
// known well enough to guess from).
func networkPrior(fl *spec.Fleet, nodes []state.Node) autoscale.NetworkPrior {
	if fl.Training.GradientMB <= 0 {
		return autoscale.NetworkPrior{}
	}
	bw := 0.0
	for _, n := range nodes {
		if !reconcile.Live(n.State) {
			continue
		}
		g := n.Offering.Network.BandwidthGbps
		if !n.Network.Fabric || g <= 0 {
			return autoscale.NetworkPrior{}
		}
		if bw == 0 || g < bw {
			bw = g
		}
	}
	return autoscale.NetworkPrior{GradientBytes: fl.Training.GradientMB * 1e6, BandwidthGbps: bw}
}
