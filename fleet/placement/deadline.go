package placement

import (
	"fmt"
	"math"
	"time"
)

// DefaultDeadlinePolicy is fleetd's deadline policy: SlackReserve with its
// defaults.
func DefaultDeadlinePolicy() DeadlinePolicy { return SlackReserve{} }

// Defaults of SlackReserve.
const (
	// DefaultSlackReserve: 6 min of slack per hour of work left. Measured
	// on the V100 trace (3 zones, 52 h; docs/benchmarks.md): 0.1–0.25
	// are within 0.5 % of each other; 0.07 costs 1 % more, as waiting
	// eats the slack that later changeovers need.
	DefaultSlackReserve = 0.1
	// DefaultMaxPremium: while the slack allows waiting, spot is started
	// only within 5 % (per useful hour) of the best spot offering of
	// the market. Measured on the V100 trace (9 zones, 60 h; docs/sim.md):
	// 2 % waits too often, 10 % gives back a third of the gain.
	DefaultMaxPremium = 0.05
)

// SlackReserve is fleetd's deadline policy for jobs that may run in
// several zones, regions or clouds. It reasons about the slack
// σ = (deadline − now) − work left, the time the job can still lose:
// every start of an instance costs the changeover d of it, waiting for
// spot costs what it waits.
//
//   - Safety: a start on spot needs σ ≥ 2d + margin, so that after its
//     own changeover one more (to on-demand, after a preemption) still
//     fits. Below that, only on-demand is launched and on-demand nodes
//     are kept. On spot, σ does not shrink until a preemption, so a job
//     that started a spot node safely can always finish on on-demand.
//   - Spot worth starting (MinSpotRun): a spot run must be expected to
//     last long enough to pay for the slack its changeovers cost, valued
//     by SlackValue. Such spot is used, also instead of running on-demand
//     nodes.
//   - Spot offered but not expected to last: on-demand (never wait: the
//     capacity is there, only too short-lived to be worth the slack).
//   - No spot anywhere: wait while σ stays above the safety level plus a
//     reserve of Reserve hours of slack per hour of work left, kept for
//     the changeovers of the rest of the job; otherwise use on-demand
//     until spot is back.
//
// Unlike Uniform Progress it never buys on-demand to get "ahead of
// schedule": with several zones spot is usually back somewhere long
// before on-demand pays off, and slack is only worth something when it
// runs out.
type SlackReserve struct {
	// Reserve is the slack kept per hour of work left (0 means
	// DefaultSlackReserve; negative means none).
	Reserve float64
	// Margin is added to the safety threshold for decisions that come
	// late (reconcile interval, notice delivery); 0 means a quarter of
	// the changeover.
	Margin time.Duration
	// AnySpot turns the spot admission off: every spot offering with
	// capacity is used (the policy before MinSpotRun, for comparison).
	AnySpot bool
	// Premium is how much dearer per useful hour than the market's best
	// spot offering a spot start may be while the slack allows waiting
	// (0 means DefaultMaxPremium; negative means any).
	Premium float64
}

func (p SlackReserve) safety(d time.Duration) time.Duration {
	m := p.Margin
	if m <= 0 {
		m = d / 4
	}
	return 2*d + m
}

// MinSpotRun implements SpotAdmission. A spot start costs its changeover
// d of slack when its run ends (the start itself costs d whatever it
// starts); replacing running on-demand nodes costs one more d. With λ =
// SlackValue, the hours of work pushed to on-demand per hour of slack
// lost, the run must be expected to last λ·(slack it costs): its savings
// over on-demand, per hour, are the same on both sides. (λ·d ≤ 1/ν·P(…):
// the threshold stays below the work left.)
func (p SlackReserve) MinSpotRun(in DeadlineInput) time.Duration {
	if p.AnySpot {
		return 0
	}
	cost := in.Changeover
	if in.OnDemandActive {
		cost = 2 * in.Changeover
	}
	return time.Duration(p.SlackWorth(in) * float64(cost))
}

// SlackWorth implements SlackPricer: SlackValue of the free slack (above
// the safety level), 0 once the safety net decides or the work is done.
func (p SlackReserve) SlackWorth(in DeadlineInput) float64 {
	left := in.Work - in.Done
	d := in.Changeover
	free := in.Deadline.Sub(in.Now) - left - p.safety(d)
	if left <= 0 || d <= 0 || free < 0 {
		return 0 // done, or the safety net decides
	}
	return SlackValue(free, left, d, in.ChangeRate)
}

// MaxPremium implements PriceWaiter. While the slack stays above the
// level at which the policy waits when no spot is offered at all (safety
// plus reserve), waiting for cheaper spot costs nothing the job will
// miss, so a start may cost at most Premium more per useful hour than
// the best spot offering of the market, up or recently gone. Below that
// level, or while on-demand nodes run (the alternative to dear spot is
// then on-demand, not waiting), any price goes.
func (p SlackReserve) MaxPremium(in DeadlineInput) float64 {
	if p.Premium < 0 || in.OnDemandActive {
		return 0
	}
	left := in.Work - in.Done
	if left <= 0 || in.Deadline.Sub(in.Now)-left <= p.safety(in.Changeover)+p.reserve(left) {
		return 0
	}
	if p.Premium == 0 {
		return DefaultMaxPremium
	}
	return p.Premium
}

// reserve is the slack kept for the changeovers of the rest of the job.
func (p SlackReserve) reserve(left time.Duration) time.Duration {
	rho := p.Reserve
	if rho == 0 {
		rho = DefaultSlackReserve
	}
	return time.Duration(max(rho, 0) * float64(left))
}

// SlackValue is what one hour of slack is worth, in hours of work that
// end up on on-demand instead of spot. Model: the job's remaining spot
// runs end (preemptions) as a Poisson process of rate ν per hour of work
// (ChangeRate, observed); each end costs a changeover d of slack; the
// free slack pays for n = ⌊free/d⌋ of them; the (n+1)-th leaves only the
// safety net, i.e. on-demand for the rest. The expected work left at
// that point is S(n+1) = E[(C − T₍ₙ₊₁₎)⁺] (T₍ₖ₎ the k-th end), and
//
//	λ = (S(n+1) − S(n+2)) / d = P(N ≥ n+2) / (ν·d),  N ~ Poisson(ν·C)
//
// i.e. the chance that the job needs more changeovers than its slack
// pays for, times the hours of work one more changeover buys (1/ν) per
// hour of slack it costs (d). With slack to spare λ ≈ 0; when the slack
// runs short it grows to 1/(ν·d).
func SlackValue(free, left, d time.Duration, nu float64) float64 {
	if left <= 0 || d <= 0 || nu <= 0 {
		return 0
	}
	n := int(max(free, 0) / d)
	return PoissonTail(nu*left.Hours(), n+2) / (nu * d.Hours())
}

// PoissonTail is P(N ≥ k) for N ~ Poisson(mu), summed from k upward so
// that tiny tails keep their precision.
func PoissonTail(mu float64, k int) float64 {
	if k <= 0 {
		return 1
	}
	if mu <= 0 {
		return 0
	}
	lg, _ := math.Lgamma(float64(k) + 1)
	term := math.Exp(float64(k)*math.Log(mu) - mu - lg)
	sum := 0.0
	for j := k; j < k+10000; j++ {
		sum += term
		if term < sum*1e-15 && float64(j) > mu {
			break
		}
		term *= mu / float64(j+1)
	}
	return min(sum, 1)
}

// Decide implements DeadlinePolicy.
func (p SlackReserve) Decide(in DeadlineInput) DeadlineDecision {
	left := in.Work - in.Done
	if left <= 0 {
		return DeadlineDecision{Reason: "work done"}
	}
	d := in.Changeover
	slack := in.Deadline.Sub(in.Now) - left
	safe := p.safety(d)
	if slack < safe {
		return DeadlineDecision{UseOnDemand: true, OnDemandOnly: true,
			Reason: fmt.Sprintf("safety net: slack %s < 2×%s changeover + %s margin", slack.Round(time.Second), d, safe-2*d)}
	}
	if in.SpotAvailable {
		return DeadlineDecision{Reason: fmt.Sprintf("spot available (slack %s)", slack.Round(time.Second))}
	}
	if in.OnDemandActive {
		// Running on-demand nodes stay until spot replaces them; asking
		// for on-demand here would make the reconciler keep them even
		// once spot is back.
		return DeadlineDecision{Reason: fmt.Sprintf("on on-demand until spot worth starting is back (slack %s)", slack.Round(time.Second))}
	}
	if in.SpotOffered {
		return DeadlineDecision{UseOnDemand: true,
			Reason: fmt.Sprintf("spot offered but none expected to run %s (slack %s): on-demand", p.MinSpotRun(in).Round(time.Minute), slack.Round(time.Second))}
	}
	reserve := p.reserve(left)
	if slack > safe+reserve {
		return DeadlineDecision{Reason: fmt.Sprintf("no spot; waiting: slack %s > %s safety + %s reserve", slack.Round(time.Second), safe, reserve.Round(time.Second))}
	}
	return DeadlineDecision{UseOnDemand: true,
		Reason: fmt.Sprintf("no spot; slack %s ≤ %s safety + %s reserve: on-demand until spot is back", slack.Round(time.Second), safe, reserve.Round(time.Second))}
}
