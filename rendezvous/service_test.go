package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) add(_ string, ev Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
}

func (l *eventLog) kinds() []EventKind {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []EventKind
	for _, ev := range l.events {
		out = append(out, ev.Kind)
	}
	return out
}

// configuredService is a new service with fleet "f" configured as cfg.
func configuredService(ctx context.Context, t testing.TB, opts Options, cfg Config) *Service {
	t.Helper()
	svc := newService(t, opts)
	if err := svc.Configure(ctx, "f", cfg); err != nil {
		t.Fatal(err)
	}
	return svc
}

func newService(t testing.TB, opts Options) *Service {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	svc, err := NewService(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc
}

func mustJoin(t *testing.T, svc *Service, fleet, id string) View {
	t.Helper()
	v, err := svc.Join(context.Background(), fleet, JoinRequest{NodeID: id, Addr: addrOf(id), Zone: "z1", Nproc: 2})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestServiceDropsSilentMemberWithRealTimers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var log eventLog
	svc := newService(t, Options{OnChange: log.add})
	cfg := testConfig(2, 3)
	cfg.Heartbeat, cfg.DeadAfter = 50*time.Millisecond, time.Second // a, b have 20 beats of slack
	if err := svc.Configure(ctx, "f", cfg); err != nil {
		t.Fatal(err)
	}
	mustJoin(t, svc, "f", "a")
	mustJoin(t, svc, "f", "b")
	v := mustJoin(t, svc, "f", "c")
	if v.State != NodeAssigned || v.Round != 1 {
		t.Fatalf("third join: %+v", v)
	}
	hbCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { // a and b stay alive, c is silent
		tk := time.NewTicker(cfg.Heartbeat)
		defer tk.Stop()
		for {
			for _, id := range []string{"a", "b"} {
				if _, err := svc.Heartbeat(hbCtx, "f", HeartbeatRequest{NodeID: id, Round: 1, Workers: "running"}); err != nil {
					return
				}
			}
			select {
			case <-hbCtx.Done():
				return
			case <-tk.C:
			}
		}
	}()
	got, err := svc.Watch(ctx, "f", "a", svc.mustView(t, "f", "a"))
	if err != nil {
		t.Fatal(err)
	}
	if got.State != NodeAssigned || got.Round != 2 || got.Assignment.GroupWorldSize != 2 || got.Assignment.GroupRank != 0 {
		t.Fatalf("after c went silent a sees %+v %+v", got, got.Assignment)
	}
	st, _ := svc.Status("f")
	if st.Round != 2 || st.State != RoundClosed || len(st.Members) != 2 || st.Members[1].NodeID != "b" {
		t.Fatalf("status %+v", st)
	}
	want := []EventKind{EventRoundOpened, EventMemberJoined, EventMemberJoined, EventMemberJoined, EventRoundClosed,
		EventMemberDropped, EventRoundOpened, EventRoundClosed}
	if k := log.kinds(); !slices.Equal(k, want) {
		t.Fatalf("events %v, want %v", k, want)
	}
	log.mu.Lock()
	last := log.events[len(log.events)-1]
	dropped := log.events[5]
	log.mu.Unlock()
	if last.Duration != 0 || last.Nodes != 2 || last.WorldSize != 4 {
		t.Fatalf("re-formed round closed %+v: survivors must not wait for a last call", last)
	}
	if dropped.Node != "c" || dropped.Duration < cfg.DeadAfter {
		t.Fatalf("drop event %+v", dropped)
	}
}

// mustView is the node's current view (a test helper).
func (s *Service) mustView(t *testing.T, fleet, node string) View {
	t.Helper()
	var v View
	if err := s.read(fleet, func(fs *fleetState) { v = s.view(fs, node) }); err != nil {
		t.Fatal(err)
	}
	return v
}

type flakyStore struct {
	*MemoryStore
	fail atomic.Bool
}

func (s *flakyStore) SaveFleet(ctx context.Context, fleet string, snap Snapshot) error {
	if s.fail.Load() {
		return errors.New("disk full")
	}
	return s.MemoryStore.SaveFleet(ctx, fleet, snap)
}

func TestServiceAnnouncesOnlyPersistedRounds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store := &flakyStore{MemoryStore: NewMemoryStore()}
	svc := configuredService(ctx, t, Options{Store: store}, testConfig(2, 2))
	a := mustJoin(t, svc, "f", "a")
	store.fail.Store(true)
	if b := mustJoin(t, svc, "f", "b"); b.State != NodeWaiting || b.Assignment != nil {
		t.Fatalf("an unsaved round was announced to the joiner: %+v", b)
	}
	if st, _ := svc.Status("f"); !st.Unsaved || st.State != RoundClosed {
		t.Fatalf("status %+v", st)
	}
	if hb, err := svc.Heartbeat(ctx, "f", HeartbeatRequest{NodeID: "b"}); err != nil || hb.State != NodeWaiting {
		t.Fatalf("heartbeat announced an unsaved round: %+v %v", hb, err)
	}
	// Through at least one failed retry (the first comes after 500ms) the
	// watcher must not see the round.
	short, cancelShort := context.WithTimeout(ctx, 800*time.Millisecond)
	v, err := svc.Watch(short, "f", "a", a)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) || v.State != NodeWaiting {
		t.Fatalf("watch while unsaved: %+v %v", v, err)
	}
	store.fail.Store(false)
	v, err = svc.Watch(ctx, "f", "a", a)
	if err != nil || v.State != NodeAssigned || v.Round != 1 {
		t.Fatalf("after the store recovered: %+v %v", v, err)
	}
	snaps, _ := store.LoadAll(ctx)
	if s := snaps["f"]; s.Round != 1 || s.State != RoundClosed || len(s.Order) != 2 {
		t.Fatalf("announced round not persisted: %+v", s)
	}
	if st, _ := svc.Status("f"); st.Unsaved {
		t.Fatal("still unsaved")
	}
}

func TestServiceRestoreKeepsRoundsAndGivesGrace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store := NewMemoryStore()
	svc1, err := NewService(ctx, Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(2, 3)
	if err := svc1.Configure(ctx, "f", cfg); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		mustJoin(t, svc1, "f", id)
	}
	if err := svc1.Leave(ctx, "f", "b"); err != nil {
		t.Fatal(err)
	}
	before, _ := svc1.Status("f")
	svc1.Close()
	if _, err := svc1.Join(ctx, "f", JoinRequest{NodeID: "x", Addr: "10.1.1.1", Nproc: 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("join on a closed service: %v", err)
	}

	// The daemon comes back two hours later: nobody heartbeated meanwhile.
	restart := time.Now().Add(2 * time.Hour)
	var log eventLog
	svc2 := newService(t, Options{Store: store, OnChange: log.add, Now: func() time.Time { return time.Now().Add(2 * time.Hour) }})
	after, err := svc2.Status("f")
	if err != nil {
		t.Fatal(err)
	}
	if after.Round != 2 || after.State != RoundClosed || after.RunID != before.RunID || len(after.Members) != 2 ||
		after.Members[0].NodeID != "a" || after.Members[1].NodeID != "c" || after.MasterAddr != before.MasterAddr {
		t.Fatalf("restored status %+v\nwas %+v", after, before)
	}
	if after.Members[0].LastHeartbeat.Before(restart) {
		t.Fatalf("member not given fresh grace: last heartbeat %s", after.Members[0].LastHeartbeat)
	}
	v, err := svc2.Watch(ctx, "f", "c", View{})
	if err != nil || v.State != NodeAssigned || v.Round != 2 || v.Assignment.GroupRank != 1 {
		t.Fatalf("restored view %+v %v", v, err)
	}
	// Shorten dead_after: both go silent and the round number continues.
	cfg.Heartbeat, cfg.DeadAfter = 50*time.Millisecond, 200*time.Millisecond
	if err := svc2.Configure(ctx, "f", cfg); err != nil {
		t.Fatal(err)
	}
	v, err = svc2.Watch(ctx, "f", "c", v)
	if err != nil || v.State != NodeUnknown || v.Round != 3 || v.RoundState != RoundOpen {
		t.Fatalf("after silence %+v %v", v, err)
	}
	if len(log.kinds()) == 0 {
		t.Fatal("no events after restore")
	}
}

func TestServiceRemoveAndCloseWakeWatchers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store := NewMemoryStore()
	svc := newService(t, Options{Store: store})
	for _, f := range []string{"f", "g"} {
		if err := svc.Configure(ctx, f, testConfig(2, 2)); err != nil {
			t.Fatal(err)
		}
	}
	if got := svc.Fleets(); !slices.Equal(got, []string{"f", "g"}) {
		t.Fatalf("fleets %v", got)
	}
	vf, vg := mustJoin(t, svc, "f", "a"), mustJoin(t, svc, "g", "a")
	errs := make(chan error, 2)
	go func() { _, err := svc.Watch(ctx, "f", "a", vf); errs <- err }()
	go func() { _, err := svc.Watch(ctx, "g", "a", vg); errs <- err }()
	if err := svc.Remove(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; !errors.Is(err, ErrUnknownFleet) {
		t.Fatalf("watch of a removed fleet: %v", err)
	}
	if snaps, _ := store.LoadAll(ctx); len(snaps) != 1 {
		t.Fatalf("store keeps %d fleets", len(snaps))
	}
	svc.Close()
	if err := <-errs; !errors.Is(err, ErrClosed) {
		t.Fatalf("watch on close: %v", err)
	}
	if err := svc.Remove(ctx, "nope"); !errors.Is(err, ErrUnknownFleet) {
		t.Fatalf("remove unknown: %v", err)
	}
}

func TestServiceFinishAndExclude(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	svc := configuredService(ctx, t, Options{}, testConfig(1, 2))
	a, b := mustJoin(t, svc, "f", "a"), mustJoin(t, svc, "f", "b")
	if err := svc.Exclude(ctx, "f", "b", "rebalance recommendation"); err != nil {
		t.Fatal(err)
	}
	if v, _ := svc.Watch(ctx, "f", "b", b); v.State != NodeExcluded || v.Reason != "rebalance recommendation" {
		t.Fatalf("excluded view %+v", v)
	}
	a, _ = svc.Watch(ctx, "f", "a", a)
	if a.Round != 2 || a.Assignment.GroupWorldSize != 1 {
		t.Fatalf("survivor %+v", a)
	}
	if err := svc.Finish(ctx, "f", true); err != nil {
		t.Fatal(err)
	}
	if v, _ := svc.Watch(ctx, "f", "a", a); v.State != NodeFinished || !v.Success {
		t.Fatalf("finished view %+v", v)
	}
	if v := mustJoin(t, svc, "f", "c"); v.State != NodeFinished {
		t.Fatalf("join after finish %+v", v)
	}
	if _, err := svc.Join(ctx, "nope", JoinRequest{NodeID: "a", Addr: "10.0.0.1", Nproc: 1}); !errors.Is(err, ErrUnknownFleet) {
		t.Fatalf("join unknown fleet: %v", err)
	}
}

// gateStore holds saves of fleet "f" while its gate is closed, and records
// how many saves ran and whether two ever overlapped.
type gateStore struct {
	*MemoryStore
	gate     chan struct{}
	entered  chan struct{} // one send per save reaching the gate
	inFlight atomic.Int32
	overlap  atomic.Bool
	saves    atomic.Int32
}

func (s *gateStore) SaveFleet(ctx context.Context, fleet string, snap Snapshot) error {
	if s.inFlight.Add(1) > 1 {
		s.overlap.Store(true)
	}
	defer s.inFlight.Add(-1)
	if g := s.gate; g != nil {
		s.entered <- struct{}{}
		select {
		case <-g:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.saves.Add(1)
	return s.MemoryStore.SaveFleet(ctx, fleet, snap)
}

// Exclusions that come in while a save is in flight are applied at once,
// written together by the next save, returned only once saved, reported
// only then, and all survive a crash.
func TestServiceGroupsConcurrentExclusions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		victims   int
		wantSaves int32 // the held save, then one for all the others
	}{
		{"one", 1, 1},
		{"two", 2, 2},
		{"storm", 200, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			store := &gateStore{MemoryStore: NewMemoryStore()}
			var log eventLog
			svc := configuredService(ctx, t, Options{Store: store, OnChange: log.add}, testConfig(1, tc.victims+1))
			survivor := mustJoin(t, svc, "f", "s")
			for i := range tc.victims {
				mustJoin(t, svc, "f", fmt.Sprintf("v%d", i))
			}
			survivor, err := svc.Watch(ctx, "f", "s", survivor)
			if err != nil || survivor.State != NodeAssigned || survivor.Round != 1 {
				t.Fatalf("round 1 with every node: %+v %v", survivor, err)
			}
			store.gate, store.entered = make(chan struct{}), make(chan struct{}, tc.victims)
			store.saves.Store(0)

			errs := make(chan error, tc.victims)
			for i := range tc.victims {
				go func() {
					node := fmt.Sprintf("v%d", i)
					if err := svc.Exclude(ctx, "f", node, "spot notice"); err != nil {
						errs <- err
						return
					}
					// Returned: the exclusion must be on disk already.
					snaps, err := store.LoadAll(ctx)
					if err == nil && !slices.ContainsFunc(snaps["f"].Excluded, func(e Exclusion) bool { return e.NodeID == node }) {
						err = fmt.Errorf("Exclude(%s) returned before its exclusion was saved", node)
					}
					errs <- err
				}()
			}
			<-store.entered // the first save is held
			// The fleet is not locked during the save: every exclusion is
			// applied in memory meanwhile (bounded wait).
			for tries := 0; ; tries++ {
				st, err := svc.Status("f")
				if err != nil {
					t.Fatal(err)
				}
				if len(st.Excluded) == tc.victims {
					break
				}
				if tries > 2000 {
					t.Fatalf("%d of %d exclusions applied while a save was held", len(st.Excluded), tc.victims)
				}
				time.Sleep(5 * time.Millisecond)
			}
			// Nothing of it is reported or announced before it is saved.
			for _, k := range log.kinds() {
				if k == EventMemberExcluded {
					t.Fatal("an exclusion was reported before it was saved")
				}
			}
			if v := svc.mustView(t, "f", "s"); v.State == NodeAssigned && v.Round > 1 {
				t.Fatalf("re-formed round announced before it was saved: %+v", v)
			}
			close(store.gate)
			for range tc.victims {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if got := store.saves.Load(); got != tc.wantSaves {
				t.Errorf("%d saves for %d exclusions; want %d", got, tc.victims, tc.wantSaves)
			}
			if store.overlap.Load() {
				t.Error("two saves of one fleet overlapped")
			}
			reported := 0
			for _, k := range log.kinds() {
				if k == EventMemberExcluded {
					reported++
				}
			}
			if reported != tc.victims {
				t.Errorf("%d exclusions reported; want %d", reported, tc.victims)
			}
			if v, err := svc.Watch(ctx, "f", "s", survivor); err != nil || v.State != NodeAssigned || v.Round < 2 || v.Assignment.GroupWorldSize != 1 {
				t.Fatalf("survivor after the exclusions: %+v %v", v, err)
			}

			// Crash: a new service on the same store, the old one never closed.
			store.gate = nil
			svc2 := newService(t, Options{Store: store})
			st, err := svc2.Status("f")
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Excluded) != tc.victims || len(st.Members) != 1 || st.Members[0].NodeID != "s" {
				t.Fatalf("after reload: %d excluded, members %+v; want %d excluded, member s", len(st.Excluded), st.Members, tc.victims)
			}
			if v := mustJoin(t, svc2, "f", "v0"); v.State != NodeExcluded {
				t.Fatalf("an excluded node rejoined after reload: %+v", v)
			}
		})
	}
}
