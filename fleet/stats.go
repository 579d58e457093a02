package fleet

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/placement"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/rendezvous"
)

// recoveryStats tracks the recovery durations fleetd promises to keep
// short: notice → the survivors' next rendezvous round closed, notice →
// the survivors' workers training again (their first progress report of a
// later round), and replacement requested → joined.
type recoveryStats struct {
	mu sync.Mutex
	// pendingNotice: fleet → time of the oldest notice not yet followed by
	// a closed round; pendingResume: by the workers' next progress report.
	pendingNotice map[string]time.Time
	pendingResume map[string]time.Time
	// launchAt: fleet/node → when its launch was requested.
	launchAt map[string]time.Time
	// Recoveries is the recent history, newest last.
	Recoveries []Recovery
	// reconcile durations per fleet (last pass).
	reconcileDur map[string]time.Duration
	// provider calls and errors by provider/op.
	calls, errs map[string]int
	// onDemand is the on-demand $/h by offering location (see odKey), learnt
	// from the providers' offerings, for savings against on-demand.
	onDemand map[string]float64
	// prices: fleet → provider → the sources and age of the prices
	// placement uses (see notePrices).
	prices map[string]map[string]priceInfo
}

// Recovery is one measured recovery.
type Recovery struct {
	Fleet    string        `json:"fleet"`
	Node     string        `json:"node,omitempty"`
	Kind     string        `json:"kind"` // round-reformed | training-resumed | replacement-joined
	Duration time.Duration `json:"duration"`
	At       time.Time     `json:"at"`
	// LostSteps (training-resumed) is how many steps the workers resumed
	// behind the last one reported before.
	LostSteps *int64 `json:"lost_steps,omitempty"`
}

// Recovery kinds.
const (
	// RecoveryRoundReformed: notice → the survivors' next rendezvous round
	// closed (the daemon decided the new membership; the workers still
	// restart after it).
	RecoveryRoundReformed = "round-reformed"
	// RecoveryTrainingResumed: notice → the survivors' workers report
	// progress again in a later round (they loaded their checkpoint).
	RecoveryTrainingResumed = "training-resumed"
	// RecoveryReplacementJoined: launch requested → the node's agent
	// registered.
	RecoveryReplacementJoined = "replacement-joined"
)

func newRecoveryStats() *recoveryStats {
	return &recoveryStats{pendingNotice: map[string]time.Time{}, pendingResume: map[string]time.Time{}, launchAt: map[string]time.Time{}, reconcileDur: map[string]time.Duration{},
		calls: map[string]int{}, errs: map[string]int{}, onDemand: map[string]float64{}}
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
	if d.metrics != nil {
		d.metrics.reconcile.WithLabelValues(fleet).Observe(dur.Seconds())
	}
}

// countProviderCallIn counts a provider call made in region (see
// callRegion); errors are labelled with their kind.
func (d *Daemon) countProviderCallIn(provider, op, region string, err error) {
	d.stats.mu.Lock()
	d.stats.calls[provider+"/"+op]++
	if err != nil {
		d.stats.errs[provider+"/"+op]++
	}
	d.stats.mu.Unlock()
	if d.metrics != nil {
		d.metrics.providerCalls.WithLabelValues(provider, op).Inc()
		// The error series of every kind exist from the first call in a
		// region, at 0, so increase() and error ratios see the first error.
		for _, k := range errorKinds {
			d.metrics.providerErrors.WithLabelValues(provider, op, region, k)
		}
		if err != nil {
			d.metrics.providerErrors.WithLabelValues(provider, op, region, errorKindLabel(err)).Inc()
		}
	}
}

// odKey locates an offering's on-demand price: per zone when the provider
// prices zones differently, else per region.
func odKey(o providers.Offering, zone bool) string {
	k := o.Provider + "/" + o.Region + "/" + o.InstanceType
	if zone {
		k += "/" + o.Zone
	}
	return k
}

// noteOfferings learns on-demand prices from a provider's offerings, for
// the savings in status. Call it after every successful Offerings call.
func (d *Daemon) noteOfferings(offs []providers.Offering) {
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	for _, o := range offs {
		if o.CapacityType != providers.OnDemand || o.PricePerHour <= 0 {
			continue
		}
		d.stats.onDemand[odKey(o, true)] = o.PricePerHour
		d.stats.onDemand[odKey(o, false)] = o.PricePerHour
	}
}

// onDemandPrice is the on-demand $/h of an offering's instance type where
// it runs; false when no provider has told us yet.
func (d *Daemon) onDemandPrice(o providers.Offering) (float64, bool) {
	if o.CapacityType == providers.OnDemand {
		return o.PricePerHour, true
	}
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	if p, ok := d.stats.onDemand[odKey(o, true)]; ok {
		return p, true
	}
	p, ok := d.stats.onDemand[odKey(o, false)]
	return p, ok
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
	d.stats.add(Recovery{Fleet: fleet, Node: node, Kind: RecoveryReplacementJoined, Duration: dur, At: at})
	if d.metrics != nil {
		d.metrics.recovery.WithLabelValues(fleet, RecoveryReplacementJoined).Observe(dur.Seconds())
	}
	return dur, true
}

func (d *Daemon) noteRunning(fleet string, n state.Node) {}

// noteNotice starts the notice → round-reformed and notice →
// training-resumed measurements.
func (d *Daemon) noteNotice(fleet string, at time.Time) {
	d.stats.mu.Lock()
	if _, ok := d.stats.pendingNotice[fleet]; !ok {
		d.stats.pendingNotice[fleet] = at
	}
	if _, ok := d.stats.pendingResume[fleet]; !ok {
		d.stats.pendingResume[fleet] = at
	}
	d.stats.mu.Unlock()
}

// noteTrainingResumed ends a pending notice → training-resumed
// measurement when a round's first progress report comes after the notice.
func (d *Daemon) noteTrainingResumed(fleet string, start autoscale.RoundStart) {
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	t, ok := d.stats.pendingResume[fleet]
	if !ok || start.At.Before(t) {
		return
	}
	delete(d.stats.pendingResume, fleet)
	dur := start.At.Sub(t)
	r := Recovery{Fleet: fleet, Kind: RecoveryTrainingResumed, Duration: dur, At: start.At}
	if start.HadPrev {
		lost := start.LostSteps
		r.LostSteps = &lost
	}
	d.stats.add(r)
	if d.metrics != nil {
		d.metrics.recovery.WithLabelValues(fleet, RecoveryTrainingResumed).Observe(dur.Seconds())
	}
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
	d.stats.add(Recovery{Fleet: fleet, Kind: RecoveryRoundReformed, Duration: dur, At: at})
	if d.metrics != nil {
		d.metrics.recovery.WithLabelValues(fleet, RecoveryRoundReformed).Observe(dur.Seconds())
	}
	return dur, true
}

// onRendezvous turns rendezvous events into fleet events and recovery
// measurements. It runs under the rendezvous fleet lock: no calls back.
func (d *Daemon) onRendezvous(fleet string, ev rendezvous.Event) {
	e := state.Event{Fleet: fleet, Node: ev.Node, Type: "rendezvous." + string(ev.Kind), Message: ev.String(),
		Data: map[string]string{"round": fmt.Sprint(ev.Round)}}
	if ev.Kind == rendezvous.EventRoundClosed {
		if d.metrics != nil {
			d.metrics.roundLatency.WithLabelValues(fleet).Observe(ev.Duration.Seconds())
		}
		e.Data["duration"] = ev.Duration.String()
		e.Data["world_size"] = fmt.Sprint(ev.WorldSize)
		e.Data["nodes"] = fmt.Sprint(ev.Nodes)
		if dur, ok := d.noteRoundClosed(fleet, ev.At); ok {
			e.Data["since_notice"] = dur.String()
			e.Message += fmt.Sprintf("; round re-formed %.2fs after the notice (the workers restart now)", dur.Seconds())
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
			// Drain what is queued and write it as one transaction: a burst
			// of thousands of joins must not wait for one fsync each.
			batch := []state.Event{e}
		drain:
			for len(batch) < 1024 {
				select {
				case e := <-d.rdzvEvents:
					batch = append(batch, e)
				default:
					break drain
				}
			}
			closed := false
			err := d.update(context.Background(), func(tx state.Tx) error {
				for _, e := range batch {
					if _, err := tx.AppendEvent(e); err != nil {
						return err
					}
					if e.Type == "rendezvous."+string(rendezvous.EventRoundClosed) {
						closed = true
					}
				}
				return nil
			})
			if err != nil {
				d.log.Error("append rendezvous events", "n", len(batch), "err", err)
			}
			if closed {
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
			out = append(out, api.RecoveryInfo{Kind: r.Kind, Node: r.Node, DurationSeconds: r.Duration.Seconds(), At: r.At, LostSteps: r.LostSteps})
		}
	}
	return out
}

// alerts returns a fleet's current alerts.
func (d *Daemon) alerts(fleet string) []api.AlertInfo {
	out := []api.AlertInfo{}
	d.rtMu.Lock()
	if rt, ok := d.runtimes[fleet]; ok {
		for _, a := range rt.alerts {
			out = append(out, api.AlertInfo{Kind: a.Kind, Subject: a.Subject, Message: a.Message})
		}
	}
	d.rtMu.Unlock()
	// Repeated boot failures come from the event log, not the reconciler.
	if a, ok := d.tally.bootAlert(fleet, d.now()); ok {
		out = append(out, a)
	}
	out = append(out, d.agentAPI.CheckpointAlerts(fleet)...)
	return out
}

// eventTally is what the daemon derives from its own event log: interruption
// and boot-failure counts per fleet. The log is the one record every notice
// source (agents, provider polling, SQS, heartbeat loss) goes through exactly
// once, so counting there needs no hook in each source, and replaying it at
// start keeps the totals across daemon restarts.
type eventTally struct {
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
	// bootAlertCount failures within bootAlertWindow raise an alert: one
	// failed boot is noise, several mean a bad image, setup or offering.
	bootAlertCount  = 3
	bootAlertWindow = 30 * time.Minute
)

func (t *eventTally) fleet(name string) *fleetTally {
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

// tallyEvent counts one event; it runs for each event exactly once, in
// order.
func (d *Daemon) tallyEvent(e state.Event) {
	t := &d.tally
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.Seq <= t.next {
		return
	}
	t.next = e.Seq
	switch e.Type {
	case "notice":
		kind, source := e.Data["kind"], e.Data["source"]
		if d.metrics != nil {
			d.metrics.interruptions.WithLabelValues(e.Fleet, kind, source).Inc()
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
		if d.metrics != nil {
			d.metrics.nodeFailures.WithLabelValues(e.Fleet, from).Inc()
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
			if len(ft.bootFailures) > 2*bootAlertCount {
				ft.bootFailures = ft.bootFailures[len(ft.bootFailures)-bootAlertCount:]
			}
		}
	case "fleet.destroyed":
		// A new fleet of the same name starts from zero in status; the
		// Prometheus counters stay monotonic.
		delete(t.fleets, e.Fleet)
	}
}

// followEvents tallies the event log: first all of it, then every event as
// it is appended, until ctx ends.
func (d *Daemon) followEvents(ctx context.Context) {
	const page = 1000
	for {
		changed := d.EventsChanged()
		d.tally.mu.Lock()
		since := d.tally.next
		d.tally.mu.Unlock()
		evs, err := d.store.Events(ctx, since, page)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.log.Warn("event tally: read events", "err", err)
		}
		for _, e := range evs {
			d.tallyEvent(e)
		}
		if len(evs) == page {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(5 * time.Second):
			// Events written without a wake-up (d.store.Update directly)
			// are picked up by this periodic look.
		}
	}
}

// interruptions returns a fleet's terminal-notice count and recent notices,
// oldest first.
func (t *eventTally) interruptions(fleet string) (int, []api.InterruptionInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ft, ok := t.fleets[fleet]
	if !ok {
		return 0, []api.InterruptionInfo{}
	}
	return ft.interruptions, append([]api.InterruptionInfo{}, ft.recent...)
}

// bootAlert reports repeated boot failures of a fleet.
func (t *eventTally) bootAlert(fleet string, now time.Time) (api.AlertInfo, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ft, ok := t.fleets[fleet]
	if !ok {
		return api.AlertInfo{}, false
	}
	n := 0
	for _, at := range ft.bootFailures {
		if now.Sub(at) <= bootAlertWindow {
			n++
		}
	}
	if n < bootAlertCount {
		return api.AlertInfo{}, false
	}
	return api.AlertInfo{Kind: AlertBootFailures, Message: fmt.Sprintf("%d nodes failed before they ran in the last %s: check the image, setup commands and the agent's logs", n, bootAlertWindow)}, true
}

// AlertBootFailures is the alert kind for repeated boot failures.
const AlertBootFailures = "repeated-boot-failures"
