package stats

import (
	"fmt"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
)

// Tally is what the daemon derives from its own event log: interruption
// and boot-failure counts per fleet. The log is the one record every
// notice source (agents, provider polling, SQS, heartbeat loss) goes
// through exactly once, so counting there needs no hook in each source,
// and replaying it at start keeps the totals across daemon restarts.
type Tally struct {
	m *metrics // nil in a zero Tally: no counters

	mu     sync.Mutex
	next   uint64 // the seq after which events are not tallied yet
	fleets map[string]*fleetTally
}

type fleetTally struct {
	interruptions int // terminal notices
	recent        []api.InterruptionInfo
	bootFailures  []time.Time // recent failures before the node ran
}

const (
	maxRecentInterruptions = 50
	// BootAlertCount failures within BootAlertWindow raise an alert: one
	// failed boot is noise, several mean a bad image, setup or offering.
	BootAlertCount  = 3
	BootAlertWindow = 30 * time.Minute
)

// AlertBootFailures is the alert kind for repeated boot failures.
const AlertBootFailures = "repeated-boot-failures"

func (t *Tally) fleet(name string) *fleetTally {
	if t.fleets == nil {
		t.fleets = map[string]*fleetTally{}
	}
	ft, ok := t.fleets[name]
	if !ok {
		ft = &fleetTally{}
		t.fleets[name] = ft
	}
	return ft
}

// Next is the sequence number after which events are not tallied yet.
func (t *Tally) Next() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.next
}

// Event counts one event; events already counted (by Seq) are ignored,
// so a replay is harmless.
func (t *Tally) Event(e state.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.Seq <= t.next {
		return
	}
	t.next = e.Seq
	switch e.Type {
	case "notice":
		kind, source := e.Data["kind"], e.Data["source"]
		if t.m != nil {
			t.m.interruptions.WithLabelValues(e.Fleet, kind, source).Inc()
		}
		ft := t.fleet(e.Fleet)
		if k, err := interruption.ParseKind(kind); err == nil && k.Terminal() {
			ft.interruptions++
		}
		ft.recent = append(ft.recent, api.InterruptionInfo{Node: e.Node, Kind: kind, Source: source, At: e.Time, Seq: e.Seq})
		if len(ft.recent) > maxRecentInterruptions {
			ft.recent = append([]api.InterruptionInfo(nil), ft.recent[len(ft.recent)-maxRecentInterruptions:]...)
		}
	case "node.transition":
		if e.Data["to"] != string(state.NodeFailed) {
			return
		}
		from := e.Data["from"]
		if t.m != nil {
			t.m.nodeFailures.WithLabelValues(e.Fleet, from).Inc()
		}
		switch state.NodeState(from) {
		case state.NodeRequested, state.NodeProvisioning, state.NodeBooting:
			if k := placement.UnavailableKind(e.Data["unavailable"]); k == placement.UnavailableCapacity || k == placement.UnavailableQuota {
				// The cloud had no capacity or quota: not a boot failure
				// (the no-capacity and quota alerts say it).
				break
			}
			ft := t.fleet(e.Fleet)
			ft.bootFailures = append(ft.bootFailures, e.Time)
			if len(ft.bootFailures) > 2*BootAlertCount {
				ft.bootFailures = ft.bootFailures[len(ft.bootFailures)-BootAlertCount:]
			}
		}
	case "fleet.destroyed":
		// A new fleet of the same name starts from zero in status; the
		// Prometheus counters stay monotonic.
		delete(t.fleets, e.Fleet)
	}
}

// Interruptions returns a fleet's terminal-notice count and recent
// notices, oldest first.
func (t *Tally) Interruptions(fleet string) (int, []api.InterruptionInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ft, ok := t.fleets[fleet]
	if !ok {
		return 0, []api.InterruptionInfo{}
	}
	return ft.interruptions, append([]api.InterruptionInfo{}, ft.recent...)
}

// BootAlert reports repeated boot failures of a fleet.
func (t *Tally) BootAlert(fleet string, now time.Time) (api.AlertInfo, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ft, ok := t.fleets[fleet]
	if !ok {
		return api.AlertInfo{}, false
	}
	n := 0
	for _, at := range ft.bootFailures {
		if now.Sub(at) <= BootAlertWindow {
			n++
		}
	}
	if n < BootAlertCount {
		return api.AlertInfo{}, false
	}
	return api.AlertInfo{Kind: AlertBootFailures, Message: fmt.Sprintf("%d nodes failed before they ran in the last %s: check the image, setup commands and the agent's logs", n, BootAlertWindow)}, true
}
