package fleet

import (
	"cmp"
	"math"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/autoscale"
)

// mergeAutoscale takes a's fields, b's where a's are zero.
func mergeAutoscale(a, b autoscale.Params) autoscale.Params {
	a.MeasureFor = cmp.Or(a.MeasureFor, b.MeasureFor)
	a.MinInterval = cmp.Or(a.MinInterval, b.MinInterval)
	a.MarginalEfficiency = cmp.Or(a.MarginalEfficiency, b.MarginalEfficiency)
	a.Hysteresis = cmp.Or(a.Hysteresis, b.Hysteresis)
	a.NoReportsAfter = cmp.Or(a.NoReportsAfter, b.NoReportsAfter)
	return a
}

// trainingInfo is the API's view of a fleet's training progress and size
// decision; nil before the fleet's first pass.
func (d *fleetViews) trainingInfo(name string, now time.Time) (*api.TrainingInfo, *api.ScalingInfo) {
	view, ok := d.ctrl.View(name)
	v := view.Scale
	if !ok || v == nil {
		return nil, nil
	}
	ti := &api.TrainingInfo{Source: "reports"}
	if v.RoundTiming {
		ti.Source = "round-timing"
		ti.Note = "no progress report from the workers yet (FLEETD_PROGRESS, docs/agent.md): until one comes, progress is the rendezvous' measure, training time at max_nodes"
		ti.WorkDoneSeconds = v.Done.Seconds()
	}
	if l := v.Latest; l != nil {
		ti.Round, ti.Nodes, ti.WorldSize = l.Round, l.Nodes, l.WorldSize
		ti.Step, ti.Samples, ti.Loss, ti.TotalSteps = l.Step, l.Samples, l.Loss, l.TotalSteps
		ti.SamplesPerSecond, ti.StepsPerSecond = finiteOr0(l.SamplesPerSec), finiteOr0(l.StepsPerSec)
		at := l.At
		ti.ReportedAt = &at
		if v.HasETA {
			eta := v.ETA
			ti.ETA = &eta
			ti.ETASeconds = math.Max(0, eta.Sub(now).Seconds())
		}
	}
	for _, p := range v.Series {
		ti.History = append(ti.History, api.TrainingPoint{At: p.At, Round: p.Round, Nodes: p.Nodes, WorldSize: p.WorldSize, Step: p.Step,
			SamplesPerSecond: finiteOr0(p.SamplesPerSec), Loss: p.Loss})
	}
	dec := v.Decision
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
