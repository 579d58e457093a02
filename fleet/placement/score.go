// Package placement decides where a fleet's nodes go: which offerings pass
// the spec's constraints, how they rank by expected cost per useful
// GPU-hour, which offerings are temporarily unavailable, which colocation
// group a job lives in, and when on-demand capacity may be used.
//
// Everything here is a pure function of its inputs (the clock included):
// no I/O, no goroutines, no randomness, so the daemon and `fleetd sim` run
// the same decisions. The formulas are documented in docs/placement.md.
package placement

import (
	"math"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// Prior is a Bayesian prior on an offering's interruption rate, expressed
// as pseudo-observations: Interruptions seen over Hours of running.
type Prior struct {
	Interruptions float64 `json:"interruptions"`
	Hours         float64 `json:"hours"`
}

// Model holds the parameters of the cost model. The zero value of a field
// means its default (see DefaultModel).
type Model struct {
	// InterruptionCost is what one interruption costs in node time:
	// restart (boot + rendezvous) plus progress lost since the last
	// checkpoint.
	InterruptionCost time.Duration `json:"interruption_cost"`
	// SpotPrior and OnDemandPrior keep unseen offerings from being assumed
	// perfect (spot) while letting on-demand start at zero.
	SpotPrior     Prior `json:"spot_prior"`
	OnDemandPrior Prior `json:"on_demand_prior"`
	// AvailabilityWeight (W) and AvailabilityScale (K) shape the
	// price-capacity penalty W·K/(a+K) for an offering with a more
	// launchable instances.
	AvailabilityWeight float64 `json:"availability_weight"`
	AvailabilityScale  float64 `json:"availability_scale"`
	// PriceOnly ranks spot offerings by price and their records'
	// interruption rates alone, ignoring the market history's run lengths
	// and the job's slack (Outlook): the published baselines' "cheapest
	// zone with capacity", for comparison in fleetd sim.
	PriceOnly bool `json:"price_only,omitempty"`
}

// Defaults of the cost model.
const (
	DefaultInterruptionCost   = 10 * time.Minute
	DefaultAvailabilityWeight = 0.3
	DefaultAvailabilityScale  = 4.0
)

// DefaultModel returns the model with every default filled in.
func DefaultModel() Model {
	return Model{
		InterruptionCost:   DefaultInterruptionCost,
		SpotPrior:          Prior{Interruptions: 1, Hours: 20},
		OnDemandPrior:      Prior{Interruptions: 0, Hours: 20},
		AvailabilityWeight: DefaultAvailabilityWeight,
		AvailabilityScale:  DefaultAvailabilityScale,
	}
}

func (m Model) withDefaults() Model {
	d := DefaultModel()
	if m.InterruptionCost <= 0 {
		m.InterruptionCost = d.InterruptionCost
	}
	if m.SpotPrior.Hours <= 0 {
		m.SpotPrior = d.SpotPrior
	}
	if m.OnDemandPrior.Hours <= 0 {
		m.OnDemandPrior = d.OnDemandPrior
	}
	if m.AvailabilityWeight <= 0 {
		m.AvailabilityWeight = d.AvailabilityWeight
	}
	if m.AvailabilityScale <= 0 {
		m.AvailabilityScale = d.AvailabilityScale
	}
	return m
}

// Rate is the expected number of interruptions per hour of running on o:
// (I + prior.I) / (H + prior.H), from this deployment's own history. The
// cloud's spot placement score, when the offering has one, scales the
// spot prior (see ScorePriorFactor): it shapes the guess before this
// deployment has run there, and the learned history outweighs it as hours
// accumulate.
func (m Model) Rate(o providers.Offering, rec state.OfferingRecord) float64 {
	m = m.withDefaults()
	p := m.SpotPrior
	if o.CapacityType == providers.OnDemand {
		p = m.OnDemandPrior
	} else {
		p.Interruptions *= ScorePriorFactor(o.PlacementScore)
	}
	hours := rec.RunSeconds / 3600
	if hours < 0 {
		hours = 0
	}
	n := float64(rec.Interruptions)
	if n < 0 {
		n = 0
	}
	return (n + p.Interruptions) / (hours + p.Hours)
}

// ScorePriorFactor is how a spot placement score (1–10, 0 = none) scales
// the spot interruption prior: (11 − score)/5, so a score of 6 leaves the
// prior as it is, 10 divides it by 5 and 1 doubles it. A pool where a
// launch is unlikely to succeed is one whose spare capacity is thin, and
// thin pools are the ones reclaimed first.
func ScorePriorFactor(score int) float64 {
	if score < 1 || score > 10 {
		return 1
	}
	return float64(11-score) / 5
}

// Useful is the fraction of paid time that makes progress when
// interruptions arrive at rate per hour: 1/(1+rate·cost_h).
func (m Model) Useful(rate float64) float64 {
	m = m.withDefaults()
	return 1 / (1 + rate*m.InterruptionCost.Hours())
}

// Outlook is what ranking knows beyond each offering's own record: the
// fleet's history of the spot market and what an interruption costs the
// job now. The zero value ranks by the records alone.
type Outlook struct {
	Now time.Time
	// Spot is the fleet's market history (ObserveSpot). A spot offering
	// found here is rated by its observed up-runs: 1/ExpectedRun
	// interruptions per hour.
	Spot []SpotSeen
	// Lead is node time an interruption bills beyond the model's
	// InterruptionCost: the notice lead, during which the node only
	// drains.
	Lead time.Duration
	// SlackValue is λ (SlackWorth): hours of work pushed to on-demand per
	// hour of slack an interruption's changeover costs; 0 without a
	// deadline or with slack to spare.
	SlackValue float64
	// OnDemandPerGPU prices that work: the cheapest on-demand $/GPU-hour
	// the fleet may use.
	OnDemandPerGPU float64
	// Forecast, when set, replaces the market history's ExpectedRun
	// (fleetd sim's foresight policy only).
	Forecast RunForecast
}

// Candidate is an offering with its cost-model figures.
type Candidate struct {
	Offering providers.Offering `json:"offering"`
	// Rate is the expected interruptions per hour: 1/ExpectedRun for a
	// spot offering in the market history, else the learned rate of the
	// offering's record (Model.Rate).
	Rate float64 `json:"rate"`
	// ExpectedRun is, for spot offerings, how long a run started now is
	// expected to last before an interruption (ExpectedRun), in hours.
	ExpectedRun float64 `json:"expected_run_hours,omitempty"`
	// Useful is the useful fraction of paid time.
	Useful float64 `json:"useful"`
	// InterruptionCost is what interruptions are expected to cost per
	// useful GPU-hour, in $: Score minus the price per GPU-hour.
	InterruptionCost float64 `json:"interruption_cost"`
	// Score is the expected cost per useful GPU-hour:
	//
	//	p + rate · (p·(c + lead) + λ·c·(od − p))
	//
	// with p the price per GPU-hour: each interruption costs its
	// changeover c and the notice lead at the offering's price, and the
	// slack c takes, which λ turns into hours of work on on-demand at
	// od. GPU-less offerings count as one GPU. Without an outlook it is
	// price / (gpus · useful).
	Score float64 `json:"score"`
	// Weighted is Score with the strategy's availability weighting; lower
	// is better. It is what groups are compared by.
	Weighted float64 `json:"weighted"`
	// DataCost is what reading the fleet's data from here adds to Score
	// and Weighted, per GPU-hour (data.go).
	DataCost float64 `json:"data_cost,omitempty"`
}

// Evaluate computes o's figures under strategy s from its record alone.
func (m Model) Evaluate(o providers.Offering, rec state.OfferingRecord, s spec.Strategy) Candidate {
	return m.EvaluateIn(o, rec, s, Outlook{})
}

// EvaluateIn computes o's figures under strategy s with what the outlook
// knows. A spot offering in the market history is rated by how long its
// capacity is expected to stay up: when every zone has spot, that, not
// only the price, is what tells them apart.
func (m Model) EvaluateIn(o providers.Offering, rec state.OfferingRecord, s spec.Strategy, out Outlook) Candidate {
	m = m.withDefaults()
	if m.PriceOnly {
		out = Outlook{}
	}
	rate := m.Rate(o, rec)
	var er float64
	if o.CapacityType == providers.Spot {
		er = out.ExpectedRun(o, rec).Hours()
		if _, ok := SeenOf(out.Spot, o.Key()); (ok || out.Forecast != nil) && er > 0 {
			rate = 1 / er
		}
	}
	p := o.PricePerHour / float64(max(o.GPUs, 1))
	c := m.InterruptionCost.Hours()
	perIntr := p*(c+out.Lead.Hours()) + out.SlackValue*c*max(out.OnDemandPerGPU-p, 0)
	score := p + rate*perIntr
	w := score
	switch s {
	case spec.StrategyLowestPrice:
		w = o.PricePerGPUHour()
	case spec.StrategyCapacity:
		w = score
	default: // price-capacity
		w = score * (1 + m.availabilityPenalty(o.Available))
	}
	return Candidate{Offering: o, Rate: rate, ExpectedRun: er, Useful: 1 / (1 + rate*(c+out.Lead.Hours())),
		InterruptionCost: score - p, Score: score, Weighted: w}
}

// availabilityPenalty is W·K/(a+K); unknown availability (a<0) counts as
// a=K, i.e. half the maximum penalty.
func (m Model) availabilityPenalty(a int) float64 {
	k := m.AvailabilityScale
	av := float64(a)
	if a < 0 {
		av = k
	}
	return m.AvailabilityWeight * k / (av + k)
}

// capacityRank orders availabilities for the capacity strategy: known
// counts by size, unknown after every known positive count but before 0.
func capacityRank(a int) float64 {
	if a < 0 {
		return 0.5
	}
	return float64(a)
}

// less orders candidates under strategy s: best first. Ties fall through
// to more availability, then lower raw price, then the key, so the order
// is total and deterministic.
func less(a, b Candidate, s spec.Strategy) bool {
	if s == spec.StrategyCapacity {
		ra, rb := capacityRank(a.Offering.Available), capacityRank(b.Offering.Available)
		if ra != rb {
			return ra > rb
		}
		if a.Score != b.Score {
			return a.Score < b.Score
		}
	} else {
		if !almostEqual(a.Weighted, b.Weighted) {
			return a.Weighted < b.Weighted
		}
		if s == spec.StrategyLowestPrice && !almostEqual(a.Score, b.Score) {
			return a.Score < b.Score
		}
		ra, rb := capacityRank(a.Offering.Available), capacityRank(b.Offering.Available)
		if ra != rb {
			return ra > rb
		}
	}
	if a.Offering.PricePerHour != b.Offering.PricePerHour {
		return a.Offering.PricePerHour < b.Offering.PricePerHour
	}
	return a.Offering.Key() < b.Offering.Key()
}

func almostEqual(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}
