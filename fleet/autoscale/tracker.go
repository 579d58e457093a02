package autoscale

import (
	"time"

	"github.com/fleetd/fleetd/rendezvous"
)

// Observation is one rendezvous round's measured throughput: what the
// model is fitted to. A round's observation is updated while it runs.
type Observation struct {
	Round        int    `json:"round"`
	Nodes        int    `json:"nodes"`
	WorldSize    int    `json:"world_size"`
	InstanceType string `json:"instance_type,omitempty"`
	// SamplesPerSec and StepsPerSec are measured over Seconds of the
	// round's progress reports (after their start-up interval).
	SamplesPerSec float64   `json:"samples_per_s"`
	StepsPerSec   float64   `json:"steps_per_s,omitempty"`
	Seconds       float64   `json:"seconds"`
	At            time.Time `json:"at"` // when it was last updated
}

// Latest is the newest progress report of a fleet.
type Latest struct {
	Round     int      `json:"round"`
	Nodes     int      `json:"nodes"`
	WorldSize int      `json:"world_size"`
	Step      int64    `json:"step"`
	Samples   float64  `json:"samples"`
	Loss      *float64 `json:"loss,omitempty"`
	// TotalSteps is the step the job ends at, when the workers say.
	TotalSteps    int64   `json:"total_steps,omitempty"`
	SamplesPerSec float64 `json:"samples_per_s"`
	StepsPerSec   float64 `json:"steps_per_s"`
	// At is when the report was made (the daemon's clock); FirstStep and
	// FirstAt the round's first report.
	At        time.Time `json:"at"`
	FirstStep int64     `json:"first_step"`
	FirstAt   time.Time `json:"first_at"`
	// Batch and NoiseScale are the global batch and the gradient noise
	// scale the workers report (AdaptiveBatch); 0: not reported.
	Batch      float64 `json:"batch,omitempty"`
	NoiseScale float64 `json:"noise_scale,omitempty"`
}

// SeriesPoint is one sample of a fleet's training over time.
type SeriesPoint struct {
	At            time.Time `json:"t"`
	Round         int       `json:"round"`
	Nodes         int       `json:"nodes"`
	WorldSize     int       `json:"world_size"`
	Step          int64     `json:"step"`
	SamplesPerSec float64   `json:"samples_per_s"`
	Loss          *float64  `json:"loss,omitempty"`
}

// Round is the fleet's current rendezvous round as the daemon sees it.
type Round struct {
	Number       int
	Closed       bool
	Nodes        int
	WorldSize    int
	ClosedAt     time.Time
	InstanceType string // of the round's nodes ("" when mixed or unknown)
}

// Report is a node's latest progress report and when the daemon got it.
type Report struct {
	Progress   rendezvous.Progress
	ReceivedAt time.Time
}

// RoundStart is reported by Observe at the first report of a new round:
// when its workers reported first (they run again) and the steps between
// the previous round's last report and where this one resumed.
type RoundStart struct {
	Round     int
	At        time.Time
	FirstStep int64
	// PrevStep is the previous round's last reported step; LostSteps
	// PrevStep − FirstStep when positive (progress recomputed).
	PrevStep  int64
	LostSteps int64
	HadPrev   bool
}

// Tracker keeps a fleet's progress: the throughput observations per
// round, the latest report and a series for charts. It is persisted
// with the fleet's runtime (JSON).
type Tracker struct {
	History []Observation `json:"history,omitempty"`
	Latest  *Latest       `json:"latest,omitempty"`
	Series  []SeriesPoint `json:"series,omitempty"`
}

// Tracker limits.
const (
	// MinRateSeconds: a round's rate counts once measured over this long.
	MinRateSeconds = 1.0
	maxHistory     = 64
	maxPerSize     = 8
	// SeriesEvery spaces the chart series' points (round changes always
	// add one).
	SeriesEvery = 5 * time.Second
	maxSeries   = 360
)

// Observe takes the fleet's current round and the newest report of its
// nodes (nil: none) at now. It returns the start of a round when this
// report is the first of a round newer than any seen.
func (t *Tracker) Observe(now time.Time, cur Round, r *Report) *RoundStart {
	if r == nil {
		return nil
	}
	p := r.Progress
	at := r.ReceivedAt.Add(-time.Duration(p.AgeMS) * time.Millisecond)
	firstAt := r.ReceivedAt.Add(-time.Duration(p.FirstAgeMS) * time.Millisecond)
	var start *RoundStart
	if t.Latest != nil && p.Round < t.Latest.Round {
		// An older round's straggling report: its observation may still
		// improve, the latest stays.
		t.observe(cur, p, at)
		return nil
	}
	if t.Latest == nil || p.Round > t.Latest.Round {
		start = &RoundStart{Round: p.Round, At: firstAt, FirstStep: p.FirstStep}
		if t.Latest != nil {
			start.HadPrev, start.PrevStep = true, t.Latest.Step
			if d := t.Latest.Step - p.FirstStep; d > 0 {
				start.LostSteps = d
			}
		}
	}
	nodes, world := p.Nodes, p.WorldSize
	if nodes == 0 && p.Round == cur.Number {
		nodes, world = cur.Nodes, cur.WorldSize
	}
	t.Latest = &Latest{Round: p.Round, Nodes: nodes, WorldSize: world, Step: p.Step, Samples: p.Samples, Loss: p.Loss,
		TotalSteps: p.TotalSteps, SamplesPerSec: p.SamplesPerSec, StepsPerSec: p.StepsPerSec, At: at,
		FirstStep: p.FirstStep, FirstAt: firstAt, Batch: p.Batch, NoiseScale: p.NoiseScale}
	t.observe(cur, p, at)
	t.addPoint(now)
	return start
}

// observe updates the round's observation from its report.
func (t *Tracker) observe(cur Round, p rendezvous.Progress, at time.Time) {
	if p.Reports < 2 || p.RateSeconds < MinRateSeconds || !(p.SamplesPerSec > 0) {
		return
	}
	nodes, world := p.Nodes, p.WorldSize
	itype := ""
	if p.Round == cur.Number {
		itype = cur.InstanceType
		if nodes == 0 {
			nodes, world = cur.Nodes, cur.WorldSize
		}
	}
	if nodes < 1 {
		return // an older agent's report of a round whose size is unknown
	}
	o := Observation{Round: p.Round, Nodes: nodes, WorldSize: world, InstanceType: itype,
		SamplesPerSec: p.SamplesPerSec, StepsPerSec: p.StepsPerSec, Seconds: p.RateSeconds, At: at}
	for i := range t.History {
		if t.History[i].Round == p.Round {
			if o.InstanceType == "" {
				o.InstanceType = t.History[i].InstanceType
			}
			t.History[i] = o
			return
		}
	}
	t.History = append(t.History, o)
	t.trim()
}

// trim keeps the newest maxPerSize observations of each size and type,
// and maxHistory in all.
func (t *Tracker) trim() {
	count := map[[2]any]int{}
	keep := make([]bool, len(t.History))
	kept := 0
	for i := len(t.History) - 1; i >= 0; i-- {
		o := t.History[i]
		k := [2]any{o.Nodes, o.InstanceType}
		if count[k] < maxPerSize && kept < maxHistory {
			count[k]++
			keep[i] = true
			kept++
		}
	}
	out := t.History[:0]
	for i, o := range t.History {
		if keep[i] {
			out = append(out, o)
		}
	}
	t.History = out
}

// addPoint extends the chart series from the latest report.
func (t *Tracker) addPoint(now time.Time) {
	l := t.Latest
	p := SeriesPoint{At: l.At, Round: l.Round, Nodes: l.Nodes, WorldSize: l.WorldSize, Step: l.Step, SamplesPerSec: l.SamplesPerSec, Loss: l.Loss}
	if n := len(t.Series); n > 0 {
		last := t.Series[n-1]
		if last.Round == p.Round && (last.Step == p.Step || p.At.Sub(last.At) < SeriesEvery) {
			return
		}
		if !p.At.After(last.At) {
			return
		}
	}
	t.Series = append(t.Series, p)
	if len(t.Series) > maxSeries {
		// Thin the older half: every other point goes.
		half := len(t.Series) / 2
		out := make([]SeriesPoint, 0, maxSeries)
		for i, q := range t.Series[:half] {
			if i%2 == 0 {
				out = append(out, q)
			}
		}
		t.Series = append(out, t.Series[half:]...)
	}
}

// ETA is when the job is expected to reach its total steps at the
// current round's step rate; false without a total or a rate.
func (t *Tracker) ETA() (time.Time, bool) {
	l := t.Latest
	if l == nil || l.TotalSteps <= 0 || l.StepsPerSec <= 0 {
		return time.Time{}, false
	}
	if l.Step >= l.TotalSteps {
		return l.At, true
	}
	left := float64(l.TotalSteps-l.Step) / l.StepsPerSec
	return l.At.Add(time.Duration(left * float64(time.Second))), true
}

// Points are the observations usable for a model of instanceType: those
// of that type when there are any, else all.
func (t *Tracker) Points(instanceType string) []Point {
	var same, all []Point
	for _, o := range t.History {
		p := Point{Nodes: o.Nodes, Rate: o.SamplesPerSec, Seconds: o.Seconds}
		all = append(all, p)
		if o.InstanceType == instanceType {
			same = append(same, p)
		}
	}
	if len(same) > 0 {
		return same
	}
	return all
}

// MeasuredAfter is how many seconds of throughput were measured in
// rounds after round.
func (t *Tracker) MeasuredAfter(round int) float64 {
	var s float64
	for _, o := range t.History {
		if o.Round > round {
			s += o.Seconds
		}
	}
	return s
}

// SamplesPerStep is the latest round's samples per step; 0 when unknown.
func (t *Tracker) SamplesPerStep() float64 {
	l := t.Latest
	if l == nil || l.StepsPerSec <= 0 {
		return 0
	}
	return l.SamplesPerSec / l.StepsPerSec
}
