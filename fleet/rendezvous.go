package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleetd/fleet/controller"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/stats"
	"github.com/fleetd/fleetd/rendezvous"
)

// The daemon's rendezvous service: built from the store at start and at
// each leader term, served under /v1/rendezvous/, its snapshots kept in
// meta, its events written to the event log in order.

// rdzvHost owns the daemon's rendezvous service: which one is current
// (none between leader terms), its snapshots, its events on their way to
// the log, and the recovery measurements its rounds end.
type rdzvHost struct {
	svc   atomic.Pointer[rendezvous.Service]
	store Store // the notifying store, for events
	// snapshots keep the rounds; written often and holding no events,
	// they go to the store underneath (no wake-up of event followers).
	snapshots state.Store
	now       func() time.Time
	log       *slog.Logger
	stats     *stats.Stats
	kick      func()
	events    chan state.Event
	// auth authorizes the agents' calls (set once the agent API exists).
	auth rendezvous.Authorizer
}

func newRdzvHost(store Store, snapshots state.Store, now func() time.Time, log *slog.Logger, st *stats.Stats, kick func()) *rdzvHost {
	return &rdzvHost{store: store, snapshots: snapshots, now: now, log: log, stats: st, kick: kick, events: make(chan state.Event, 4096)}
}

// rz is the current rendezvous service; nil between leader terms.
func (d *rdzvHost) rz() *rendezvous.Service { return d.svc.Load() }

// stop drops the current service (this server stopped leading). Closing
// may wait for a save in flight, so it does not hold the caller up.
func (d *rdzvHost) stop() {
	if svc := d.svc.Swap(nil); svc != nil {
		go svc.Close()
	}
}

// rzPort is rz as the controller's port: a nil interface, not a nil
// pointer in one, between terms.
func (d *rdzvHost) rzPort() controller.Rendezvous {
	if s := d.rz(); s != nil {
		return s
	}
	return nil
}

// loadRendezvous (re)builds the rendezvous service from the store: at
// start, and when this server becomes a cluster's leader (the previous
// leader's rounds are in the store, not in this process).
func (d *rdzvHost) loadRendezvous(ctx context.Context) error {
	svc, err := rendezvous.NewService(ctx, rendezvous.Options{Store: rdzvStore{st: d.snapshots}, Now: d.now, Logger: d.log, OnChange: d.onRendezvous, OnWatcherGone: d.onWatcherGone})
	if err != nil {
		return fmt.Errorf("rendezvous: %w", err)
	}
	if old := d.svc.Swap(svc); old != nil {
		// Asynchronous: Close waits for a save in flight, which a deposed
		// term's fence may be refusing with backoff.
		go old.Close()
	}
	return nil
}

// serveRendezvous serves the agents' rendezvous calls.
func (d *rdzvHost) serveRendezvous(w http.ResponseWriter, r *http.Request) {
	svc := d.rz()
	if svc == nil {
		// Between terms: this server just stopped leading.
		w.Header().Set("Retry-After", "1")
		http.Error(w, "this server does not lead now; retry", http.StatusServiceUnavailable)
		return
	}
	svc.Handler(d.auth).ServeHTTP(w, r)
}

// onWatcherGone: a node's agent dropped its watch. Look at the fleet's
// instances now rather than at the next tick: a node that died is then
// replaced (and its survivors regrouped) within a pass instead of up to a
// tick later. The provider's listing stays the authority, so an agent
// that merely restarted changes nothing. A second look shortly after
// covers a node whose agent died a moment before the rest of it.
func (d *rdzvHost) onWatcherGone(fleet, node string) {
	d.log.Debug("agent dropped its watch: checking the fleet's instances now", "fleet", fleet, "node", node)
	d.kick()
	time.AfterFunc(watchGoneRecheck, d.kick)
}

// watchGoneRecheck is when onWatcherGone looks a second time.
const watchGoneRecheck = 300 * time.Millisecond

// onRendezvous turns rendezvous events into fleet events and recovery
// measurements. It runs under the rendezvous fleet lock: no calls back.
func (d *rdzvHost) onRendezvous(fleet string, ev rendezvous.Event) {
	e := state.Event{Fleet: fleet, Node: ev.Node, Type: "rendezvous." + string(ev.Kind), Message: ev.String(),
		Data: map[string]string{"round": fmt.Sprint(ev.Round)}}
	if ev.Kind == rendezvous.EventRoundClosed {
		e.Data["duration"] = ev.Duration.String()
		e.Data["world_size"] = fmt.Sprint(ev.WorldSize)
		e.Data["nodes"] = fmt.Sprint(ev.Nodes)
		if dur, ok := d.stats.RoundClosed(fleet, ev.Duration, ev.At); ok {
			e.Data["since_notice"] = dur.String()
			e.Message += fmt.Sprintf("; round re-formed %.2fs after the notice (the workers restart now)", dur.Seconds())
		}
	}
	// Appending goes through a goroutine: the callback must not block on I/O
	// while the rendezvous holds its lock; order is kept by the channel.
	select {
	case d.events <- e:
	default:
		d.log.Warn("rendezvous event dropped: event queue full", "fleet", fleet, "kind", ev.Kind)
	}
}

// rdzvEventWriter persists rendezvous events in order (a leader duty).
func (d *rdzvHost) rdzvEventWriter(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-d.events:
			// Drain what is queued and write it as one transaction: a burst
			// of thousands of joins must not wait for one fsync each.
			batch := []state.Event{e}
		drain:
			for len(batch) < 1024 {
				select {
				case e := <-d.events:
					batch = append(batch, e)
				default:
					break drain
				}
			}
			closed := false
			err := d.store.Update(context.Background(), func(tx state.Tx) error {
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

// rdzvStore persists rendezvous snapshots in the state store's meta bucket.
type rdzvStore struct{ st state.Store }

const rdzvPrefix = "rendezvous/"

func (s rdzvStore) SaveFleet(ctx context.Context, fleet string, snap rendezvous.Snapshot) error {
	b, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	return s.st.Update(ctx, func(tx state.Tx) error { return tx.SetMeta(rdzvPrefix+fleet, b) })
}

func (s rdzvStore) DeleteFleet(ctx context.Context, fleet string) error {
	return s.st.Update(ctx, func(tx state.Tx) error { return tx.SetMeta(rdzvPrefix+fleet, nil) })
}

func (s rdzvStore) LoadAll(ctx context.Context) (map[string]rendezvous.Snapshot, error) {
	out := map[string]rendezvous.Snapshot{}
	err := s.st.View(ctx, func(tx state.Tx) error {
		fleets, err := tx.Fleets()
		if err != nil {
			return err
		}
		for _, f := range fleets {
			var snap rendezvous.Snapshot
			found, err := state.ReadMetaJSON(tx, rdzvPrefix+f.Name, "rendezvous snapshot of "+f.Name, &snap)
			if err != nil {
				return err
			}
			if found {
				out[f.Name] = snap
			}
		}
		return nil
	})
	return out, err
}
