package reconcile

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// onDemandWithoutSpot wants on-demand whenever no spot placement is
// available, as Uniform Progress does when behind schedule.
type onDemandWithoutSpot struct{}

func (onDemandWithoutSpot) Decide(in placement.DeadlineInput) placement.DeadlineDecision {
	if in.SpotAvailable {
		return placement.DeadlineDecision{Reason: "spot"}
	}
	return placement.DeadlineDecision{UseOnDemand: true, Reason: "no spot: on-demand"}
}

// TestSpotSwapCompletesWhenItTakesTheLastCapacity: a job on on-demand
// fallback gets one spot node back when the zone's capacity returns. That
// node takes the last free capacity, so while it boots the market shows
// no spot. The reconciler counts the job's own booting spot node as spot
// available; otherwise a policy that wants on-demand without spot would
// retire the booting node, see the capacity free again, relaunch it —
// every pass, paying for every launch, never completing the swap.
// (SlackReserve and UniformProgress never ask for on-demand in that
// state, so the simulator's runs never showed it.)
func TestSpotSwapCompletesWhenItTakesTheLastCapacity(t *testing.T) {
	spotA := offering("us-east-1a", "p4d", providers.Spot, 10)
	odA := offering("us-east-1a", "p4d", providers.OnDemand, 30)
	tests := []struct {
		name      string
		advertise bool // the market reports free capacity (else unknown)
	}{
		{"capacity reported: the booting node took the last", true},
		{"capacity unknown", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := testFleet(1, 1)
			deadline := t0.Add(30 * time.Hour)
			f.Deadline, f.Work = &deadline, 24*time.Hour
			f.Placement.Fallback = spec.FallbackDeadline
			w := newWorld(t, f, spotA, odA)
			w.advertise = tt.advertise
			w.params.Deadline = onDemandWithoutSpot{}
			w.capacity[spotA.Key()] = 0
			for w.now.Sub(t0) < 20*time.Minute {
				w.pass()
				w.tick(step)
			}
			if n := w.liveBy(func(n state.Node) bool {
				return n.Offering.CapacityType == providers.OnDemand && n.State == state.NodeRunning
			}); n != 1 {
				t.Fatalf("%d on-demand nodes running, want 1\n%s", n, w.dump())
			}
			w.capacity[spotA.Key()] = 1
			spotLaunches, retiredBooting := 0, 0
			for w.now.Sub(t0) < 40*time.Minute {
				p := w.pass()
				for _, l := range actionsOf[Launch](p) {
					if l.Offering.Key() == spotA.Key() {
						spotLaunches++
					}
				}
				for _, tr := range actionsOf[Transition](p) {
					if tr.Node.Offering.CapacityType == providers.Spot && tr.From != state.NodeRunning && (ended(tr.To) || tr.To == state.NodeTerminating) {
						retiredBooting++
					}
				}
				w.tick(step)
			}
			if spotLaunches != 1 || retiredBooting != 0 {
				t.Fatalf("%d spot launches and %d booting spot nodes retired, want 1 and 0\n%s", spotLaunches, retiredBooting, w.dump())
			}
			if n := w.liveBy(func(n state.Node) bool { return n.Offering.Key() == spotA.Key() && n.State == state.NodeRunning }); n != 1 || w.liveBy(func(n state.Node) bool { return n.Offering.CapacityType == providers.OnDemand }) != 0 {
				t.Fatalf("swap did not complete\n%s", w.dump())
			}
		})
	}
}

// TestSpotAdmission: in deadline mode the reconciler launches spot only
// on offerings expected to run long enough for the slack left
// (placement.MinSpotRun, ExpectedRun from the fleet's market history).
// Spot a is cheaper but flapping (eight runs of 15 min ended), spot b
// has run for days. With little slack the job goes to b, or to
// on-demand when b is down; with plenty it takes the cheaper a.
func TestSpotAdmission(t *testing.T) {
	spotA := offering("us-east-1a", "p4d", providers.Spot, 10)
	spotB := offering("us-east-1b", "p4d", providers.Spot, 12)
	odA := offering("us-east-1a", "p4d", providers.OnDemand, 30)
	history := []placement.SpotSeen{
		{Key: spotA.Key(), Up: true, Since: t0, Ends: 8, UpSeconds: 2 * 3600},
		{Key: spotB.Key(), Up: true, Since: t0.Add(-5 * time.Hour), Ends: 1, UpSeconds: 30 * 3600},
	}
	if spotB.Key() < spotA.Key() {
		t.Fatal("history must be sorted by key")
	}
	tests := []struct {
		name   string
		slack  time.Duration
		bUp    bool
		want   string // offering key launched
		reason string // in the capacity decision
	}{
		{"little slack: the stable zone", 90 * time.Minute, true, spotB.Key(), "spot available"},
		{"little slack, stable zone down: on-demand", 90 * time.Minute, false, odA.Key(), "spot offered but none expected to run"},
		{"plenty of slack: the cheapest", 12 * time.Hour, true, spotA.Key(), "spot available"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := testFleet(1, 1)
			deadline := t0.Add(48*time.Hour + tt.slack)
			f.Deadline, f.Work = &deadline, 48*time.Hour
			f.Placement.Fallback = spec.FallbackDeadline
			w := newWorld(t, f, spotA, spotB, odA)
			w.advertise = true
			w.capacity[spotA.Key()] = 1
			w.capacity[spotB.Key()] = 0
			if tt.bUp {
				w.capacity[spotB.Key()] = 1
			}
			w.fallback.Spot = history
			w.progress = placement.Progress{Start: t0}
			w.params.Model.InterruptionCost = 12 * time.Minute
			p := w.pass()
			ls := actionsOf[Launch](p)
			if len(ls) != 1 || ls[0].Offering.Key() != tt.want {
				t.Fatalf("launches %v, want one on %s (min spot run %s: %s)", ls, tt.want, p.Capacity.MinSpotRun, p.Capacity.Reason)
			}
			if !strings.Contains(p.Capacity.Reason, tt.reason) {
				t.Fatalf("capacity reason %q, want %q", p.Capacity.Reason, tt.reason)
			}
		})
	}
}
