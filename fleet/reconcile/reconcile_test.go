package reconcile

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
)

const step = 10 * time.Second

func TestConvergesThreeNodes(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	b := offering("us-east-1b", "p4d", providers.Spot, 12)
	w := newWorld(t, testFleet(2, 3), a, b)
	w.settle(step, 200)
	if c := w.count(); c[state.NodeRunning] != 3 || len(w.nodes) != 3 {
		t.Fatalf("states %v\n%s", c, w.dump())
	}
	if n := w.liveBy(func(n state.Node) bool { return n.Offering.Key() == a.Key() }); n != 3 {
		t.Fatalf("%d nodes on the cheapest offering\n%s", n, w.dump())
	}
	if w.creates != 3 {
		t.Fatalf("%d Create calls for 3 nodes", w.creates)
	}
	for _, n := range w.nodes {
		if n.InstanceID == "" || n.Address == "" {
			t.Fatalf("node without instance: %+v", n)
		}
	}
}

// TestNoticeOnOnDemandKeepsOffering: a notice on an on-demand node (a
// retirement, an operator's debug interrupt) drains and replaces it but
// does not mark its offering unavailable: on-demand capacity was not
// reclaimed, and it is the fallback of last resort.
func TestNoticeOnOnDemandKeepsOffering(t *testing.T) {
	od := offering("us-east-1a", "p4d", providers.OnDemand, 30)
	fl := testFleet(2, 2)
	fl.Node.Spot = false
	w := newWorld(t, fl, od)
	w.settle(step, 200)
	victim := w.nodes["n001"]
	deadline := w.now.Add(2 * time.Minute)
	w.notices = []interruption.Notice{{Node: victim.ID, Kind: interruption.SpotInterruption, Deadline: deadline, Source: "debug"}}
	p := Reconcile(w.input())
	if mk := actionsOf[MarkUnavailable](p); len(mk) != 0 {
		t.Fatalf("on-demand offering marked: %v", mk)
	}
	if len(actionsOf[Drain](p)) != 1 || len(actionsOf[Launch](p)) != 1 {
		t.Fatalf("want one drain and one replacement launch, got %v", p.Actions)
	}
}

func TestNoticeLaunchesReplacementInSamePass(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	a5 := offering("us-east-1a", "p5", providers.Spot, 11)
	b := offering("us-east-1b", "p4d", providers.Spot, 12)
	w := newWorld(t, testFleet(2, 3), a, a5, b)
	w.settle(step, 200)
	victim := w.nodes["n001"]
	deadline := w.now.Add(2 * time.Minute)
	w.notices = []interruption.Notice{{Node: victim.ID, Kind: interruption.SpotInterruption, Deadline: deadline, Source: "aws-imds"}}
	w.kills[victim.InstanceID] = deadline

	p := Reconcile(w.input())
	var order []string
	for _, a := range p.Actions {
		switch a := a.(type) {
		case Transition:
			if a.Node.ID == victim.ID && a.To == state.NodeDraining && a.Node.Deadline.Equal(deadline) {
				order = append(order, "drain-state")
			}
		case Drain:
			if a.NodeID == victim.ID && a.Deadline.Equal(deadline) {
				order = append(order, "drain")
			}
		case MarkUnavailable:
			if a.Key == victim.Offering.Key() && a.Kind == placement.UnavailableInterrupted {
				order = append(order, "mark")
			}
		case Launch:
			if a.Offering.Key() == victim.Offering.Key() {
				t.Fatalf("replacement on the interrupted offering: %s", a)
			}
			if a.Relaunch {
				t.Fatalf("unexpected relaunch %s", a)
			}
			order = append(order, "launch:"+a.Offering.Zone)
		}
	}
	if got := strings.Join(order, ","); got != "mark,drain-state,drain,launch:us-east-1a" {
		t.Fatalf("actions %q\n%v", got, p.Actions)
	}
	w.apply(p)
	// The same notice again (another source) is handled idempotently.
	w.notices = append(w.notices, interruption.Notice{Node: victim.ID, Kind: interruption.SpotInterruption, Deadline: deadline, Source: "sqs"})
	if p2 := Reconcile(w.input()); len(actionsOf[Launch](p2)) != 0 || len(actionsOf[Drain](p2)) != 0 {
		t.Fatalf("repeated notice acted on again: %v", p2.Actions)
	}
	w.tick(step)
	w.settle(step, 200)
	if got := w.nodes[victim.ID].State; got != state.NodeTerminated {
		t.Fatalf("victim %s\n%s", got, w.dump())
	}
	if c := w.count(); c[state.NodeRunning] != 3 {
		t.Fatalf("states %v\n%s", c, w.dump())
	}
}

func TestCapacityErrorMovesToNextZoneWithoutRetryStorm(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	b := offering("us-east-1b", "p4d", providers.Spot, 12)
	w := newWorld(t, testFleet(2, 3), a, b)
	w.failKeys[a.Key()] = true
	w.settle(step, 200)
	if n := w.liveBy(func(n state.Node) bool { return n.Offering.Zone == "us-east-1b" }); n != 3 {
		t.Fatalf("%d live in zone b\n%s", n, w.dump())
	}
	// Two more hours, with zone a's back-off expiring again and again:
	// the running job stays put and zone a is not retried.
	for i := 0; i < 720; i++ {
		w.tick(step)
		w.pass()
	}
	if w.attempts[a.Key()] > 3 {
		t.Fatalf("%d launch attempts on the failing offering", w.attempts[a.Key()])
	}
	if c := w.count(); c[state.NodeRunning] != 3 {
		t.Fatalf("states %v", c)
	}
	// Failed nodes are forgotten eventually.
	if c := w.count(); c[state.NodeFailed] != 0 {
		t.Fatalf("failed records kept: %v", c)
	}
}

func TestCapacityErrorKeepsRetryingBounded(t *testing.T) {
	// Only one zone and it has no capacity: the back-off doubles, so over
	// an hour the attempts stay a handful per node slot, not one per pass.
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	f := testFleet(2, 3)
	f.Placement.Fallback = "never"
	w := newWorld(t, f, a)
	w.failKeys[a.Key()] = true
	for i := 0; i < 360; i++ {
		w.pass()
		w.tick(step)
	}
	// 3, 6, 12, 24 min back-offs: 4 rounds of 3 launches in the hour.
	if got := w.attempts[a.Key()]; got > 15 {
		t.Fatalf("%d attempts in an hour", got)
	}
	if !hasAlert(w.alerts, AlertNoCapacity) {
		t.Fatalf("no no-capacity alert: %v", w.alerts)
	}
}

func hasAlert(as []Alert, kind string) bool {
	for _, a := range as {
		if a.Kind == kind {
			return true
		}
	}
	return false
}

func TestZoneCannotHoldMinMovesWholeJob(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	b := offering("us-east-1b", "p4d", providers.Spot, 12)
	w := newWorld(t, testFleet(2, 3), a, b)
	w.capacity[a.Key()] = 3
	w.settle(step, 200)
	if n := w.liveBy(func(n state.Node) bool { return n.Offering.Key() == a.Key() }); n != 3 {
		t.Fatalf("setup: %d in zone a\n%s", n, w.dump())
	}
	// Zone a loses two nodes without notice and has no capacity left.
	w.instances[w.nodes["n001"].InstanceID].State = providers.StateTerminated
	w.instances[w.nodes["n002"].InstanceID].State = providers.StateTerminated
	w.failKeys[a.Key()] = true

	p := Reconcile(w.input())
	var lost, drained int
	for _, tr := range actionsOf[Transition](p) {
		switch {
		case tr.To == state.NodeFailed && strings.HasPrefix(tr.Reason, "lost"):
			lost++
		case tr.Node.ID == "n003" && tr.To == state.NodeDraining:
			drained++
		}
	}
	launches := actionsOf[Launch](p)
	if lost != 2 || drained != 1 || len(launches) != 3 {
		t.Fatalf("lost %d drained %d launches %d\n%v", lost, drained, len(launches), p.Actions)
	}
	for _, l := range launches {
		if l.Offering.Zone != "us-east-1b" {
			t.Fatalf("launch in %s", l.Offering.Zone)
		}
	}
	w.apply(p)
	w.tick(step)
	w.settle(step, 200)
	if n := w.liveBy(func(n state.Node) bool { return n.Offering.Zone == "us-east-1b" && n.State == state.NodeRunning }); n != 3 {
		t.Fatalf("%d running in zone b\n%s", n, w.dump())
	}
	if n := w.liveBy(func(n state.Node) bool { return n.Offering.Zone == "us-east-1a" }); n != 0 {
		t.Fatalf("%d still live in zone a", n)
	}
}

func TestOnDemandFallbackAndReturnToSpot(t *testing.T) {
	spot := offering("us-east-1a", "p4d", providers.Spot, 10)
	od := offering("us-east-1a", "p4d", providers.OnDemand, 30)
	w := newWorld(t, testFleet(2, 3), spot, od)
	w.failKeys[spot.Key()] = true

	// Below min for less than 10 minutes: spot only.
	for w.now.Sub(t0) < 10*time.Minute-step {
		w.pass()
		w.tick(step)
	}
	if w.attempts[od.Key()] != 0 {
		t.Fatalf("on-demand used after %s", w.now.Sub(t0))
	}
	// Past 10 minutes: on-demand, but only up to min_nodes.
	for w.now.Sub(t0) < 15*time.Minute {
		w.pass()
		w.tick(step)
	}
	if n := w.liveBy(func(n state.Node) bool { return n.Offering.CapacityType == providers.OnDemand }); n != 2 {
		t.Fatalf("%d on-demand live, want min_nodes 2\n%s", n, w.dump())
	}
	if !hasAlert(w.alerts, AlertOnDemand) {
		t.Fatalf("no on-demand alert")
	}

	// Spot is back: on-demand nodes are swapped out one at a time, each
	// only after its spot replacement joined.
	w.failKeys[spot.Key()] = false
	for w.now.Sub(t0) < 2*time.Hour {
		p := w.pass()
		for _, tr := range actionsOf[Transition](p) {
			if tr.Node.Offering.CapacityType != providers.OnDemand || tr.From != state.NodeRunning {
				continue
			}
			for _, n := range w.nodes {
				if inFlight(n.State) {
					t.Fatalf("on-demand node %s retired while %s is %s: %v\n%s", tr.Node.ID, n.ID, n.State, p.Actions, w.dump())
				}
			}
		}
		w.tick(step)
	}
	if n := w.liveBy(func(n state.Node) bool { return n.Offering.CapacityType == providers.OnDemand }); n != 0 {
		t.Fatalf("%d on-demand still live\n%s", n, w.dump())
	}
	if n := w.liveBy(func(n state.Node) bool { return n.State == state.NodeRunning }); n != 3 {
		t.Fatalf("%d running\n%s", n, w.dump())
	}
	if w.swapOverflows == 0 {
		t.Fatalf("swap never overlapped (spot replacement must join before the on-demand node goes)")
	}
}

func TestOnDemandFallbackNever(t *testing.T) {
	spot := offering("us-east-1a", "p4d", providers.Spot, 10)
	od := offering("us-east-1a", "p4d", providers.OnDemand, 30)
	f := testFleet(2, 3)
	f.Placement.Fallback = "never"
	w := newWorld(t, f, spot, od)
	w.failKeys[spot.Key()] = true
	for i := 0; i < 180; i++ {
		w.pass()
		w.tick(step)
	}
	if w.attempts[od.Key()] != 0 {
		t.Fatalf("on-demand used with fallback never")
	}
}

func TestShrinkRateLimited(t *testing.T) {
	cheap := offering("us-east-1a", "p4d", providers.Spot, 10)
	dear := offering("us-east-1a", "p5", providers.Spot, 14)
	f := testFleet(1, 4)
	f.DesiredNodes = 4
	w := newWorld(t, f, cheap, dear)
	w.capacity[cheap.Key()] = 2
	w.advertise = true
	w.settleRunning(4, "setup")

	w.lastUp = w.now.Add(-time.Minute) // grew a minute ago
	f.DesiredNodes = 2
	p := w.pass()
	if d := actionsOf[Drain](p); len(d) != 0 || p.ScaledDown {
		t.Fatalf("drained within the cooldown: %v", p.Actions)
	}
	w.now = w.lastUp.Add(DefaultScaleDownCooldown)
	p = w.pass()
	drains := actionsOf[Drain](p)
	if len(drains) != 2 || !p.ScaledDown {
		t.Fatalf("want 2 drains after cooldown: %v", p.Actions)
	}
	for _, d := range drains {
		if w.nodes[d.NodeID].Offering.Key() != dear.Key() {
			t.Fatalf("drained %s, want the expensive nodes first", w.nodes[d.NodeID].Offering.Key())
		}
	}
	// Lowered again right away: waits for the cooldown since the last shrink.
	f.DesiredNodes = 1
	w.tick(step)
	if p := w.pass(); len(actionsOf[Drain](p)) != 0 {
		t.Fatalf("second shrink not rate-limited: %v", p.Actions)
	}
	w.tick(DefaultScaleDownCooldown)
	if p := w.pass(); len(actionsOf[Drain](p)) != 1 {
		t.Fatalf("second shrink after cooldown: %v", p.Actions)
	}
	w.settleRunning(1, "end")
}

func TestShrinkCancelsInFlightAtOnce(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	f := testFleet(1, 4)
	f.DesiredNodes = 4
	w := newWorld(t, f, a)
	w.noJoin = true
	w.pass() // 4 launched, booting
	w.tick(step)
	w.lastUp = w.now
	f.DesiredNodes = 2
	p := w.pass()
	if n := len(actionsOf[Terminate](p)); n != 2 || p.ScaledDown {
		t.Fatalf("want 2 booting nodes terminated at once: %v", p.Actions)
	}
}

func TestGrowthWaitsForCooldownReplacementsDoNot(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	a5 := offering("us-east-1a", "p5", providers.Spot, 11)
	f := testFleet(2, 4)
	f.DesiredNodes = 3
	w := newWorld(t, f, a, a5)
	w.settle(step, 200)
	w.lastDown = w.now.Add(-10 * time.Second)
	f.DesiredNodes = 4
	if p := w.pass(); len(actionsOf[Launch](p)) != 0 {
		t.Fatalf("grew inside the cooldown: %v", p.Actions)
	}
	// A notice inside the cooldown is replaced at once.
	victim := w.nodes["n001"]
	w.notices = []interruption.Notice{{Node: victim.ID, Kind: interruption.Preempted, Source: "gce-metadata"}}
	p := w.pass()
	if n := len(actionsOf[Launch](p)); n != 1 || p.ScaledUp {
		t.Fatalf("replacement: %d launches, scaledUp %v: %v", n, p.ScaledUp, p.Actions)
	}
	w.tick(DefaultScaleUpCooldown)
	if p := w.pass(); len(actionsOf[Launch](p)) != 1 || !p.ScaledUp {
		t.Fatalf("growth after cooldown: %v", p.Actions)
	}
}

// TestAutoscalerTarget: the autoscaler's target replaces max_nodes when
// desired_nodes is unset, never below min_nodes; a change it makes is
// acted on without the cooldowns, which still space the reconciler's own
// waves; desired_nodes pins the size whatever it says.
func TestAutoscalerTarget(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	f := testFleet(2, 4)
	w := newWorld(t, f, a)
	w.settleRunning(4, "without a target (max_nodes)")
	// Grew a minute ago; the autoscaler decides 2 now: drained at once.
	w.lastUp = w.now.Add(-time.Minute)
	w.target, w.targetAt = 2, w.now
	p := w.pass()
	if d := actionsOf[Drain](p); len(d) != 2 || !p.ScaledDown || p.Target != 2 {
		t.Fatalf("autoscaler's shrink waited: target %d, %v", p.Target, p.Actions)
	}
	w.lastDown = w.now
	w.settleRunning(2, "after shrinking")
	// Growth it decides goes at once too, even right after the shrink.
	w.tick(step)
	w.target, w.targetAt = 3, w.now
	if p := w.pass(); len(actionsOf[Launch](p)) != 1 || !p.ScaledUp {
		t.Fatalf("autoscaler's growth waited: %v", p.Actions)
	}
	w.lastUp = w.now
	w.settle(step, 200)
	// Below min_nodes it cannot go.
	w.target, w.targetAt = 1, w.now
	if p := w.pass(); p.Target != 2 {
		t.Fatalf("target %d below min_nodes", p.Target)
	}
	// desired_nodes pins.
	f.DesiredNodes = 4
	if p := w.pass(); p.Target != 4 {
		t.Fatalf("desired_nodes did not pin: target %d", p.Target)
	}
}

func TestOrphanGC(t *testing.T) {
	f := testFleet(1, 1)
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	tags := func(fleet, node, daemon string) map[string]string {
		m := map[string]string{providers.TagFleet: fleet, providers.TagNodeID: node}
		if daemon != "" {
			m[providers.TagDaemonID] = daemon
		}
		return m
	}
	now := t0
	inst := func(id, fleet, node, daemon string, age time.Duration) providers.Instance {
		in := providers.Instance{ID: id, Offering: a, State: providers.StateRunning, Tags: tags(fleet, node, daemon)}
		if age >= 0 {
			in.LaunchedAt = now.Add(-age)
		}
		return in
	}
	node := state.Node{ID: "n1", Fleet: "bert", State: state.NodeRunning, Offering: a, InstanceID: "i-1", CreatedAt: now.Add(-time.Hour), UpdatedAt: now.Add(-time.Hour)}
	in := Input{
		Fleet: f, DaemonID: "d1", Now: now, Nodes: []state.Node{node},
		Instances: []providers.Instance{
			inst("i-1", "bert", "n1", "d1", time.Hour),          // the node's own
			inst("i-young", "bert", "gone1", "d1", time.Minute), // orphan, within grace
			inst("i-old", "bert", "gone2", "d1", 6*time.Minute), // orphan, past grace
			inst("i-foreign", "bert", "x", "d2", time.Hour),     // another daemon's
			inst("i-untagged", "bert", "y", "", time.Hour),      // no daemon id
			inst("i-other", "gpt", "z", "d1", time.Hour),        // another fleet
			inst("i-noage", "bert", "w", "d1", -1),              // unknown age
			inst("i-dup", "bert", "n1", "d1", 10*time.Minute),   // duplicate of n1
			{ID: "i-dead", Offering: a, State: providers.StateTerminated, Tags: tags("bert", "v", "d1"), LaunchedAt: now.Add(-time.Hour)},
		},
		ObservedOK: map[string]bool{"aws": true},
		Offerings:  []providers.Offering{a},
		InRound:    map[string]bool{"n1": true},
	}
	p := Reconcile(in)
	var deleted []string
	for _, d := range actionsOf[DeleteOrphan](p) {
		deleted = append(deleted, d.Instance.ID)
	}
	if got := strings.Join(deleted, ","); got != "i-dup,i-old" {
		t.Fatalf("deleted %q\n%v", got, p.Actions)
	}
	for _, id := range []string{"i-foreign", "i-untagged", "i-noage"} {
		found := false
		for _, al := range p.Alerts() {
			found = found || al.Subject == id
		}
		if !found {
			t.Errorf("no alert for %s: %v", id, p.Alerts())
		}
	}
	if n := len(actionsOf[Terminate](p)); n != 0 {
		t.Fatalf("terminated the live node: %v", p.Actions)
	}
}

func TestCrashBeforeCreateRelaunchesSameToken(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	w := newWorld(t, testFleet(2, 3), a)
	p := Reconcile(w.input())
	launches := actionsOf[Launch](p)
	if len(launches) != 3 {
		t.Fatalf("launches %v", p.Actions)
	}
	// The daemon persisted the requested records and died before Create.
	for _, l := range launches {
		w.nodes[l.Node.ID] = l.Node
	}
	// Restart: a new daemon reconciles from persisted records only.
	w.started = w.now.Add(5 * time.Second)
	w.tick(5 * time.Second)
	in := w.input()
	in.NewNodeID = func() string { t.Fatalf("fresh node id minted after a crash"); return "" }
	p2 := Reconcile(in)
	re := actionsOf[Launch](p2)
	if len(re) != 3 {
		t.Fatalf("relaunches %v", p2.Actions)
	}
	for i, l := range re {
		if !l.Relaunch || l.Node.ID != launches[i].Node.ID {
			t.Fatalf("relaunch %d = %s, want same id %s", i, l, launches[i].Node.ID)
		}
	}
	// Crash right after Create, before its result was persisted: the
	// nodes are provisioning and their instances exist.
	for _, l := range re {
		n := StartLaunch(l.Node, w.now)
		w.nodes[n.ID] = n
		if _, err := w.create(n); err != nil {
			t.Fatal(err)
		}
	}
	w.tick(step)
	p3 := Reconcile(w.input())
	adopts := actionsOf[Adopt](p3)
	if len(adopts) != 3 || len(actionsOf[Launch](p3)) != 0 {
		t.Fatalf("want 3 adoptions and no launch: %v", p3.Actions)
	}
	for _, ad := range adopts {
		if ad.Node.State != state.NodeBooting || ad.Node.InstanceID != "i-"+ad.Node.ID {
			t.Fatalf("adopted %+v", ad.Node)
		}
	}
	w.apply(p3)
	w.settle(step, 200)
	if c := w.count(); c[state.NodeRunning] != 3 || len(w.instances) != 3 {
		t.Fatalf("end %v, %d instances", c, len(w.instances))
	}
}

func TestProvisioningWithoutInstanceRetriesSameToken(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	w := newWorld(t, testFleet(1, 1), a)
	n := StartLaunch(state.Node{ID: "n9", Fleet: "bert", State: state.NodeRequested, Offering: a, CreatedAt: w.now, UpdatedAt: w.now}, w.now)
	w.nodes[n.ID] = n
	w.tick(10 * time.Second)
	if p := Reconcile(w.input()); len(actionsOf[Launch](p)) != 0 {
		t.Fatalf("relaunched before RelaunchAfter: %v", p.Actions)
	}
	w.tick(DefaultRelaunchAfter)
	p := Reconcile(w.input())
	l := actionsOf[Launch](p)
	if len(l) != 1 || l[0].Node.ID != "n9" || !l[0].Relaunch {
		t.Fatalf("want a relaunch of n9: %v", p.Actions)
	}
	// With the provider's list failing nothing is concluded.
	w.listFail["aws"] = true
	p = Reconcile(w.input())
	if len(actionsOf[Launch](p)) != 0 || !hasAlert(p.Alerts(), AlertObserve) {
		t.Fatalf("acted on a failed list: %v", p.Actions)
	}
	// An offering that became unavailable is not retried: the node fails.
	w.listFail["aws"] = false
	w.mark(a.Key(), placement.UnavailableCapacity, "ICE")
	p = Reconcile(w.input())
	if tr := actionsOf[Transition](p); len(tr) != 1 || tr[0].To != state.NodeFailed || len(actionsOf[Launch](p)) != 0 {
		t.Fatalf("want n9 failed, no launch: %v", p.Actions)
	}
}

func TestBootTimeout(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	b := offering("us-east-1a", "p5", providers.Spot, 11)
	w := newWorld(t, testFleet(1, 1), a, b)
	w.noJoin = true
	w.pass()
	var p Plan
	for w.now.Sub(t0) < DefaultBootTimeout {
		w.tick(step)
		p = w.pass()
		if len(actionsOf[Terminate](p)) > 0 {
			break
		}
	}
	if w.now.Sub(t0) < DefaultBootTimeout {
		t.Fatalf("timed out early at %s", w.now.Sub(t0))
	}
	tr := actionsOf[Transition](p)
	mk := actionsOf[MarkUnavailable](p)
	term := actionsOf[Terminate](p)
	l := actionsOf[Launch](p)
	if len(tr) != 1 || tr[0].To != state.NodeFailed || len(term) != 1 || len(mk) != 1 || mk[0].Kind != placement.UnavailableBootFailure || mk[0].Key != a.Key() {
		t.Fatalf("boot timeout plan: %v", p.Actions)
	}
	if len(l) != 1 || l[0].Offering.Key() != b.Key() {
		t.Fatalf("replacement should avoid the boot-failed offering: %v", p.Actions)
	}
	// After a daemon restart agents get a full boot timeout to reconnect.
	w.started = w.now
	w.tick(DefaultBootTimeout - time.Minute)
	if p := w.pass(); len(actionsOf[Terminate](p)) != 0 {
		t.Fatalf("timed out within the restart grace: %v", p.Actions)
	}
}

func TestLostWithoutNotice(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	w := newWorld(t, testFleet(2, 2), a)
	w.settle(step, 200)
	victim := w.nodes["n001"]
	w.deleteInstance(victim.InstanceID)
	w.listFail["aws"] = true
	if p := Reconcile(w.input()); len(actionsOf[Transition](p)) != 0 || len(actionsOf[Launch](p)) != 0 {
		t.Fatalf("acted while the list failed: %v", p.Actions)
	}
	w.listFail["aws"] = false
	p := Reconcile(w.input())
	tr := actionsOf[Transition](p)
	if len(tr) != 1 || tr[0].To != state.NodeFailed || !strings.Contains(tr[0].Reason, "lost") {
		t.Fatalf("want the node lost: %v", p.Actions)
	}
	if mk := actionsOf[MarkUnavailable](p); len(mk) != 1 || mk[0].Kind != placement.UnavailableInterrupted {
		t.Fatalf("spot loss must count as an interruption: %v", p.Actions)
	}
	// Its offering is the only one and is now marked: no replacement yet.
	if l := actionsOf[Launch](p); len(l) != 0 {
		t.Fatalf("relaunched on the interrupted offering: %v", p.Actions)
	}
	w.apply(p)
	w.tick(placement.UnavailableInterrupted.TTLFor(1))
	w.settle(step, 400)
	if c := w.count(); c[state.NodeRunning] != 2 {
		t.Fatalf("not replaced after the back-off: %v\n%s", c, w.dump())
	}
}

func TestDestroy(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	w := newWorld(t, testFleet(2, 3), a)
	w.settle(step, 200)
	w.lastDown = w.now // cooldowns do not apply to destroy
	in := w.input()
	in.Destroying = true
	p := Reconcile(in)
	if d := actionsOf[Drain](p); len(d) != 3 || len(actionsOf[Launch](p)) != 0 || p.Target != 0 {
		t.Fatalf("destroy plan: %v", p.Actions)
	}
	w.apply(p)
	for i := 0; i < 30; i++ {
		w.tick(step)
		in := w.input()
		in.Destroying = true
		w.apply(Reconcile(in))
	}
	if c := w.count(); c[state.NodeTerminated] != 3 {
		t.Fatalf("after destroy: %v", c)
	}
	for _, in := range w.instances {
		if in.State != providers.StateTerminated {
			t.Fatalf("instance %s left", in.ID)
		}
	}
	// A deleted fleet (nil spec) also scales to zero.
	in = w.input()
	in.Fleet = nil
	in.Name = "bert"
	if p := Reconcile(in); len(actionsOf[Launch](p)) != 0 {
		t.Fatalf("launch without a spec")
	}
}

func TestForgetEndedNodes(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	ended := state.Node{ID: "old", Fleet: "bert", State: state.NodeTerminated, Offering: a, InstanceID: "i-old", UpdatedAt: t0.Add(-DefaultForgetAfter)}
	fresh := ended
	fresh.ID, fresh.UpdatedAt = "fresh", t0.Add(-time.Minute)
	p := Reconcile(Input{Fleet: testFleet(0, 0), Now: t0, Nodes: []state.Node{ended, fresh}, ObservedOK: map[string]bool{"aws": true}})
	f := actionsOf[ForgetNode](p)
	if len(f) != 1 || f[0].NodeID != "old" {
		t.Fatalf("forget: %v", p.Actions)
	}
}

func TestAfterLaunch(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	n := StartLaunch(state.Node{ID: "n1", State: state.NodeRequested, Offering: a}, t0)
	tests := []struct {
		name  string
		insts []providers.Instance
		err   error
		state state.NodeState
		kind  placement.UnavailableKind
		ok    bool
	}{
		{"success", []providers.Instance{{ID: "i-1", Address: "10.0.0.1"}}, nil, state.NodeBooting, "", true},
		{"capacity", nil, fmt.Errorf("create: %w", providers.InsufficientCapacity(errors.New("ICE"))), state.NodeFailed, placement.UnavailableCapacity, false},
		{"quota", nil, providers.QuotaExceeded(errors.New("limit")), state.NodeFailed, placement.UnavailableQuota, false},
		{"invalid config", nil, providers.InvalidConfig(errors.New("bad ami")), state.NodeFailed, placement.UnavailableLaunchError, false},
		{"transient retries same token", nil, providers.Transient(errors.New("throttled")), state.NodeProvisioning, "", false},
		{"unknown error retries same token", nil, errors.New("connection reset"), state.NodeProvisioning, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := AfterLaunch(n, tt.insts, tt.err, t0)
			if r.Node.State != tt.state || r.Succeeded != tt.ok {
				t.Fatalf("%+v", r)
			}
			if (r.Mark == nil) != (tt.kind == "") || (r.Mark != nil && (r.Mark.Kind != tt.kind || r.Mark.Key != a.Key())) {
				t.Fatalf("mark %+v", r.Mark)
			}
		})
	}
}

func TestQuotaAlert(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	rec := placement.MarkUnavailable(state.OfferingRecord{Key: a.Key()}, t0, "vCPU limit", placement.UnavailableQuota)
	p := Reconcile(Input{Fleet: testFleet(1, 1), Now: t0.Add(time.Minute), Offerings: []providers.Offering{a},
		Records: map[string]state.OfferingRecord{a.Key(): rec}, ObservedOK: map[string]bool{"aws": true}})
	if !hasAlert(p.Alerts(), AlertQuota) || !hasAlert(p.Alerts(), AlertNoCapacity) {
		t.Fatalf("alerts %v", p.Alerts())
	}
}

// richInput is a mid-flight world: notices, orphans, failures, mixed states.
func richInput(t *testing.T) Input {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	b := offering("us-east-1b", "p4d", providers.Spot, 12)
	od := offering("us-east-1a", "p4d", providers.OnDemand, 30)
	w := newWorld(t, testFleet(2, 4), a, b, od)
	w.settle(step, 200)
	w.notices = []interruption.Notice{
		{Node: "n001", Kind: interruption.SpotInterruption, Deadline: w.now.Add(2 * time.Minute), Source: "aws-imds"},
		{Instance: w.nodes["n002"].InstanceID, Kind: interruption.Rebalance, Source: "sqs"},
	}
	w.deleteInstance(w.nodes["n003"].InstanceID)
	w.instances["i-orphan"] = &providers.Instance{ID: "i-orphan", Offering: a, State: providers.StateRunning,
		Tags: map[string]string{providers.TagFleet: "bert", providers.TagNodeID: "zzz", providers.TagDaemonID: "d1"}, LaunchedAt: t0}
	w.nodes["n100"] = state.Node{ID: "n100", Fleet: "bert", State: state.NodeRequested, Offering: b, CreatedAt: w.now, UpdatedAt: w.now}
	w.mark(a.Key(), placement.UnavailableCapacity, "ICE")
	return w.input()
}

func TestDeterministic(t *testing.T) {
	in := richInput(t)
	ids := func() func() string {
		n := 0
		return func() string { n++; return fmt.Sprintf("x%d", n) }
	}
	in.NewNodeID = ids()
	p1 := Reconcile(in)
	if len(p1.Actions) < 5 {
		t.Fatalf("rich input gave a thin plan: %v", p1.Actions)
	}
	for i := 0; i < 20; i++ {
		in2 := in
		in2.NewNodeID = ids()
		r := rand.New(rand.NewPCG(uint64(i), 7))
		in2.Nodes = shuffled(r, in.Nodes)
		in2.Instances = shuffled(r, in.Instances)
		in2.Offerings = shuffled(r, in.Offerings)
		in2.Notices = shuffled(r, in.Notices)
		p2 := Reconcile(in2)
		if !reflect.DeepEqual(p1, p2) {
			t.Fatalf("plans differ:\n%v\n%v", p1.Actions, p2.Actions)
		}
	}
}

func shuffled[T any](r *rand.Rand, s []T) []T {
	out := append([]T(nil), s...)
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func TestReconcileDoesNotMutateInput(t *testing.T) {
	byID := func(a, b state.Node) int { return strings.Compare(a.ID, b.ID) }
	// growth: a settled fleet whose minimum rises, so the plan only
	// launches (an append to the records with none changed).
	growth := func(t *testing.T) Input {
		w := newWorld(t, testFleet(2, 4), offering("us-east-1a", "p4d", providers.Spot, 10))
		w.settle(step, 200)
		w.fleet.MinNodes, w.fleet.MaxNodes = len(w.nodes)+1, len(w.nodes)+1
		return w.input()
	}
	// Sorted records (as the store returns them) are used in place until
	// one changes; unsorted ones are copied to be sorted.
	tests := []struct {
		name  string
		input func(*testing.T) Input
		order func(a, b state.Node) int
		// the plan must change records (Transition) or only add (Launch)
		wantTransitions bool
	}{
		{"sorted by id", richInput, byID, true},
		{"reverse order", richInput, func(a, b state.Node) int { return byID(b, a) }, true},
		{"sorted, launches only", growth, byID, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.input(t)
			slices.SortFunc(in.Nodes, tc.order)
			before := fmt.Sprintf("%+v", in.Nodes)
			// Spare capacity: an append by the planner must not land in it.
			in.Nodes = append(in.Nodes, state.Node{ID: "spare"})[:len(in.Nodes)]
			p := Reconcile(in)
			if got := len(actionsOf[Transition](p)) > 0; got != tc.wantTransitions || len(actionsOf[Launch](p)) == 0 {
				t.Fatalf("not the plan this case needs (transitions %v, launches wanted): %v", got, p.Actions)
			}
			if after := fmt.Sprintf("%+v", in.Nodes); after != before {
				t.Fatalf("input nodes mutated")
			}
			if spare := in.Nodes[:len(in.Nodes)+1][len(in.Nodes)]; spare.ID != "spare" {
				t.Fatalf("the planner wrote past the input's length: %+v", spare)
			}
		})
	}
}

// TestPropertyRandomMarket drives the reconciler through a seeded random
// market (capacity errors, notices, silent losses, failed lists, target
// changes, daemon crashes mid-plan) and checks the invariants after every
// pass; once the chaos stops the fleet must converge to its target.
func TestPropertyRandomMarket(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 42))
			offs := []providers.Offering{
				offering("us-east-1a", "p4d", providers.Spot, 10),
				offering("us-east-1a", "p5", providers.Spot, 13),
				offering("us-east-1b", "p4d", providers.Spot, 11),
				offering("us-west-2a", "p4d", providers.Spot, 9),
				offering("us-east-1a", "p4d", providers.OnDemand, 30),
			}
			f := testFleet(2, 5)
			f.Placement.Colocate = []spec.Colocate{spec.ColocateZone, spec.ColocateRegion, spec.ColocateNone}[r.IntN(3)]
			f.DesiredNodes = 2 + r.IntN(4)
			f.Placement.FallbackAfter = time.Minute
			w := newWorld(t, f, offs...)
			w.params.ScaleDownCooldown = time.Minute
			for i := 0; i < 600; i++ {
				w.chaos(r, offs)
				p := Reconcile(w.input())
				if r.IntN(20) == 0 {
					w.crashApply(p, r.IntN(len(p.Actions)+1))
				} else {
					w.apply(p)
				}
				w.check()
				w.tick(time.Duration(5+r.IntN(20)) * time.Second)
			}
			t.Logf("colocate %s: %d creates, max live %d, max on-demand %d, %d swap overlaps", f.Placement.Colocate, w.creates, w.maxLiveSeen, w.onDemandSeen, w.swapOverflows)
			// Calm: no more failures; the fleet converges to its target.
			w.failKeys = map[string]bool{}
			w.listFail = map[string]bool{}
			w.notices = nil
			w.kills = map[string]time.Time{}
			w.now = w.now.Add(2 * time.Hour) // every back-off has expired
			// Losses hidden by a failed list surface only now, so their
			// back-offs (up to an hour) must be able to expire.
			w.quiet = time.Hour + time.Minute
			w.settle(30*time.Second, 1000)
			if n := w.liveBy(func(n state.Node) bool {
				return n.State == state.NodeRunning && n.Offering.CapacityType == providers.Spot
			}); n != f.TargetNodes() {
				t.Fatalf("converged to %d running, want %d\n%s", n, f.TargetNodes(), w.dump())
			}
			for _, in := range w.instances {
				if in.State == providers.StateTerminated {
					continue
				}
				n, ok := w.nodes[in.Tags[providers.TagNodeID]]
				if !ok || !Live(n.State) || n.InstanceID != in.ID {
					t.Fatalf("stray instance %s (node %+v)", in.ID, n)
				}
			}
		})
	}
}

// chaos perturbs the world at random.
func (w *world) chaos(r *rand.Rand, offs []providers.Offering) {
	if r.IntN(15) == 0 {
		k := offs[r.IntN(len(offs))].Key()
		w.failKeys[k] = !w.failKeys[k]
	}
	if r.IntN(60) == 0 { // spot outage everywhere, or its end
		out := !w.failKeys[offs[0].Key()]
		for _, o := range offs {
			if o.CapacityType == providers.Spot {
				w.failKeys[o.Key()] = out
			}
		}
	}
	if r.IntN(30) == 0 {
		w.listFail["aws"] = !w.listFail["aws"]
	}
	if r.IntN(40) == 0 {
		w.fleet.DesiredNodes = w.fleet.MinNodes + r.IntN(w.fleet.MaxNodes-w.fleet.MinNodes+1)
	}
	var live []state.Node
	for _, id := range sortedNodeIDs(w.nodes) {
		if n := w.nodes[id]; Live(n.State) && n.InstanceID != "" {
			live = append(live, n)
		}
	}
	if len(live) == 0 {
		return
	}
	n := live[r.IntN(len(live))]
	switch r.IntN(25) {
	case 0: // announced interruption
		d := w.now.Add(2 * time.Minute)
		w.notices = append(w.notices, interruption.Notice{Node: n.ID, Kind: interruption.SpotInterruption, Deadline: d, Source: "aws-imds"})
		w.kills[n.InstanceID] = d
	case 1: // silent loss
		w.deleteInstance(n.InstanceID)
	case 2: // heartbeat loss
		w.notices = append(w.notices, interruption.Notice{Node: n.ID, Kind: interruption.Lost, Source: "heartbeat"})
	}
}

func sortedNodeIDs(m map[string]state.Node) []string {
	var ids []string
	for id := range m {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// crashApply applies the first k actions, as a daemon that dies mid-plan;
// when the k-th is a launch it dies after persisting the requested record.
func (w *world) crashApply(p Plan, k int) {
	for i, a := range p.Actions {
		if i == k {
			if l, ok := a.(Launch); ok {
				w.nodes[l.Node.ID] = l.Node
			}
			return
		}
		w.apply(Plan{Actions: []Action{a}, Fallback: w.fallback})
	}
	w.apply(Plan{Fallback: p.Fallback})
}

// TestVanishedDuringTeardown: nodes whose instances end on their own while
// the fleet is torn down (a finished job powers its VMs off) end as
// terminated with the teardown's reason, and count no interruption.
func TestVanishedDuringTeardown(t *testing.T) {
	for _, tc := range []struct {
		name               string
		destroying, finish bool
		stopping           bool // the instance is stopping, not gone
		wantState          state.NodeState
		wantReason         string
		wantMarks          int
		wantTerminates     int
	}{
		{"running fleet: a loss", false, false, false, state.NodeFailed, "lost", 1, 0},
		{"job finished", true, true, false, state.NodeTerminated, "instance ended: job finished", 0, 0},
		{"fleet destroyed", true, false, false, state.NodeTerminated, "instance ended: fleet destroyed", 0, 0},
		{"job finished, instance stopping", true, true, true, state.NodeTerminating, "is stopping: job finished", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := offering("us-east-1a", "p4d", providers.Spot, 10)
			w := newWorld(t, testFleet(2, 2), a)
			w.settle(step, 200)
			victim := w.nodes["n001"]
			if tc.stopping {
				inst := w.instances[victim.InstanceID]
				inst.State = providers.StateStopping
				w.instances[victim.InstanceID] = inst
			} else {
				w.deleteInstance(victim.InstanceID)
			}
			in := w.input()
			in.Destroying, in.Finished = tc.destroying, tc.finish
			p := Reconcile(in)
			var got *Transition
			for _, tr := range actionsOf[Transition](p) {
				if tr.Node.ID == victim.ID {
					got = &tr
				}
			}
			if got == nil || got.To != tc.wantState || !strings.Contains(got.Reason, tc.wantReason) {
				t.Fatalf("transition of %s = %+v; want %s (%q): %v", victim.ID, got, tc.wantState, tc.wantReason, p.Actions)
			}
			if mk := actionsOf[MarkUnavailable](p); len(mk) != tc.wantMarks {
				t.Fatalf("marks = %v; want %d", mk, tc.wantMarks)
			}
			terms := 0
			for _, tm := range actionsOf[Terminate](p) {
				if tm.InstanceID == victim.InstanceID {
					terms++
				}
			}
			if terms != tc.wantTerminates {
				t.Fatalf("terminates of %s = %d; want %d: %v", victim.InstanceID, terms, tc.wantTerminates, p.Actions)
			}
		})
	}
}

// TestDrainedEndsDrainEarly: a draining node whose agent reported that
// its workers stopped and its checkpoint is stored is deleted at once,
// not at its drain deadline.
func TestDrainedEndsDrainEarly(t *testing.T) {
	a := offering("us-east-1a", "p4d", providers.Spot, 10)
	w := newWorld(t, testFleet(2, 2), a)
	w.settle(step, 200)
	n := w.nodes["n001"]
	n.State, n.Deadline = state.NodeDraining, w.now.Add(time.Hour)
	w.nodes[n.ID] = n
	if p := w.pass(); len(actionsOf[Terminate](p)) != 0 {
		t.Fatalf("deleted a draining node before its deadline or report: %v", p.Actions)
	}
	n = w.nodes["n001"]
	n.DrainedAt = w.now
	w.nodes[n.ID] = n
	p := w.pass()
	tr, term := actionsOf[Transition](p), actionsOf[Terminate](p)
	if len(tr) == 0 || tr[0].Node.ID != "n001" || tr[0].To != state.NodeTerminating || !strings.Contains(tr[0].Reason, "drained") {
		t.Fatalf("want n001 draining → terminating on its report: %v", p.Actions)
	}
	if len(term) != 1 || term[0].InstanceID != n.InstanceID {
		t.Fatalf("want n001's instance deleted: %v", p.Actions)
	}
}
