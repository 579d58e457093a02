package placement

import (
	"fmt"
	"slices"
	"time"

	"github.com/fleetd/fleetd/fleet/spec"
)

// FallbackState is what the fallback policy remembers between passes. The
// daemon persists it per fleet; DecideCapacity returns the next value.
type FallbackState struct {
	// BelowMinSince is when the fleet last dropped below min_nodes; zero
	// while it is at or above min_nodes.
	BelowMinSince time.Time `json:"below_min_since,omitzero"`
	// Spot is the fleet's history of the spot market (ObserveSpot), by
	// offering key.
	Spot []SpotSeen `json:"spot,omitempty"`
}

// Equal reports whether s and o are the same state.
func (s FallbackState) Equal(o FallbackState) bool {
	return s.BelowMinSince.Equal(o.BelowMinSince) && slices.EqualFunc(s.Spot, o.Spot, SpotSeen.equal)
}

// Decision says which capacity types may be launched in this pass.
type Decision struct {
	Spot     bool `json:"spot"`
	OnDemand bool `json:"on_demand"`
	// OnDemandLimit caps how many on-demand nodes to add; < 0 is no cap.
	// The "after" fallback buys only what is needed to reach min_nodes.
	OnDemandLimit int `json:"on_demand_limit"`
	// KeepOnDemand forbids replacing live on-demand nodes by spot ones
	// (on-demand fleets; deadline mode while it wants on-demand).
	KeepOnDemand bool `json:"keep_on_demand"`
	// MinSpotRun: new spot nodes go only on offerings whose ExpectedRun
	// is at least this (deadline mode, SpotAdmission); 0 admits all.
	MinSpotRun time.Duration `json:"min_spot_run,omitempty"`
	Reason     string        `json:"reason"`
}

// SpotOnly is the decision to launch spot capacity only.
func SpotOnly(reason string) Decision {
	return Decision{Spot: true, Reason: reason}
}

// Progress is the training progress the deadline policy needs; the daemon
// measures it from closed rendezvous rounds.
type Progress struct {
	// Start is when the spec's work estimate was given (fleet applied).
	// Zero means now: no elapsed schedule, so only the safety net applies.
	Start time.Time `json:"start,omitzero"`
	// Done is the work completed since Start, in time at max_nodes
	// (running nodes / max_nodes integrated over time).
	Done time.Duration `json:"done"`
}

// DeadlineInput is what a DeadlinePolicy sees.
type DeadlineInput struct {
	Now      time.Time
	Start    time.Time
	Deadline time.Time
	// Work is the total work estimate at max_nodes; Done the part finished.
	Work time.Duration
	Done time.Duration
	// Changeover is the cost of one switch (launch + setup + lost progress).
	Changeover time.Duration
	// SpotAvailable: a spot placement can hold min_nodes now, on
	// offerings the policy admits (SpotAdmission).
	SpotAvailable bool
	// SpotOffered: spot capacity that can hold min_nodes exists, admitted
	// or not.
	SpotOffered bool
	// ChangeRate is the observed rate of spot run ends per hour of
	// running (ChangeRate).
	ChangeRate float64
	// OnDemandActive: the fleet has live on-demand nodes.
	OnDemandActive bool
}

// DeadlineDecision is a DeadlinePolicy's answer.
type DeadlineDecision struct {
	UseOnDemand bool
	// OnDemandOnly stops launching spot (the safety net: no more time for
	// interruptions).
	OnDemandOnly bool
	Reason       string
}

// DeadlinePolicy decides when a deadline fleet spends on-demand capacity.
// The simulator plugs in other policies to compare against the default.
type DeadlinePolicy interface {
	Decide(DeadlineInput) DeadlineDecision
}

// SpotAdmission is implemented by deadline policies that start spot only
// on offerings expected to run long enough (ExpectedRun). The reconciler
// asks before it looks for spot placements, so SpotAvailable in the
// DeadlineInput of Decide already counts admitted offerings only.
type SpotAdmission interface {
	// MinSpotRun is the expected run a spot offering needs for a new node
	// now; 0 admits every offering. SpotAvailable and SpotOffered of in
	// are not set yet.
	MinSpotRun(in DeadlineInput) time.Duration
}

// SlackPricer is implemented by deadline policies that put a price on
// slack: SlackWorth is what one hour of slack is worth now, in hours of
// work that end up on on-demand (SlackValue). Placement charges each
// expected interruption the slack its changeover costs at that value, so
// zones that stay up win more clearly as the slack runs short.
type SlackPricer interface {
	SlackWorth(in DeadlineInput) float64
}

// PriceWaiter is implemented by deadline policies that would rather wait
// for cheaper spot than pay a premium for spot now, while the slack
// allows it: MaxPremium is how much dearer per useful hour (Score) than
// the market's best spot offering a new spot node may be; 0 means any.
// Dearer offerings count as not offered, so the policy waits as it does
// when no spot is offered.
type PriceWaiter interface {
	MaxPremium(in DeadlineInput) float64
}

// UniformProgress is the deadline policy of Can't Be Late
// (NSDI'24): expected progress ep(t) = Work·(t−Start)/(Deadline−Start).
//   - Safety net: when the time left R < C + 2d (C = work left, d =
//     changeover), use on-demand only, until the end.
//   - On on-demand already: stay until Done ≥ ep(now + 2d) (hysteresis).
//   - Spot available: use spot (exploitation).
//   - Otherwise: on-demand when behind, Done < ep(now).
type UniformProgress struct{}

// Decide implements DeadlinePolicy.
func (UniformProgress) Decide(in DeadlineInput) DeadlineDecision {
	left := in.Work - in.Done
	if left <= 0 {
		return DeadlineDecision{Reason: "work done"}
	}
	r := in.Deadline.Sub(in.Now)
	if r < left+2*in.Changeover {
		return DeadlineDecision{UseOnDemand: true, OnDemandOnly: true,
			Reason: fmt.Sprintf("safety net: %s to deadline < %s work left + 2×%s changeover", r.Round(time.Second), left.Round(time.Second), in.Changeover)}
	}
	start := in.Start
	if start.IsZero() || start.After(in.Now) {
		start = in.Now
	}
	total := in.Deadline.Sub(start)
	ep := func(t time.Time) time.Duration {
		if total <= 0 {
			return in.Work
		}
		return time.Duration(float64(in.Work) * float64(t.Sub(start)) / float64(total))
	}
	if in.OnDemandActive {
		if want := ep(in.Now.Add(2 * in.Changeover)); in.Done < want {
			return DeadlineDecision{UseOnDemand: true,
				Reason: fmt.Sprintf("on on-demand until progress %s ≥ %s", in.Done.Round(time.Second), want.Round(time.Second))}
		}
	}
	if in.SpotAvailable {
		return DeadlineDecision{Reason: "spot available"}
	}
	if want := ep(in.Now); in.Done < want {
		return DeadlineDecision{UseOnDemand: true,
			Reason: fmt.Sprintf("behind schedule: progress %s < %s", in.Done.Round(time.Second), want.Round(time.Second))}
	}
	return DeadlineDecision{Reason: "on schedule; waiting for spot"}
}

// FallbackInput is what DecideCapacity needs.
type FallbackInput struct {
	Fleet *spec.Fleet
	State FallbackState
	Now   time.Time
	// Live is the number of live nodes (in flight included).
	Live int
	// OnDemandLive is how many of them are on-demand.
	OnDemandLive int
	// SpotViable: a spot-only placement can hold min_nodes (Choose with
	// SpotOnly returned CanHoldMin), on admitted offerings (MinSpotRun).
	SpotViable bool
	// SpotOffered: the same, counting every offering.
	SpotOffered bool
	// ChangeRate feeds the deadline policy (ChangeRate).
	ChangeRate float64
	Progress   Progress
	// Changeover is the deadline policy's d; 0 means the model's
	// default interruption cost.
	Changeover time.Duration
	// Policy is the deadline policy; nil means DefaultDeadlinePolicy.
	Policy DeadlinePolicy
}

// deadlineInput is what the deadline policy of in sees.
func deadlineInput(in FallbackInput) (DeadlinePolicy, DeadlineInput) {
	pol := in.Policy
	if pol == nil {
		pol = DefaultDeadlinePolicy()
	}
	d := in.Changeover
	if d <= 0 {
		d = DefaultInterruptionCost
	}
	return pol, DeadlineInput{
		Now: in.Now, Start: in.Progress.Start, Deadline: *in.Fleet.Deadline,
		Work: in.Fleet.Work, Done: in.Progress.Done, Changeover: d,
		SpotAvailable: in.SpotViable, SpotOffered: in.SpotOffered || in.SpotViable,
		ChangeRate: in.ChangeRate, OnDemandActive: in.OnDemandLive > 0,
	}
}

// spotDeadlineInput is deadlineInput for a spot fleet with a deadline
// fallback, the fleets MinSpotRun, SlackWorth and MaxPremium speak of; for
// any other the policy is nil, which no interface check admits.
func spotDeadlineInput(in FallbackInput) (DeadlinePolicy, DeadlineInput) {
	f := in.Fleet
	if f == nil || !f.Node.Spot || f.Placement.Fallback != spec.FallbackDeadline || f.Deadline == nil {
		return nil, DeadlineInput{}
	}
	return deadlineInput(in)
}

// MinSpotRun is the expected run (ExpectedRun) a spot offering needs
// for a new node of a deadline fleet whose policy admits spot
// (SpotAdmission); 0 admits every offering.
func MinSpotRun(in FallbackInput) time.Duration {
	pol, din := spotDeadlineInput(in)
	if a, ok := pol.(SpotAdmission); ok {
		return a.MinSpotRun(din)
	}
	return 0
}

// SlackWorth is what an hour of slack is worth to a deadline fleet whose
// policy prices it (SlackPricer); 0 otherwise.
func SlackWorth(in FallbackInput) float64 {
	pol, din := spotDeadlineInput(in)
	if sp, ok := pol.(SlackPricer); ok {
		return sp.SlackWorth(din)
	}
	return 0
}

// MaxPremium is the premium over the market's best spot offering a new
// spot node of a deadline fleet may cost (PriceWaiter); 0 means any.
func MaxPremium(in FallbackInput) float64 {
	pol, din := spotDeadlineInput(in)
	if pw, ok := pol.(PriceWaiter); ok {
		return pw.MaxPremium(din)
	}
	return 0
}

// DecideCapacity applies the fleet's on-demand fallback policy and returns
// the decision with the next fallback state.
func DecideCapacity(in FallbackInput) (Decision, FallbackState) {
	next := in.State
	minNodes := 0
	if in.Fleet != nil {
		minNodes = in.Fleet.MinNodes
	}
	below := in.Live < minNodes
	switch {
	case !below:
		next.BelowMinSince = time.Time{}
	case next.BelowMinSince.IsZero():
		next.BelowMinSince = in.Now
	}
	if in.Fleet == nil {
		return SpotOnly("no fleet"), next
	}
	if !in.Fleet.Node.Spot {
		return Decision{OnDemand: true, OnDemandLimit: -1, KeepOnDemand: true, Reason: "node asks for on-demand"}, next
	}
	switch in.Fleet.Placement.Fallback {
	case spec.FallbackNever:
		return SpotOnly("on-demand fallback is never"), next
	case spec.FallbackDeadline:
		if in.Fleet.Deadline == nil {
			return SpotOnly("deadline fallback without a deadline"), next
		}
		pol, din := deadlineInput(in)
		dd := pol.Decide(din)
		minRun := MinSpotRun(in)
		if !dd.UseOnDemand {
			d := SpotOnly("deadline: " + dd.Reason)
			d.MinSpotRun = minRun
			return d, next
		}
		return Decision{Spot: !dd.OnDemandOnly, OnDemand: true, OnDemandLimit: -1, KeepOnDemand: true, MinSpotRun: minRun, Reason: "deadline: " + dd.Reason}, next
	default: // FallbackAfter (the spec's default)
		after := in.Fleet.Placement.FallbackAfter
		if after <= 0 {
			after = spec.DefaultFallbackAfter
		}
		if in.SpotViable {
			return SpotOnly("spot available"), next
		}
		if !below {
			return SpotOnly("at or above min_nodes; waiting for spot"), next
		}
		since := in.Now.Sub(next.BelowMinSince)
		if since < after {
			return SpotOnly(fmt.Sprintf("below min_nodes for %s of %s before on-demand fallback", since.Round(time.Second), after)), next
		}
		return Decision{Spot: true, OnDemand: true, OnDemandLimit: minNodes - in.Live,
			Reason: fmt.Sprintf("no spot capacity and below min_nodes for %s: on-demand fallback", since.Round(time.Second))}, next
	}
}
