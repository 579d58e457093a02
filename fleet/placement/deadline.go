package placement

import (
	"fmt"
	"time"
)

// DefaultDeadlinePolicy is fleetd's deadline policy: SlackReserve with its
// defaults.
func DefaultDeadlinePolicy() DeadlinePolicy { return SlackReserve{} }

// Defaults of SlackReserve.
const (
	// DefaultSlackReserve: 6 min of slack per hour of work left. Measured
	// on the V100 trace (docs/benchmarks.md): 0.08–0.2 are all within
	// 1 % of each other; below 0.05 waiting eats the slack that later
	// changeovers need.
	DefaultSlackReserve = 0.1
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
//   - Spot available: use it (also instead of a running on-demand node).
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
}

// Decide implements DeadlinePolicy.
func (p SlackReserve) Decide(in DeadlineInput) DeadlineDecision {
	left := in.Work - in.Done
	if left <= 0 {
		return DeadlineDecision{Reason: "work done"}
	}
	d := in.Changeover
	m := p.Margin
	if m <= 0 {
		m = d / 4
	}
	slack := in.Deadline.Sub(in.Now) - left
	safe := 2*d + m
	if slack < safe {
		return DeadlineDecision{UseOnDemand: true, OnDemandOnly: true,
			Reason: fmt.Sprintf("safety net: slack %s < 2×%s changeover + %s margin", slack.Round(time.Second), d, m)}
	}
	if in.SpotAvailable {
		return DeadlineDecision{Reason: fmt.Sprintf("spot available (slack %s)", slack.Round(time.Second))}
	}
	if in.OnDemandActive {
		// Running on-demand nodes stay until spot replaces them. Asking
		// for on-demand here would also keep them when spot shows up and
		// our own replacement takes the last free capacity: the spot
		// node would be scaled away again.
		return DeadlineDecision{Reason: fmt.Sprintf("on on-demand until spot is back (slack %s)", slack.Round(time.Second))}
	}
	rho := p.Reserve
	if rho == 0 {
		rho = DefaultSlackReserve
	}
	reserve := time.Duration(max(rho, 0) * float64(left))
	if slack > safe+reserve {
		return DeadlineDecision{Reason: fmt.Sprintf("no spot; waiting: slack %s > %s safety + %s reserve", slack.Round(time.Second), safe, reserve.Round(time.Second))}
	}
	return DeadlineDecision{UseOnDemand: true,
		Reason: fmt.Sprintf("no spot; slack %s ≤ %s safety + %s reserve: on-demand until spot is back", slack.Round(time.Second), safe, reserve.Round(time.Second))}
}
