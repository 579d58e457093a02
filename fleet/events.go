package fleet

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/stats"
)

// The event log: every write to the store wakes the event followers (API
// long-polls and streams, the tally), so none of them waits for a poll.

// notifyingStore is the daemon's store: each committed write wakes the
// event followers.
type notifyingStore struct {
	Store
	notify func()
}

func (s notifyingStore) Update(ctx context.Context, fn func(state.Tx) error) error {
	err := s.Store.Update(ctx, fn)
	if err == nil {
		s.notify()
	}
	return err
}

func (s notifyingStore) AppendEvents(ctx context.Context, events []state.Event) ([]state.Event, error) {
	out, err := s.Store.AppendEvents(ctx, events)
	if err == nil {
		s.notify()
	}
	return out, err
}

// eventLog is the daemon's side of the event log: it wakes the followers
// at every committed write and tallies every event once (stats.Tally).
type eventLog struct {
	store Store // the notifying store
	tally *stats.Tally
	log   *slog.Logger

	evMu     sync.Mutex
	evNotify chan struct{} // closed and replaced at every committed write
}

func newEventLog(tally *stats.Tally, log *slog.Logger) *eventLog {
	return &eventLog{tally: tally, log: log, evNotify: make(chan struct{})}
}

// notifyEvents wakes every follower waiting in EventsChanged.
func (d *eventLog) notifyEvents() {
	d.evMu.Lock()
	close(d.evNotify)
	d.evNotify = make(chan struct{})
	d.evMu.Unlock()
}

// EventsChanged implements api.Backend: the channel closes at the next
// committed write.
func (d *eventLog) EventsChanged() <-chan struct{} {
	d.evMu.Lock()
	defer d.evMu.Unlock()
	return d.evNotify
}

// Events implements api.Backend.
func (d *eventLog) Events(ctx context.Context, since uint64, limit int) ([]state.Event, error) {
	return d.store.Events(ctx, since, limit)
}

// appendEvent records an event on its own; failures are logged, not fatal.
func (d *eventLog) appendEvent(ctx context.Context, e state.Event) {
	if _, err := d.store.AppendEvents(ctx, []state.Event{e}); err != nil {
		d.log.Error("append event", "type", e.Type, "err", err)
	}
}

// followEvents tallies the event log (stats.Tally): first all of it, then
// every event as it is appended, until ctx ends.
func (d *eventLog) followEvents(ctx context.Context) {
	const page = 1000
	for {
		changed := d.EventsChanged()
		evs, err := d.store.Events(ctx, d.tally.Next(), page)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.log.Warn("event tally: read events", "err", err)
		}
		for _, e := range evs {
			d.tally.Event(e)
		}
		if len(evs) == page {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(5 * time.Second):
			// On a cluster's follower the leader's writes wake nothing
			// here: this periodic look picks them up.
		}
	}
}
