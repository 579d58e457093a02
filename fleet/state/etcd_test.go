package state_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/state/etcdtest"
	"github.com/fleetd/fleetd/fleet/state/statetest"
)

// The etcd tests share one embedded etcd server per test binary (started on
// first use, stopped by TestMain); each store gets its own prefix.

func openEtcd(t *testing.T, cli *clientv3.Client, opts state.EtcdOptions) *state.Etcd {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = etcdtest.Prefix(t.Name())
	}
	s, err := state.OpenEtcd(context.Background(), cli, opts)
	if err != nil {
		t.Fatalf("OpenEtcd: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestEtcdConformance(t *testing.T) {
	cli := etcdtest.Shared(t).Client(t)
	statetest.Run(t, func(t *testing.T, now func() time.Time) state.Store {
		return openEtcd(t, cli, state.EtcdOptions{Now: now})
	})
}

func incr(tx state.Tx, key string) error {
	v, err := tx.Meta(key)
	if err != nil {
		return err
	}
	n := 0
	if v != nil {
		if n, err = strconv.Atoi(string(v)); err != nil {
			return err
		}
	}
	return tx.SetMeta(key, []byte(strconv.Itoa(n+1)))
}

func metaInt(t *testing.T, s state.Store, key string) int {
	t.Helper()
	var n int
	err := s.View(context.Background(), func(tx state.Tx) error {
		v, err := tx.Meta(key)
		if err != nil || v == nil {
			return err
		}
		n, err = strconv.Atoi(string(v))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Two stores (two fleetd processes) on one prefix: their Updates conflict,
// are retried, and none is lost; event seqs stay unique and gap-free.
func TestEtcdTwoWriters(t *testing.T) {
	cli := etcdtest.Shared(t).Client(t)
	prefix := etcdtest.Prefix(t.Name())
	// Generous attempts: the two writers loop back to back, so one can lose
	// many rounds in a row; the point here is that nothing is lost.
	opts := state.EtcdOptions{Prefix: prefix, MaxAttempts: 50}
	stores := []*state.Etcd{openEtcd(t, cli, opts), openEtcd(t, cli, opts)}
	const each = 50
	runs := make([]int, 2)
	statetest.Concurrently(t, len(stores), each, func(i, j int) error {
		return stores[i].Update(context.Background(), func(tx state.Tx) error {
			runs[i]++
			if err := incr(tx, "counter"); err != nil {
				return err
			}
			_, err := tx.AppendEvent(state.Event{Type: "incr", Message: fmt.Sprintf("%d/%d", i, j)})
			return err
		})
	})
	if got := metaInt(t, stores[0], "counter"); got != 2*each {
		t.Errorf("counter = %d after 2×%d increments; want %d", got, each, 2*each)
	}
	evs, err := stores[1].Events(context.Background(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, e := range evs {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d; want gap-free 1..%d", i, e.Seq, 2*each)
		}
		if seen[e.Message] {
			t.Errorf("event %s stored twice", e.Message)
		}
		seen[e.Message] = true
	}
	if len(evs) != 2*each {
		t.Errorf("%d events; want %d", len(evs), 2*each)
	}
	t.Logf("fn runs for %d updates each: %v (conflicts retried)", each, runs)
}

// AppendEvents from two processes: each call's seqs are consecutive and
// every seq is handed out once.
func TestEtcdConcurrentAppendTwoStores(t *testing.T) {
	cli := etcdtest.Shared(t).Client(t)
	opts := state.EtcdOptions{Prefix: etcdtest.Prefix(t.Name()), MaxAttempts: 50}
	stores := []*state.Etcd{openEtcd(t, cli, opts), openEtcd(t, cli, opts)}
	var mu sync.Mutex
	var all []uint64
	var wg sync.WaitGroup
	for i, s := range stores {
		for w := range 2 {
			wg.Go(func() {
				for c := range 10 {
					evs, err := s.AppendEvents(context.Background(), []state.Event{{Type: "a", Message: fmt.Sprint(i, w, c)}, {Type: "b"}})
					if err != nil {
						t.Error(err)
						return
					}
					if evs[1].Seq != evs[0].Seq+1 {
						t.Errorf("one call's seqs %d, %d are not consecutive", evs[0].Seq, evs[1].Seq)
					}
					mu.Lock()
					all = append(all, evs[0].Seq, evs[1].Seq)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	slices.Sort(all)
	for i, seq := range all {
		if seq != uint64(i+1) {
			t.Fatalf("seqs handed out = %v; want 1..%d once each", all, len(all))
		}
	}
}

// A store fenced on an election-style key: once the key is re-created (a
// new leader), every Update fails with ErrFenced and writes nothing; View
// still works.
func TestEtcdFence(t *testing.T) {
	cli := etcdtest.Shared(t).Client(t)
	ctx := context.Background()
	prefix := etcdtest.Prefix(t.Name())
	leaderKey := prefix + "leader"
	put, err := cli.Put(ctx, leaderKey, "server-1")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	fenceRev := put.Header.Revision // the key's create revision
	old := openEtcd(t, cli, state.EtcdOptions{Prefix: prefix + "state/", Fence: func() []clientv3.Cmp {
		mu.Lock()
		defer mu.Unlock()
		return state.FenceKey(leaderKey, fenceRev)
	}})
	if err := old.Update(ctx, func(tx state.Tx) error { return incr(tx, "n") }); err != nil {
		t.Fatalf("Update while leader: %v", err)
	}
	// Leadership moves: the key is deleted and created by another server.
	if _, err := cli.Delete(ctx, leaderKey); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, leaderKey, "server-2"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"Update", func() error {
			return old.Update(ctx, func(tx state.Tx) error { return incr(tx, "n") })
		}},
		{"AppendEvents", func() error {
			_, err := old.AppendEvents(ctx, []state.Event{{Type: "x"}})
			return err
		}},
	} {
		if err := tc.fn(); !errors.Is(err, state.ErrFenced) {
			t.Errorf("%s after losing the leadership: %v; want ErrFenced", tc.name, err)
		}
	}
	// A fenced store whose writes also conflict with the new leader's is
	// still reported as fenced, not as a conflict.
	other := openEtcd(t, cli, state.EtcdOptions{Prefix: prefix + "state/"})
	if err := other.Update(ctx, func(tx state.Tx) error { return incr(tx, "n") }); err != nil {
		t.Fatal(err)
	}
	if err := old.Update(ctx, func(tx state.Tx) error { return incr(tx, "n") }); !errors.Is(err, state.ErrFenced) {
		t.Errorf("fenced and conflicting Update: %v; want ErrFenced", err)
	}
	if got := metaInt(t, old, "n"); got != 2 {
		t.Errorf("n = %d; want 2 (the fenced writes must not apply)", got)
	}
	if evs, _ := old.Events(ctx, 0, 0); len(evs) != 0 {
		t.Errorf("fenced AppendEvents wrote %v", evs)
	}
	// Leader again (the fence follows the new key): writes work.
	resp, err := cli.Get(ctx, leaderKey)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	fenceRev = resp.Kvs[0].CreateRevision
	mu.Unlock()
	if err := old.Update(ctx, func(tx state.Tx) error { return incr(tx, "n") }); err != nil {
		t.Errorf("Update with a valid fence: %v", err)
	}
}

// A View sees one revision: writes committed while it runs are invisible to
// it, also across buckets and through paged scans.
func TestEtcdViewSnapshot(t *testing.T) {
	cli := etcdtest.Shared(t).Client(t)
	ctx := context.Background()
	opts := state.EtcdOptions{Prefix: etcdtest.Prefix(t.Name())}
	s := openEtcd(t, cli, opts)
	writer := openEtcd(t, cli, opts)
	// 600 keys, more than one scan page, in chunks below etcd's max-txn-ops.
	for c := 0; c < 600; c += 100 {
		if err := s.Update(ctx, func(tx state.Tx) error {
			if c == 0 {
				if _, err := tx.PutFleet(state.Fleet{Name: "a"}); err != nil {
					return err
				}
			}
			for i := c; i < c+100; i++ {
				if err := tx.SetMeta(fmt.Sprintf("k%04d", i), []byte("1")); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	err := s.View(ctx, func(tx state.Tx) error {
		f, err := tx.Fleet("a") // fixes the snapshot
		if err != nil {
			return err
		}
		if err := writer.Update(ctx, func(tx state.Tx) error {
			if _, err := tx.PutFleet(state.Fleet{Name: "a"}); err != nil {
				return err
			}
			if _, err := tx.PutFleet(state.Fleet{Name: "b"}); err != nil {
				return err
			}
			if err := tx.SetMeta("k0599", []byte("2")); err != nil {
				return err
			}
			return tx.SetMeta("k0000", nil)
		}); err != nil {
			return err
		}
		again, err := tx.Fleet("a")
		if err != nil {
			return err
		}
		if again.Generation != f.Generation {
			t.Errorf("fleet generation changed inside one View: %d → %d", f.Generation, again.Generation)
		}
		if fs, _ := tx.Fleets(); len(fs) != 1 {
			t.Errorf("View sees %d fleets; want the 1 of its snapshot", len(fs))
		}
		for _, k := range []string{"k0000", "k0599"} {
			if v, _ := tx.Meta(k); string(v) != "1" {
				t.Errorf("Meta(%s) = %q inside the View; want its snapshot value 1", k, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := metaInt(t, s, "k0599"); got != 2 {
		t.Errorf("after the View: k0599 = %d; want 2", got)
	}
}

// An Update larger than etcd's --max-txn-ops fails cleanly and writes
// nothing (etcd rejects the whole transaction).
func TestEtcdTooManyOps(t *testing.T) {
	cli := etcdtest.Shared(t).Client(t)
	ctx := context.Background()
	s := openEtcd(t, cli, state.EtcdOptions{})
	err := s.Update(ctx, func(tx state.Tx) error {
		for i := range 200 {
			if err := tx.SetMeta(fmt.Sprint("k", i), []byte("v")); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		t.Fatal("Update of 200 keys succeeded on an etcd with max-txn-ops 128")
	}
	t.Logf("error: %v", err)
	if got := metaInt(t, s, "k0"); got != 0 {
		t.Errorf("a refused Update wrote k0")
	}
}

func TestEtcdStats(t *testing.T) {
	cli := etcdtest.Shared(t).Client(t)
	ctx := context.Background()
	s := openEtcd(t, cli, state.EtcdOptions{})
	if err := s.Update(ctx, func(tx state.Tx) error {
		for _, f := range []string{"a", "a/b"} { // a "/" in a fleet name must not mix their nodes
			if _, err := tx.PutFleet(state.Fleet{Name: f}); err != nil {
				return err
			}
			for _, id := range []string{"n1", "n2"} {
				if err := tx.PutNode(state.Node{Fleet: f, ID: id, State: state.NodeRunning}); err != nil {
					return err
				}
			}
		}
		if err := tx.PutOffering(state.OfferingRecord{Key: "o"}); err != nil {
			return err
		}
		_, err := tx.AppendEvent(state.Event{Type: "x"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := state.Stats{Path: "etcd:" + s.Prefix(), SchemaVersion: state.SchemaVersion, Fleets: 2, Nodes: 4, Offerings: 1, LastEventSeq: 1}
	if st != want {
		t.Errorf("Stats = %+v; want %+v", st, want)
	}
	if err := s.View(ctx, func(tx state.Tx) error {
		ns, err := tx.Nodes("a")
		if len(ns) != 2 || err != nil {
			t.Errorf(`Nodes("a") = %d nodes, %v; want 2`, len(ns), err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, func(tx state.Tx) error { return tx.DeleteFleet("a") }); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Stats(ctx); st.Nodes != 2 || st.Fleets != 1 {
		t.Errorf("after DeleteFleet(a): %+v; want fleet a/b's 2 nodes left", st)
	}
}

// Close waits for a running Update and refuses later calls.
func TestEtcdCloseWaits(t *testing.T) {
	cli := etcdtest.Shared(t).Client(t)
	ctx := context.Background()
	s := openEtcd(t, cli, state.EtcdOptions{})
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.Update(ctx, func(tx state.Tx) error {
			close(started)
			<-release
			return incr(tx, "n")
		})
	}()
	<-started
	closed := make(chan struct{})
	go func() { _ = s.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while an Update was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("Update running at Close: %v", err)
	}
	<-closed
	if err := s.View(ctx, func(state.Tx) error { return nil }); !errors.Is(err, state.ErrClosed) {
		t.Errorf("View after Close: %v", err)
	}
	// The Update committed: a new store on the prefix sees it.
	again := openEtcd(t, cli, state.EtcdOptions{Prefix: s.Prefix()})
	if got := metaInt(t, again, "n"); got != 1 {
		t.Errorf("n = %d; want 1", got)
	}
}

// The store rides out the loss and return of one member of three: the
// cluster keeps a quorum, the client fails over to the other endpoints, and
// no update is lost or applied twice.
func TestEtcdMemberRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster")
	}
	c := etcdtest.StartCluster(t, 3)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openEtcd(t, cli, state.EtcdOptions{})
	want := 0
	step := func(what string) {
		t.Helper()
		for range 20 {
			if err := s.Update(ctx, func(tx state.Tx) error {
				if err := incr(tx, "n"); err != nil {
					return err
				}
				_, err := tx.AppendEvent(state.Event{Type: what})
				return err
			}); err != nil {
				t.Fatalf("%s: Update: %v", what, err)
			}
			want++
		}
		if got := metaInt(t, s, "n"); got != want {
			t.Fatalf("%s: n = %d; want %d", what, got, want)
		}
	}
	step("all members up")
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Stop the leader while updates run back to back. etcd's stop is
	// graceful (it hands the leadership over first); commits cut off mid-way
	// as by a crash are TestEtcdCommitResend's subject.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var during int
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := s.Update(ctx, func(tx state.Tx) error {
				if err := incr(tx, "n"); err != nil {
					return err
				}
				_, err := tx.AppendEvent(state.Event{Type: "leader stopping"})
				return err
			}); err != nil {
				t.Errorf("Update while the leader stops: %v", err)
				return
			}
			during++
		}
	})
	time.Sleep(20 * time.Millisecond)
	leader.Stop()
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
	want += during
	t.Logf("%d updates while the leader %s stopped", during, leader.Name)
	step("one member down")
	if err := leader.Restart(); err != nil {
		t.Fatal(err)
	}
	step("member restarted")
	evs, err := s.Events(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != want || evs[len(evs)-1].Seq != uint64(want) {
		t.Errorf("%d events, last seq %d; want %d each (no update applied twice or lost)", len(evs), evs[len(evs)-1].Seq, want)
	}
}

// flakyKV loses Txn requests or their responses on demand, as a connection
// cut mid-commit does.
type flakyKV struct {
	clientv3.KV
	mu sync.Mutex
	// plan is consumed one entry per Txn commit: "send" loses the request
	// (not applied), "reply" applies it and loses the response, "" passes.
	plan []string
}

type flakyTxn struct {
	clientv3.Txn
	kv *flakyKV
}

func (f *flakyKV) Txn(ctx context.Context) clientv3.Txn { return &flakyTxn{Txn: f.KV.Txn(ctx), kv: f} }

func (t *flakyTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *flakyTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *flakyTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *flakyTxn) Commit() (*clientv3.TxnResponse, error) {
	t.kv.mu.Lock()
	step := ""
	if len(t.kv.plan) > 0 {
		step, t.kv.plan = t.kv.plan[0], t.kv.plan[1:]
	}
	t.kv.mu.Unlock()
	lost := status.Error(codes.Unavailable, "injected: connection lost")
	switch step {
	case "send":
		return nil, lost
	case "reply":
		if _, err := t.Txn.Commit(); err != nil {
			return nil, err
		}
		return nil, lost
	}
	return t.Txn.Commit()
}

// A commit whose request or response is lost is resent; it applies exactly
// once either way.
func TestEtcdCommitResend(t *testing.T) {
	c := etcdtest.Shared(t)
	cli := c.Client(t)
	ctx := context.Background()
	flaky := &flakyKV{KV: cli.KV}
	cli.KV = flaky
	s := openEtcd(t, cli, state.EtcdOptions{})
	for _, tc := range []struct {
		name string
		plan []string
	}{
		{"request lost", []string{"send"}},
		{"response lost", []string{"reply"}},
		{"both, twice", []string{"reply", "send", "send"}},
	} {
		before := metaInt(t, s, "n")
		flaky.mu.Lock()
		flaky.plan = tc.plan
		flaky.mu.Unlock()
		runs := 0
		if err := s.Update(ctx, func(tx state.Tx) error { runs++; return incr(tx, "n") }); err != nil {
			t.Fatalf("%s: Update: %v", tc.name, err)
		}
		if got := metaInt(t, s, "n"); got != before+1 || runs != 1 {
			t.Errorf("%s: n %d → %d with fn run %d times; want +1 with one run", tc.name, before, got, runs)
		}
	}
	// A commit that stays lost until CommitTimeout reports an unknown
	// outcome; the next Update learns the truth and works.
	s2 := openEtcd(t, cli, state.EtcdOptions{Prefix: s.Prefix(), CommitTimeout: 50 * time.Millisecond})
	before := metaInt(t, s2, "n")
	flaky.mu.Lock()
	flaky.plan = []string{"reply", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send", "send"}
	flaky.mu.Unlock()
	err := s2.Update(ctx, func(tx state.Tx) error { return incr(tx, "n") })
	if !errors.Is(err, state.ErrCommitUnknown) {
		t.Fatalf("Update with every send lost: %v; want ErrCommitUnknown", err)
	}
	flaky.mu.Lock()
	flaky.plan = nil
	flaky.mu.Unlock()
	if err := s2.Update(ctx, func(tx state.Tx) error { return incr(tx, "n") }); err != nil {
		t.Fatalf("Update after an unknown outcome: %v", err)
	}
	if got := metaInt(t, s2, "n"); got != before+2 {
		t.Errorf("n = %d; want %d (the first commit applied before its replies were lost)", got, before+2)
	}
}

// DeleteFleet, then the same fleet and nodes again, in one Update: etcd
// refuses a put inside a range the transaction deletes, so the store must
// delete around the new keys.
func TestEtcdDropAndRecreate(t *testing.T) {
	cli := etcdtest.Shared(t).Client(t)
	ctx := context.Background()
	s := openEtcd(t, cli, state.EtcdOptions{})
	put := func(tx state.Tx, ids ...string) error {
		if _, err := tx.PutFleet(state.Fleet{Name: "f"}); err != nil {
			return err
		}
		for _, id := range ids {
			if err := tx.PutNode(state.Node{Fleet: "f", ID: id, State: state.NodeRunning}); err != nil {
				return err
			}
		}
		return nil
	}
	if err := s.Update(ctx, func(tx state.Tx) error { return put(tx, "a", "c", "e", "g") }); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, func(tx state.Tx) error {
		if err := tx.DeleteFleet("f"); err != nil {
			return err
		}
		if err := put(tx, "c", "d", "z"); err != nil {
			return err
		}
		return tx.DeleteNode("f", "d")
	}); err != nil {
		t.Fatal(err)
	}
	err := s.View(ctx, func(tx state.Tx) error {
		ns, err := tx.Nodes("f")
		var ids []string
		for _, n := range ns {
			ids = append(ids, n.ID)
		}
		if !slices.Equal(ids, []string{"c", "z"}) || err != nil {
			t.Errorf("nodes after delete and re-create = %v, %v; want [c z]", ids, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
