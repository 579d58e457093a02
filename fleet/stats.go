package fleet

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/rendezvous"
)

// recoveryStats tracks the two recovery durations fleetd promises to keep
// short: notice → survivors running again (the next closed rendezvous
// round), and replacement requested → joined.
type recoveryStats struct {
	mu sync.Mutex
	// pendingNotice: fleet → time of the oldest notice not yet followed by
	// a closed round.
	pendingNotice map[string]time.Time
	// launchAt: fleet/node → when its launch was requested.
	launchAt map[string]time.Time
	// Recoveries is the recent history, newest last.
	Recoveries []Recovery
	// reconcile durations per fleet (last pass).
	reconcileDur map[string]time.Duration
	// provider calls and errors by provider/op.
	calls, errs map[string]int
}

// Recovery is one measured recovery.
type Recovery struct {
	Fleet    string        `json:"fleet"`
	Node     string        `json:"node,omitempty"`
	Kind     string        `json:"kind"` // survivors-running | replacement-joined
	Duration time.Duration `json:"duration"`
	At       time.Time     `json:"at"`
}

func newRecoveryStats() *recoveryStats {
	return &recoveryStats{pendingNotice: map[string]time.Time{}, launchAt: map[string]time.Time{}, reconcileDur: map[string]time.Duration{},
		calls: map[string]int{}, errs: map[string]int{}}
}

const maxRecoveries = 200

func (s *recoveryStats) add(r Recovery) {
	s.Recoveries = append(s.Recoveries, r)
	if len(s.Recoveries) > maxRecoveries {
		s.Recoveries = s.Recoveries[len(s.Recoveries)-maxRecoveries:]
	}
}

func (d *Daemon) observeReconcile(fleet string, dur time.Duration) {
	d.stats.mu.Lock()
	d.stats.reconcileDur[fleet] = dur
	d.stats.mu.Unlock()
}

func (d *Daemon) countProviderCall(provider, op string, err error) {
	d.stats.mu.Lock()
	d.stats.calls[provider+"/"+op]++
	if err != nil {
		d.stats.errs[provider+"/"+op]++
	}
	d.stats.mu.Unlock()
}

func (d *Daemon) noteLaunchRequested(fleet, node string, at time.Time) {
	d.stats.mu.Lock()
	d.stats.launchAt[fleet+"/"+node] = at
	d.stats.mu.Unlock()
}

// noteJoined closes a replacement-requested → joined measurement.
func (d *Daemon) noteJoined(fleet, node string, at time.Time) (time.Duration, bool) {
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	t, ok := d.stats.launchAt[fleet+"/"+node]
	if !ok {
		return 0, false
	}
	delete(d.stats.launchAt, fleet+"/"+node)
	dur := at.Sub(t)
	d.stats.add(Recovery{Fleet: fleet, Node: node, Kind: "replacement-joined", Duration: dur, At: at})
	return dur, true
}

func (d *Daemon) noteRunning(fleet string, n state.Node) {}

// noteNotice starts a notice → survivors-running measurement.
func (d *Daemon) noteNotice(fleet string, at time.Time) {
	d.stats.mu.Lock()
	if _, ok := d.stats.pendingNotice[fleet]; !ok {
		d.stats.pendingNotice[fleet] = at
	}
	d.stats.mu.Unlock()
}

// noteRoundClosed ends a pending notice measurement for the fleet.
func (d *Daemon) noteRoundClosed(fleet string, at time.Time) (time.Duration, bool) {
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	t, ok := d.stats.pendingNotice[fleet]
	if !ok {
		return 0, false
	}
	delete(d.stats.pendingNotice, fleet)
	dur := at.Sub(t)
	d.stats.add(Recovery{Fleet: fleet, Kind: "survivors-running", Duration: dur, At: at})
	return dur, true
}

// onRendezvous turns rendezvous events into fleet events and recovery
// measurements. It runs under the rendezvous fleet lock: no calls back.
func (d *Daemon) onRendezvous(fleet string, ev rendezvous.Event) {
	e := state.Event{Fleet: fleet, Node: ev.Node, Type: "rendezvous." + string(ev.Kind), Message: ev.String(),
		Data: map[string]string{"round": fmt.Sprint(ev.Round)}}
	if ev.Kind == rendezvous.EventRoundClosed {
		e.Data["world_size"] = fmt.Sprint(ev.WorldSize)
		e.Data["nodes"] = fmt.Sprint(ev.Nodes)
		if dur, ok := d.noteRoundClosed(fleet, ev.At); ok {
			e.Data["since_notice"] = dur.String()
			e.Message += fmt.Sprintf("; survivors running %.2fs after the notice", dur.Seconds())
		}
	}
	// Appending goes through a goroutine: the callback must not block on I/O
	// while the rendezvous holds its lock; order is kept by the channel.
	select {
	case d.rdzvEvents <- e:
	default:
		d.log.Warn("rendezvous event dropped: event queue full", "fleet", fleet, "kind", ev.Kind)
	}
}

// rdzvEventWriter persists rendezvous events in order.
func (d *Daemon) rdzvEventWriter(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-d.rdzvEvents:
			d.appendEvent(context.Background(), e)
			if e.Type == "rendezvous."+string(rendezvous.EventRoundClosed) {
				d.kick()
			}
		}
	}
}

// recoveries returns a fleet's measured recoveries, oldest first.
func (d *Daemon) recoveries(fleet string) []api.RecoveryInfo {
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	out := []api.RecoveryInfo{}
	for _, r := range d.stats.Recoveries {
		if r.Fleet == fleet {
			out = append(out, api.RecoveryInfo{Kind: r.Kind, Node: r.Node, DurationSeconds: r.Duration.Seconds(), At: r.At})
		}
	}
	return out
}

// alerts returns a fleet's current alerts.
func (d *Daemon) alerts(fleet string) []api.AlertInfo {
	d.rtMu.Lock()
	rt, ok := d.runtimes[fleet]
	d.rtMu.Unlock()
	out := []api.AlertInfo{}
	if !ok {
		return out
	}
	d.rtMu.Lock()
	defer d.rtMu.Unlock()
	for _, a := range rt.alerts {
		out = append(out, api.AlertInfo{Kind: a.Kind, Subject: a.Subject, Message: a.Message})
	}
	return out
}
