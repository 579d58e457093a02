package autoscale

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Policy is the spec's placement.scale.
type Policy string

// Policies.
const (
	// Goodput sizes by measured throughput and price (the default).
	Goodput Policy = "goodput"
	// Max aims at max_nodes, as fleetd did before it measured throughput.
	Max Policy = "max"
)

// Params tune the decision. Zero fields take the defaults.
type Params struct {
	// MarginalEfficiency: a larger size is worth its cost when the
	// progress it adds is at least this fraction of what the same money
	// buys at the smaller size, i.e. when its extra progress costs at most
	// 1/MarginalEfficiency times the smaller size's cost per unit of
	// progress. 1 takes only linear scaling; 0.5 (the default) pays up to
	// twice the going rate for speed.
	MarginalEfficiency float64 `json:"marginal_efficiency"`
	// Hysteresis keeps the current size while its step's marginal
	// efficiency is within this much of the threshold.
	Hysteresis float64 `json:"hysteresis"`
	// CostTolerance: with a deadline, sizes whose cost per unit of
	// progress is within this fraction of the cheapest that finishes in
	// time count as equally cheap, and the fastest of them is taken.
	CostTolerance float64 `json:"cost_tolerance"`
	// MeasureFor: a new size is judged once its throughput was measured
	// this long (the workers' progress reports after their start-up).
	MeasureFor time.Duration `json:"measure_for"`
	// MinInterval is the least time between two size changes.
	MinInterval time.Duration `json:"min_interval"`
	// NoReportsAfter: a fleet whose workers reported no progress after
	// this long of training says it sizes by round timing.
	NoReportsAfter time.Duration `json:"no_reports_after"`
	// Z is how many standard deviations the optimistic bound lies above
	// the model's prediction.
	Z float64 `json:"z"`
	// MaxStep bounds one exploration step: at most ×MaxStep or ÷MaxStep
	// the current size.
	MaxStep float64 `json:"max_step"`
}

// Defaults.
const (
	DefaultMarginalEfficiency = 0.5
	DefaultHysteresis         = 0.05
	DefaultCostTolerance      = 0.05
	DefaultMeasureFor         = time.Minute
	DefaultMinInterval        = 3 * time.Minute
	DefaultNoReportsAfter     = 3 * time.Minute
	DefaultZ                  = 1.5
	DefaultMaxStep            = 2.0
)

// WithDefaults fills zero fields.
func (p Params) WithDefaults() Params {
	p.MarginalEfficiency = positiveOr(p.MarginalEfficiency, DefaultMarginalEfficiency)
	p.Hysteresis = positiveOr(p.Hysteresis, DefaultHysteresis)
	p.CostTolerance = positiveOr(p.CostTolerance, DefaultCostTolerance)
	p.MeasureFor = positiveOr(p.MeasureFor, DefaultMeasureFor)
	p.MinInterval = positiveOr(p.MinInterval, DefaultMinInterval)
	p.NoReportsAfter = positiveOr(p.NoReportsAfter, DefaultNoReportsAfter)
	p.Z = positiveOr(p.Z, DefaultZ)
	if p.MaxStep <= 1 {
		p.MaxStep = DefaultMaxStep
	}
	return p
}

// positiveOr is v, or def where v is not positive (unset or invalid).
func positiveOr[T float64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// State is what the autoscaler remembers between decisions (persisted).
type State struct {
	// Target is the size it chose; 0 before its first decision.
	Target int `json:"target,omitempty"`
	// ChangedAt is when Target last changed, ChangedRound the rendezvous
	// round then: only later rounds measure the new size.
	ChangedAt    time.Time `json:"changed_at,omitzero"`
	ChangedRound int       `json:"changed_round,omitempty"`
	// Why is the explanation of the last change.
	Why string `json:"why,omitempty"`
}

// Input is everything one decision looks at.
type Input struct {
	Now    time.Time
	Policy Policy
	// Min, Max and Desired are the spec's node counts (Desired 0: unset).
	Min, Max, Desired int
	State             State
	// Round is the fleet's current rendezvous round.
	Round Round
	// Tracker holds the throughput observations and the latest report;
	// nil means none.
	Tracker *Tracker
	// InstanceType the fleet runs on: the model is fitted to its
	// observations when there are any.
	InstanceType string
	// Prices[i] is what the (i+1)-th node costs per hour: n nodes cost
	// the sum of the first n (the fleet keeps its cheapest nodes and adds
	// the offering placement would use). Missing entries repeat the last;
	// none at all counts every node as 1 (node-hours instead of dollars).
	Prices []float64
	// Rate is the expected interruptions per node-hour; Changeover what
	// one costs the whole job in time (restart plus lost progress).
	Rate       float64
	Changeover time.Duration
	// Deadline, when set with WorkLeft (samples), asks for the cheapest
	// size that still finishes in time. WorkLeftAtMax, used when WorkLeft
	// is 0, gives the work left as time at max_nodes (the spec's work).
	Deadline      time.Time
	WorkLeft      float64
	WorkLeftAtMax time.Duration
	// Network, when known, gives sizes not measured yet a first guess
	// while only one size is measured (NetworkPrior).
	Network NetworkPrior
	Params  Params
}

// Option is one size as the decision saw it.
type Option struct {
	Nodes int `json:"nodes"`
	// SamplesPerSec is the measured mean when Measured, else the model's
	// prediction; 0 when neither knows. Low and High bound it.
	SamplesPerSec float64 `json:"samples_per_s,omitempty"`
	Low           float64 `json:"low,omitempty"`
	High          float64 `json:"high,omitempty"`
	Measured      bool    `json:"measured,omitempty"`
	Seconds       float64 `json:"seconds,omitempty"`
	CostPerHour   float64 `json:"cost_per_hour"`
	// Useful is the fraction of time that makes progress, given the
	// interruptions a gang this size expects: 1/(1 + n·rate·changeover).
	Useful float64 `json:"useful"`
	// CostPerMillion is the expected $ per million samples of progress
	// (the goodput objective); 0 when the throughput is unknown.
	CostPerMillion float64 `json:"cost_per_million_samples,omitempty"`
	// FinishSeconds, with a deadline, is the expected time to do the
	// work left at this size.
	FinishSeconds float64 `json:"finish_seconds,omitempty"`
	// Note says how the decision judged it.
	Note string `json:"note,omitempty"`
}

func (o Option) goodput() float64 { return o.SamplesPerSec * o.Useful }

// Decision is the chosen size and why.
type Decision struct {
	Target int    `json:"target"`
	Policy Policy `json:"policy"`
	// Reason is a keyword: pinned, max, fixed, starting, no-reports,
	// measuring, holding, goodput, exploring, deadline, deadline-late.
	Reason string `json:"reason"`
	// Explain says it for humans ("6 nodes: 4.1k samples/s at $2.10/h;
	// 8 would add 6% throughput for 33% more cost").
	Explain string   `json:"explain"`
	Options []Option `json:"options,omitempty"`
	Model   *Model   `json:"model,omitempty"`
	// Changed: Target differs from the input state's; State is the state
	// to keep.
	Changed bool  `json:"-"`
	State   State `json:"-"`
}

// Decide chooses the fleet's size. Pure: the same input gives the same
// decision.
func Decide(in Input) Decision {
	p := in.Params.WithDefaults()
	lo, hi := max(in.Min, 1), max(in.Max, in.Min, 1)
	clamp := func(n int) int { return min(max(n, lo), hi) }
	cur := in.State.Target
	if cur == 0 {
		cur = hi // before any decision the fleet aims at max_nodes, as without an autoscaler
	}
	cur = clamp(cur)
	d := Decision{Policy: in.Policy}
	if d.Policy == "" {
		d.Policy = Goodput
	}
	tr := in.Tracker
	var opts []Option
	var model *Model
	if tr != nil && tr.Latest != nil {
		// Without a report there is nothing to judge a size by (and a
		// large fleet's options would cost every pass for nothing).
		opts, model = options(&in, p, lo, hi)
	}
	f := format{nodes: len(in.Prices) == 0}
	d.Options, d.Model = opts, model
	switch {
	case in.Desired > 0:
		t := clamp(in.Desired)
		return finish(in, d, t, "pinned", fmt.Sprintf("desired_nodes pins %d nodes%s", t, f.describe(opts, t)))
	case d.Policy == Max:
		return finish(in, d, hi, "max", fmt.Sprintf("placement.scale = \"max\": %d nodes (max_nodes)%s", hi, f.describe(opts, hi)))
	case lo == hi:
		return finish(in, d, hi, "fixed", fmt.Sprintf("min_nodes = max_nodes = %d%s", hi, f.describe(opts, hi)))
	}
	if tr == nil || tr.Latest == nil {
		// Since the first decision (the fleet's first pass), else since the
		// running round closed.
		since := in.State.ChangedAt
		if since.IsZero() || in.State.Target == 0 {
			since = in.Round.ClosedAt
		}
		if in.Round.Closed && !since.IsZero() && in.Now.Sub(since) >= p.NoReportsAfter {
			return finish(in, d, hi, "no-reports", fmt.Sprintf("%d nodes (max_nodes): the workers reported no progress in %s, so throughput is unknown and progress is measured by round timing; report it through FLEETD_PROGRESS (docs/agent.md) to let fleetd size the fleet",
				hi, roundDur(in.Now.Sub(since))))
		}
		return finish(in, d, hi, "starting", fmt.Sprintf("%d nodes (max_nodes) until the workers' progress reports measure the throughput", hi))
	}
	if len(opts) == 0 || !anyMeasured(opts) {
		return finish(in, d, cur, "measuring", fmt.Sprintf("measuring %d nodes: no throughput measured yet (the workers' progress reports need a few seconds)", cur))
	}
	measured := tr.MeasuredAfter(in.State.ChangedRound)
	if in.State.Target != 0 && measured < p.MeasureFor.Seconds() {
		return finish(in, d, cur, "measuring", fmt.Sprintf("measuring %d nodes (%s of %s measured)%s", cur, roundDur(time.Duration(measured*float64(time.Second))), roundDur(p.MeasureFor), f.describe(opts, cur)))
	}
	t, reason, why := f.choose(in, p, opts, cur)
	if t != cur && in.State.Target != 0 && in.Now.Sub(in.State.ChangedAt) < p.MinInterval {
		next := in.State.ChangedAt.Add(p.MinInterval)
		return finish(in, d, cur, "holding", fmt.Sprintf("%d nodes until %s (min_interval), then %d: %s", cur, next.UTC().Format("15:04:05Z"), t, why))
	}
	return finish(in, d, t, reason, why)
}

// finish sets the target and the state to keep.
func finish(in Input, d Decision, target int, reason, why string) Decision {
	d.Target, d.Reason, d.Explain = target, reason, why
	d.State = in.State
	for i := range d.Options {
		if d.Options[i].Nodes == target && d.Options[i].Note == "" {
			d.Options[i].Note = "chosen"
		}
	}
	if in.State.Target != target {
		d.Changed = in.State.Target != 0
		d.State = State{Target: target, ChangedAt: in.Now, ChangedRound: in.Round.Number, Why: why}
		if !in.Round.Closed || in.Round.Nodes == target {
			// The round that measures the new size is this one: an open
			// round closes under its number, and a closed one of the new
			// size already runs it.
			d.State.ChangedRound = max(in.Round.Number-1, 0)
		}
	}
	return d
}

// options evaluates every size in [lo, hi].
func options(in *Input, p Params, lo, hi int) ([]Option, *Model) {
	meas := map[int]*sizeSum{}
	var model *Model
	if in.Tracker != nil {
		pts := in.Tracker.Points(in.InstanceType)
		meas = sumBySize(pts) // averaged in y, as the model is
		if m, ok := Fit(pts); ok {
			model = &m
		}
	}
	perNode := 0.0 // the best observed per-node rate: linear scaling's optimism
	s0, s1 := 0, 0 // the smallest and largest measured sizes
	for n, a := range meas {
		if a.w > 0 && a.wy > 0 {
			perNode = math.Max(perNode, a.w/a.wy)
			if s0 == 0 || n < s0 {
				s0 = n
			}
			s1 = max(s1, n)
		}
	}
	xAt := func(n int) float64 { return float64(n) * meas[n].w / meas[n].wy }
	if in.WorkLeft <= 0 && in.WorkLeftAtMax > 0 && s1 > 0 {
		// The spec's work is time at max_nodes: in samples, at its rate.
		xmax := 0.0
		if a := meas[hi]; a != nil && a.w > 0 {
			xmax = xAt(hi)
		} else if model != nil {
			xmax, _ = model.Throughput(hi)
		}
		in.WorkLeft = in.WorkLeftAtMax.Seconds() * xmax
	}
	first := func(int) (x, lo, hi float64, ok bool) { return }
	if s0 == s1 && s0 > 0 && in.Tracker != nil && in.Tracker.Latest != nil && in.Tracker.Latest.Nodes > 0 {
		perNodeBatch := in.Tracker.SamplesPerStep() / float64(in.Tracker.Latest.Nodes)
		first = func(n int) (float64, float64, float64, bool) { return in.Network.guess(s0, xAt(s0), perNodeBatch, n) }
	}
	var out []Option
	cost := 0.0
	for n := 1; n <= hi; n++ {
		cost += price(in.Prices, n-1)
		if n < lo {
			continue
		}
		o := Option{Nodes: n, CostPerHour: cost, Useful: 1}
		if in.Rate > 0 && in.Changeover > 0 {
			o.Useful = 1 / (1 + float64(n)*in.Rate*in.Changeover.Hours())
		}
		switch a := meas[n]; {
		case a != nil && a.w > 0:
			o.Measured, o.Seconds = true, a.w
			o.SamplesPerSec = float64(n) / (a.wy / a.w)
			o.Low, o.High = o.SamplesPerSec, o.SamplesPerSec
			if model != nil {
				if l, h, ok := model.Bounds(n, p.Z); ok && !math.IsInf(h, 0) {
					o.Low, o.High = math.Min(l, o.SamplesPerSec), math.Max(h, o.SamplesPerSec)
				}
			}
		case model == nil:
		case n > s0 && n < s1:
			// Between measured sizes the model interpolates.
			o.SamplesPerSec, _ = model.Throughput(n)
			o.Low, o.High, _ = model.Bounds(n, p.Z)
			o.High = math.Min(o.High, float64(n)*perNode*(1+p.Z*NoiseFloor))
		default:
			// Beyond them it only bounds what may be: never better than
			// linear scaling from the best per-node rate seen (above), nor
			// faster than the smallest measured size (below).
			l, h, ok := model.Bounds(n, p.Z)
			if !ok {
				// One size measured: the network's first guess, if any.
				if _, pl, ph, known := first(n); known {
					l, h, ok = pl, ph, true
					o.Note = "first guess from the network"
				}
			}
			if n > s1 {
				ceil := float64(n) * perNode
				if !ok {
					l, h = xAt(s1), ceil // one size: between no gain and linear
				}
				o.Low, o.High = math.Min(l, ceil), math.Min(h, ceil)
			} else {
				if !ok {
					l, h = xAt(s0)*float64(n)/float64(s0), xAt(s0) // between linear loss and none
				}
				o.Low, o.High = math.Min(l, xAt(s0)), math.Min(h, xAt(s0))
			}
		}
		if o.SamplesPerSec > 0 {
			o.CostPerMillion = costPerMillion(o.CostPerHour, o.goodput())
			if !in.Deadline.IsZero() && in.WorkLeft > 0 {
				o.FinishSeconds = in.WorkLeft / o.goodput()
			}
		}
		out = append(out, o)
	}
	return out, model
}

func price(prices []float64, i int) float64 {
	switch {
	case len(prices) == 0:
		return 1
	case i < len(prices):
		return prices[i]
	}
	return prices[len(prices)-1]
}

func costPerMillion(perHour, samplesPerSec float64) float64 {
	if samplesPerSec <= 0 {
		return 0
	}
	return perHour / (samplesPerSec * 3600) * 1e6
}

func anyMeasured(opts []Option) bool {
	for _, o := range opts {
		if o.Measured {
			return true
		}
	}
	return false
}

func find(opts []Option, n int) *Option {
	for i := range opts {
		if opts[i].Nodes == n {
			return &opts[i]
		}
	}
	return nil
}

// marginal is the marginal efficiency of growing from a to b: the
// relative goodput gained over the relative cost added. 1 is linear
// scaling at equal prices.
func marginal(a, b *Option) float64 {
	dc := b.CostPerHour/a.CostPerHour - 1
	if dc <= 0 || a.goodput() <= 0 {
		return math.Inf(1)
	}
	return (b.goodput()/a.goodput() - 1) / dc
}

// choose applies the goodput rule (with a deadline: the cheapest size
// that finishes in time) and exploration. It returns the size, the
// reason keyword and the explanation; it writes the options' notes.
//
// Goodput: from the smallest measured size, grow while each step's
// marginal efficiency (marginal) reaches MarginalEfficiency: the fleet
// keeps the cheapest cost per unit of progress except where speed comes
// cheap. Sizes between measured ones take the model's prediction; sizes
// beyond them are only explored, when the model's optimistic bound says
// the step may pass (above) or may fail (below).
func (f format) choose(in Input, p Params, opts []Option, cur int) (int, string, string) {
	if !in.Deadline.IsZero() && in.WorkLeft > 0 {
		return f.chooseDeadline(in, p, opts, cur)
	}
	var chain []*Option
	var first, last *Option // smallest and largest measured
	for i := range opts {
		o := &opts[i]
		if o.Measured {
			if first == nil {
				first = o
			}
			last = o
		}
		if o.SamplesPerSec > 0 && first != nil {
			chain = append(chain, o)
		}
	}
	// chainBest grows from the smallest measured size while each step
	// passes threshold; notes says whether to record the verdicts.
	chainBest := func(threshold float64, notes bool) *Option {
		best := first
		for _, o := range chain[1:] {
			if o.Nodes > last.Nodes {
				break
			}
			me := marginal(best, o)
			if notes {
				if me >= threshold {
					o.Note = fmt.Sprintf("worth it: adds %.0f%% of a proportional share", 100*me)
				} else {
					o.Note = fmt.Sprintf("not worth it: adds %.0f%% of a proportional share", 100*math.Max(me, 0))
				}
			}
			if me < threshold {
				break
			}
			best = o
		}
		return best
	}
	best := chainBest(p.MarginalEfficiency, true)
	if best == first {
		first.Note = "cheapest measured per sample"
	}
	// Exploration beyond the measured range.
	if best == last {
		var up *Option
		for i := range opts {
			o := &opts[i]
			if o.Nodes <= last.Nodes || o.High <= 0 {
				continue
			}
			opt := *o
			opt.SamplesPerSec = o.High
			if me := marginal(last, &opt); me >= p.MarginalEfficiency {
				o.Note = "untried: may be worth it"
				up = o
			} else if o.Note == "" {
				o.Note = "untried: not worth trying"
			}
		}
		if up != nil {
			t := min(up.Nodes, int(math.Ceil(float64(last.Nodes)*p.MaxStep)))
			return t, "exploring", f.exploreWhy(last, find(opts, t), true)
		}
	}
	if best == first {
		var down *Option
		for i := len(opts) - 1; i >= 0; i-- {
			o := &opts[i]
			if o.Nodes >= first.Nodes || o.High <= 0 || o.Measured {
				continue
			}
			opt := *o
			opt.SamplesPerSec = o.High
			if me := marginal(&opt, first); me < p.MarginalEfficiency {
				o.Note = "untried: may cost less per sample"
				down = o
			} else if o.Note == "" {
				o.Note = "untried: not worth trying"
			}
		}
		if down != nil {
			t := max(down.Nodes, int(math.Floor(float64(first.Nodes)/p.MaxStep)))
			return t, "exploring", f.exploreWhy(first, find(opts, t), false)
		}
	}
	// Hysteresis: the current size stays while the threshold moved by
	// Hysteresis towards it would still choose it.
	if c := find(opts, cur); c != nil && c != best && c.SamplesPerSec > 0 {
		switch {
		case c.Nodes > best.Nodes && chainBest(p.MarginalEfficiency-p.Hysteresis, false).Nodes >= c.Nodes:
			best = c
		case c.Nodes < best.Nodes && chainBest(p.MarginalEfficiency+p.Hysteresis, false).Nodes <= c.Nodes:
			best = c
		}
	}
	return best.Nodes, "goodput", f.describeChoice(opts, best)
}

func (f format) chooseDeadline(in Input, p Params, opts []Option, cur int) (int, string, string) {
	left := in.Deadline.Sub(in.Now).Seconds()
	margin := func(finish float64) float64 { return 2*in.Changeover.Seconds() + 0.1*finish }
	var best, fastest *Option
	for i := range opts {
		o := &opts[i]
		if o.SamplesPerSec <= 0 {
			continue
		}
		f := o.FinishSeconds
		if o.Nodes != cur {
			f += in.Changeover.Seconds()
		}
		if fastest == nil || o.goodput() > fastest.goodput() {
			fastest = o
		}
		if f+margin(f) <= left {
			o.Note = "finishes in time"
			if best == nil || o.CostPerMillion < best.CostPerMillion*(1-1e-9) ||
				(math.Abs(o.CostPerMillion-best.CostPerMillion) <= 1e-9*best.CostPerMillion && o.goodput() > best.goodput()) {
				best = o
			}
		} else {
			o.Note = "would finish late"
		}
	}
	if best != nil {
		// Sizes within CostTolerance of the cheapest cost per unit of
		// progress count as equally cheap: the fastest of them is taken.
		cheapest := best.CostPerMillion
		for i := range opts {
			o := &opts[i]
			if o.Note == "finishes in time" && o.CostPerMillion <= cheapest*(1+p.CostTolerance) && o.goodput() > best.goodput() {
				best = o
			}
		}
		// Hysteresis: the current size stays while it finishes in time
		// and costs at most CostTolerance + Hysteresis more.
		if c := find(opts, cur); c != nil && c != best && c.Note == "finishes in time" && c.CostPerMillion <= cheapest*(1+p.CostTolerance+p.Hysteresis) {
			best = c
		}
	}
	dl := in.Deadline.UTC().Format("2006-01-02 15:04Z")
	// An untried size below the smallest measured one may be cheaper and
	// still finish: the optimistic bound says so.
	if best != nil && best.Measured {
		first := -1
		for i := range opts {
			if opts[i].Measured {
				first = i
				break
			}
		}
		var down *Option
		for i := first - 1; i >= 0; i-- {
			o := &opts[i]
			if o.High <= 0 || o.Measured {
				continue
			}
			g := o.High * o.Useful
			f := in.WorkLeft/g + in.Changeover.Seconds()
			if costPerMillion(o.CostPerHour, g) < best.CostPerMillion*(1-p.Hysteresis) && f+margin(f) <= left {
				o.Note = "untried: may be cheaper and finish in time"
				down = o
			}
		}
		if down != nil && best == &opts[first] {
			t := max(down.Nodes, int(math.Floor(float64(best.Nodes)/p.MaxStep)))
			if o := find(opts, t); o != nil {
				return t, "exploring", fmt.Sprintf("trying %d nodes: %d measured %s at %s finishes by %s; the model's optimistic bound says %d may too, for less",
					t, best.Nodes, rate(best.SamplesPerSec), f.money(best.CostPerHour), dl, t)
			}
		}
	}
	if best != nil {
		why := fmt.Sprintf("%d nodes: the cheapest size that finishes by %s (%s at %s, done in %s)", best.Nodes, dl,
			rate(best.SamplesPerSec), f.money(best.CostPerHour), roundDur(time.Duration(best.FinishSeconds*float64(time.Second))))
		if s := find(opts, best.Nodes-1); s != nil && s.SamplesPerSec > 0 && s.Note == "would finish late" {
			why += fmt.Sprintf("; %d would need %s", s.Nodes, roundDur(time.Duration(s.FinishSeconds*float64(time.Second))))
		}
		return best.Nodes, "deadline", why
	}
	// No known size finishes in time: an untried larger one might.
	for i := len(opts) - 1; i >= 0; i-- {
		o := &opts[i]
		if o.SamplesPerSec == 0 && o.High > 0 && o.Nodes > cur {
			if f := in.WorkLeft / (o.High * o.Useful); f+in.Changeover.Seconds()+margin(f) <= left {
				t := min(o.Nodes, int(math.Ceil(float64(cur)*p.MaxStep)))
				o.Note = "untried: may finish in time"
				return t, "exploring", fmt.Sprintf("trying %d nodes: no measured size finishes by %s; %d may", t, dl, o.Nodes)
			}
		}
	}
	if fastest == nil {
		return cur, "deadline-late", fmt.Sprintf("%d nodes: no size is known to finish by %s", cur, dl)
	}
	return fastest.Nodes, "deadline-late", fmt.Sprintf("%d nodes: no size finishes by %s; the fastest (%s) needs %s", fastest.Nodes, dl,
		rate(fastest.SamplesPerSec), roundDur(time.Duration(fastest.FinishSeconds*float64(time.Second))))
}

// describeChoice explains a goodput choice against its neighbours.
func (f format) describeChoice(opts []Option, best *Option) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d nodes: %s at %s", best.Nodes, rate(best.SamplesPerSec), f.money(best.CostPerHour))
	// The next larger size with a figure: measured first, else predicted.
	var up *Option
	for i := range opts {
		o := &opts[i]
		if o.Nodes > best.Nodes && o.SamplesPerSec > 0 && o.Measured {
			up = o
			break
		}
	}
	if up == nil {
		for i := range opts {
			if o := &opts[i]; o.Nodes > best.Nodes && o.SamplesPerSec > 0 {
				up = o
				break
			}
		}
	}
	switch {
	case up != nil:
		verb := "would"
		if !up.Measured {
			verb = "should (model)"
		}
		fmt.Fprintf(&b, "; %d %s %s for %.0f%% more cost", up.Nodes, verb, gain(up.goodput()/best.goodput()-1), 100*(up.CostPerHour/best.CostPerHour-1))
	case best.Nodes == opts[len(opts)-1].Nodes:
		b.WriteString(" (max_nodes)")
		// The largest smaller measured size, for comparison.
		for i := len(opts) - 1; i >= 0; i-- {
			if o := &opts[i]; o.Measured && o.Nodes < best.Nodes {
				fmt.Fprintf(&b, "; %d would %s per sample and %s", o.Nodes, cheaperWords(o.CostPerMillion/best.CostPerMillion-1), gain(o.goodput()/best.goodput()-1))
				break
			}
		}
	}
	return b.String()
}

func (f format) exploreWhy(from, to *Option, up bool) string {
	if up {
		return fmt.Sprintf("trying %d nodes: %d measured %s at %s; the model's optimistic bound says %d may add up to %.0f%% throughput for %.0f%% more cost",
			to.Nodes, from.Nodes, rate(from.SamplesPerSec), f.money(from.CostPerHour), to.Nodes,
			100*(to.High*to.Useful/from.goodput()-1), 100*(to.CostPerHour/from.CostPerHour-1))
	}
	klo := costPerMillion(to.CostPerHour, to.High*to.Useful)
	return fmt.Sprintf("trying %d nodes: %d measured %s at %s; the model's optimistic bound says %d may cost up to %.0f%% less per sample",
		to.Nodes, from.Nodes, rate(from.SamplesPerSec), f.money(from.CostPerHour), to.Nodes, 100*(1-klo/from.CostPerMillion))
}

// describe is ": <figures at n>" when n has any, for pinned and fixed
// sizes.
func (f format) describe(opts []Option, n int) string {
	o := find(opts, n)
	if o == nil || o.SamplesPerSec <= 0 {
		return ""
	}
	src := "measured"
	if !o.Measured {
		src = "predicted"
	}
	return fmt.Sprintf("; %s %s at %s", src, rate(o.SamplesPerSec), f.money(o.CostPerHour))
}

// rate renders samples per second: "950 samples/s", "4.1k samples/s".
func rate(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.1fG samples/s", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1fM samples/s", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk samples/s", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk samples/s", v/1e3)
	case v >= 10:
		return fmt.Sprintf("%.0f samples/s", v)
	}
	return fmt.Sprintf("%.2f samples/s", v)
}

// Rate renders a throughput the way explanations do.
func Rate(v float64) string { return rate(v) }

// format renders costs: in dollars, or in nodes when no prices are known.
type format struct{ nodes bool }

func (f format) money(perHour float64) string {
	if f.nodes {
		return fmt.Sprintf("%g nodes", perHour)
	}
	return fmt.Sprintf("$%.2f/h", perHour)
}

// gain words a relative throughput change: "add 6% throughput", "lose 3%
// throughput", "add no throughput".
func gain(f float64) string {
	v := 100 * f
	switch {
	case v >= 0.5:
		return fmt.Sprintf("add %.0f%% throughput", v)
	case v <= -0.5:
		return fmt.Sprintf("lose %.0f%% throughput", -v)
	}
	return "add no throughput"
}

// cheaperWords words a relative cost change: "cost 12% less", "cost the
// same", "cost 5% more".
func cheaperWords(f float64) string {
	v := 100 * f
	switch {
	case v <= -0.5:
		return fmt.Sprintf("cost %.0f%% less", -v)
	case v >= 0.5:
		return fmt.Sprintf("cost %.0f%% more", v)
	}
	return "cost the same"
}

func roundDur(d time.Duration) string {
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
