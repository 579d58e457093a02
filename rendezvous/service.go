package rendezvous

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a Service.
type Options struct {
	// Store persists snapshots; an in-memory store when nil.
	Store Store
	// Now is the clock; time.Now when nil. Timers are real.
	Now func() time.Time
	// OnChange receives every event, in order per fleet, once the state
	// it follows from is saved (or its save failed). It is called with the
	// fleet's lock held: it must be quick and must not call back into the
	// Service for the same fleet.
	OnChange func(fleet string, ev Event)
	Logger   *slog.Logger
	// NewRunID names a new fleet's run (TORCHELASTIC_RUN_ID); by default
	// the fleet name plus random hex, so a re-created fleet never reuses
	// a run id.
	NewRunID func(fleet string) string
	// SaveTimeout bounds one Store.SaveFleet call; 10s when zero.
	SaveTimeout time.Duration
	// OnWatcherGone is called when a node's watch ends because its
	// connection closed before an answer. An agent always holds a watch,
	// and a node that dies closes its connections with it (a killed
	// process's sockets are closed by its kernel), so this is the first
	// sign of an unannounced loss, seconds before heartbeats go silent. It
	// is only a hint: an agent that restarts also closes its watch. It is
	// called on the request's goroutine and must be quick.
	OnWatcherGone func(fleet, node string)
}

// Service hosts the rendezvous of many fleets: one Machine each, driven
// by real timers, persisted through a Store, with long-poll watches.
type Service struct {
	store       Store
	now         func() time.Time
	onChange    func(string, Event)
	log         *slog.Logger
	newRunID    func(string) string
	saveTimeout time.Duration
	watchGone   func(fleet, node string)

	// Lock order: mu before any fleetState.mu; never mu while holding a
	// fleet's lock (closed is atomic for that reason).
	mu     sync.RWMutex
	fleets map[string]*fleetState
	closed atomic.Bool
}

type fleetState struct {
	name string

	mu sync.Mutex
	m  *Machine
	// notify is closed and replaced on every change that may alter a
	// view, waking all watchers of the fleet at once.
	notify  chan struct{}
	timer   *time.Timer
	timerAt time.Time
	// announced is the newest closed round that is persisted; views of a
	// later closed round are shown as waiting until it is.
	announced  int
	dirty      bool // the last save failed; retried at retryAt
	retryAt    time.Time
	retryDelay time.Duration
	removed    bool

	// Group commit: one save is in flight at a time, without mu held;
	// changes made meanwhile are written together by the next save.
	// wantSave counts changes that asked to be saved, doneSave the last of
	// them covered by a finished save; saveDone (on mu) is broadcast at the
	// end of every save.
	saving             bool
	wantSave, doneSave uint64
	saveDone           *sync.Cond
	// events wait here to be reported in order; the first held of them
	// follow from changes whose save has not finished.
	events []Event
	held   int
}

func newFleetState(name string, m *Machine) *fleetState {
	fs := &fleetState{name: name, m: m, notify: make(chan struct{})}
	fs.saveDone = sync.NewCond(&fs.mu)
	return fs
}

const (
	minSaveRetry = 500 * time.Millisecond
	maxSaveRetry = 30 * time.Second
)

// NewService loads every persisted fleet and starts its timers.
func NewService(ctx context.Context, opts Options) (*Service, error) {
	s := &Service{
		store: opts.Store, now: opts.Now, onChange: opts.OnChange, log: opts.Logger,
		newRunID: opts.NewRunID, saveTimeout: opts.SaveTimeout, watchGone: opts.OnWatcherGone,
		fleets: make(map[string]*fleetState),
	}
	if s.store == nil {
		s.store = NewMemoryStore()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.newRunID == nil {
		s.newRunID = randomRunID
	}
	if s.saveTimeout <= 0 {
		s.saveTimeout = 10 * time.Second
	}
	snaps, err := s.store.LoadAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("load rendezvous state: %w", err)
	}
	now := s.now()
	for name, snap := range snaps {
		m, err := Restore(snap, now)
		if err != nil {
			return nil, fmt.Errorf("restore rendezvous of fleet %s: %w", name, err)
		}
		fs := newFleetState(name, m)
		if round, st := m.Round(); st == RoundClosed {
			fs.announced = round
		}
		s.fleets[name] = fs
		fs.mu.Lock()
		s.schedule(fs, now)
		fs.mu.Unlock()
	}
	return s, nil
}

func randomRunID(fleet string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fleet + "-" + hex.EncodeToString(b[:])
}

// Close stops all timers, wakes every watcher (they get ErrClosed) and
// returns once the changes already made are saved (or their save failed).
func (s *Service) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Swap(true) {
		return
	}
	for _, fs := range s.fleets {
		fs.mu.Lock()
		s.stopTimer(fs)
		wake(fs)
		// Bounded: no new change starts once closed is set.
		for fs.saving || fs.doneSave < fs.wantSave {
			fs.saveDone.Wait()
		}
		fs.mu.Unlock()
	}
}

// Configure creates a fleet's rendezvous (round 1 open) or updates its
// configuration. To start a new job incarnation with a new run id,
// Remove the fleet first.
func (s *Service) Configure(ctx context.Context, fleet string, cfg Config) error {
	if !validID(fleet) {
		return fmt.Errorf("invalid fleet name %q", fleet)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("fleet %s: %w", fleet, err)
	}
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return ErrClosed
	}
	fs := s.fleets[fleet]
	if fs == nil {
		now := s.now()
		m, err := NewMachine(cfg, s.newRunID(fleet), now)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		fs = newFleetState(fleet, m)
		s.fleets[fleet] = fs
		fs.mu.Lock()
		s.mu.Unlock()
		defer fs.mu.Unlock()
		s.apply(fs, now, Effects{Persist: true, Events: []Event{{Kind: EventRoundOpened, At: now, Round: 1, Reason: "fleet configured"}}})
		return nil
	}
	s.mu.Unlock()
	return s.mutate(fleet, func(fs *fleetState, now time.Time) error {
		eff, err := fs.m.Configure(now, cfg)
		if err != nil {
			return err
		}
		s.apply(fs, now, eff)
		return nil
	})
}

// Remove forgets a fleet (its job is gone). Its watchers get ErrUnknownFleet.
func (s *Service) Remove(ctx context.Context, fleet string) error {
	s.mu.Lock()
	fs := s.fleets[fleet]
	delete(s.fleets, fleet)
	s.mu.Unlock()
	if fs == nil {
		return ErrUnknownFleet
	}
	fs.mu.Lock()
	fs.removed = true
	s.stopTimer(fs)
	wake(fs)
	// A save still in flight must not land after the delete.
	for fs.saving {
		fs.saveDone.Wait()
	}
	fs.mu.Unlock()
	if err := s.store.DeleteFleet(ctx, fleet); err != nil {
		return fmt.Errorf("delete rendezvous state of fleet %s: %w", fleet, err)
	}
	return nil
}

// Fleets lists the hosted fleets, sorted.
func (s *Service) Fleets() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.fleets))
	for name := range s.fleets {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Status reports a fleet's rendezvous.
func (s *Service) Status(fleet string) (Status, error) {
	var st Status
	err := s.read(fleet, func(fs *fleetState) {
		st = fs.m.Status()
		st.Fleet, st.Unsaved = fleet, fs.dirty
	})
	return st, err
}

// Changed returns a channel closed at the fleet's next change.
func (s *Service) Changed(fleet string) (<-chan struct{}, error) {
	var ch chan struct{}
	err := s.read(fleet, func(fs *fleetState) { ch = fs.notify })
	return ch, err
}

// Join adds a node to a fleet's rendezvous and returns its view.
func (s *Service) Join(ctx context.Context, fleet string, req JoinRequest) (View, error) {
	var v View
	err := s.mutate(fleet, func(fs *fleetState, now time.Time) error {
		var eff Effects
		var err error
		if _, eff, err = fs.m.Join(now, req); err != nil {
			return err
		}
		s.apply(fs, now, eff)
		v = s.view(fs, req.NodeID)
		return nil
	})
	return v, err
}

// Heartbeat keeps a member alive. It is O(1) and wakes nobody.
func (s *Service) Heartbeat(ctx context.Context, fleet string, req HeartbeatRequest) (HeartbeatResponse, error) {
	var r HeartbeatResponse
	err := s.mutate(fleet, func(fs *fleetState, now time.Time) error {
		var err error
		if r, err = fs.m.Heartbeat(now, req); err != nil {
			return err
		}
		if req.Listening > 0 {
			s.apply(fs, now, fs.m.MasterListening(req.NodeID, req.Listening)) // wakes the watchers once
		}
		if r.State == NodeAssigned && r.Round > fs.announced {
			r.State, r.RoundState = NodeWaiting, RoundOpen // see view
		}
		// The oldest member may have moved: the next expiry only gets
		// later, so schedule is O(1) and usually leaves the timer alone.
		s.schedule(fs, now)
		return nil
	})
	return r, err
}

// Leave removes a node gracefully.
func (s *Service) Leave(ctx context.Context, fleet, node string) error {
	return s.mutate(fleet, func(fs *fleetState, now time.Time) error {
		s.apply(fs, now, fs.m.Leave(now, node))
		return nil
	})
}

// Exclude removes a node at once (interruption notice) and bars it from
// rejoining; a running round is re-formed without it immediately.
func (s *Service) Exclude(ctx context.Context, fleet, node, reason string) error {
	return s.ExcludeUntil(ctx, fleet, node, reason, time.Time{})
}

// ExcludeUntil is Exclude with the time the node goes away (its notice's
// deadline; zero if unknown), which the views of the next round carry.
func (s *Service) ExcludeUntil(ctx context.Context, fleet, node, reason string, deadline time.Time) error {
	return s.mutate(fleet, func(fs *fleetState, now time.Time) error {
		s.apply(fs, now, fs.m.ExcludeUntil(now, node, reason, deadline))
		return nil
	})
}

// Finish marks the job done; every agent is told to stop.
func (s *Service) Finish(ctx context.Context, fleet string, success bool) error {
	return s.mutate(fleet, func(fs *fleetState, now time.Time) error {
		s.apply(fs, now, fs.m.Finish(now, success))
		return nil
	})
}

// Watch blocks until the node's view Differs from last, and returns it.
// When ctx ends first it returns the current view and ctx's error.
func (s *Service) Watch(ctx context.Context, fleet, node string, last View) (View, error) {
	for {
		var v View
		var ch chan struct{}
		if err := s.read(fleet, func(fs *fleetState) {
			v, ch = s.view(fs, node), fs.notify
		}); err != nil {
			return View{}, err
		}
		if v.Differs(last) {
			return v, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return v, ctx.Err()
		}
	}
}

func (s *Service) lookup(fleet string) (*fleetState, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	fs := s.fleets[fleet]
	if fs == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownFleet, fleet)
	}
	return fs, nil
}

// read runs f with the fleet locked.
func (s *Service) read(fleet string, f func(*fleetState)) error {
	return s.mutate(fleet, func(fs *fleetState, _ time.Time) error {
		f(fs)
		return nil
	})
}

// mutate runs f with the fleet locked and the current time.
func (s *Service) mutate(fleet string, f func(*fleetState, time.Time) error) error {
	fs, err := s.lookup(fleet)
	if err != nil {
		return err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.removed {
		return fmt.Errorf("%w %q", ErrUnknownFleet, fleet)
	}
	if s.closed.Load() {
		return ErrClosed
	}
	return f(fs, s.now())
}

// view masks a closed round that is not persisted yet: agents must never
// run an assignment a daemon restart could forget.
func (s *Service) view(fs *fleetState, node string) View {
	v := fs.m.View(node)
	if v.State == NodeAssigned && v.Round > fs.announced {
		v.State, v.RoundState, v.Assignment, v.MasterListening = NodeWaiting, RoundOpen, nil, false
	}
	return v
}

// apply persists (before anything is announced), reports events, wakes
// watchers and re-arms the timer. Called with fs.mu held; a save releases
// it meanwhile, so other changes may come in before apply returns.
func (s *Service) apply(fs *fleetState, now time.Time, eff Effects) {
	announced := fs.announced
	fs.events = append(fs.events, eff.Events...)
	if eff.Persist || (fs.dirty && !now.Before(fs.retryAt)) {
		fs.held = len(fs.events)
		s.persist(fs)
	}
	if fs.held == 0 {
		s.report(fs, len(fs.events))
	}
	if eff.Changed || fs.announced != announced {
		wake(fs)
	}
	s.schedule(fs, now)
}

// persist returns once a save that covers the machine's current state has
// finished: it runs that save itself, or waits for the one in flight and
// then for the next, which writes every change made meanwhile at once.
func (s *Service) persist(fs *fleetState) {
	fs.wantSave++
	mine := fs.wantSave
	for fs.doneSave < mine && !fs.removed {
		if fs.saving {
			fs.saveDone.Wait()
			continue
		}
		s.save(fs)
	}
}

// save writes the current snapshot with fs.mu released during the write.
// Called with fs.mu held and no save in flight.
func (s *Service) save(fs *fleetState) {
	target, snap, covered := fs.wantSave, fs.m.Snapshot(), len(fs.events)
	fs.saving = true
	fs.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.saveTimeout)
	err := s.store.SaveFleet(ctx, fs.name, snap)
	cancel()
	now := s.now()
	fs.mu.Lock()
	fs.saving, fs.doneSave = false, target
	defer fs.saveDone.Broadcast()
	if err != nil {
		fs.dirty = true
		fs.retryDelay = min(max(2*fs.retryDelay, minSaveRetry), maxSaveRetry)
		fs.retryAt = now.Add(fs.retryDelay)
		s.log.Warn("rendezvous: saving fleet state failed; new rounds are held back until it succeeds",
			"fleet", fs.name, "round", snap.Round, "retry_in", fs.retryDelay, "err", err)
	} else {
		fs.dirty, fs.retryDelay, fs.retryAt = false, 0, time.Time{}
		if snap.State == RoundClosed && snap.Round > fs.announced {
			fs.announced = snap.Round
			wake(fs)
		}
	}
	// The events queued before the snapshot follow from what it holds.
	// Only saves report while events are held, so the queue's head is
	// the same as when the snapshot was taken.
	s.report(fs, covered)
	fs.held = max(fs.held-covered, 0)
}

// report passes the first n queued events to OnChange, in order.
func (s *Service) report(fs *fleetState, n int) {
	if s.onChange != nil {
		for _, ev := range fs.events[:n] {
			s.onChange(fs.name, ev)
		}
	}
	fs.events = append(fs.events[:0], fs.events[n:]...)
}

func wake(fs *fleetState) {
	close(fs.notify)
	fs.notify = make(chan struct{})
}

// schedule arms the fleet's timer for the machine's next deadline (or a
// save retry). A pending earlier timer is left alone: when it fires, Tick
// finds nothing due and re-arms for the real deadline. O(1).
func (s *Service) schedule(fs *fleetState, now time.Time) {
	next := fs.m.Next(now)
	if fs.dirty && (next.IsZero() || fs.retryAt.Before(next)) {
		next = fs.retryAt
	}
	if next.IsZero() {
		s.stopTimer(fs)
		return
	}
	if !fs.timerAt.IsZero() && !next.Before(fs.timerAt) {
		return
	}
	d := max(next.Sub(now), 0)
	if fs.timer == nil {
		fs.timer = time.AfterFunc(d, func() { s.fire(fs) })
	} else {
		fs.timer.Reset(d)
	}
	fs.timerAt = next
}

func (s *Service) stopTimer(fs *fleetState) {
	if fs.timer != nil {
		fs.timer.Stop()
	}
	fs.timerAt = time.Time{}
}

func (s *Service) fire(fs *fleetState) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if s.closed.Load() || fs.removed {
		return
	}
	fs.timerAt = time.Time{}
	now := s.now()
	s.apply(fs, now, fs.m.Tick(now))
}
