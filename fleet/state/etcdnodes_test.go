package state_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/state/etcdtest"
	"github.com/fleetd/fleetd/fleet/state/statetest"
)

// rangeKV counts the range reads of one key prefix by kind: a full read of
// the prefix, a read of the keys changed since a revision, a count.
type rangeKV struct {
	clientv3.KV
	prefix                string
	mu                    sync.Mutex
	full, changed, counts int
}

func (r *rangeKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	op := clientv3.OpGet(key, opts...)
	if strings.HasPrefix(key, r.prefix) && len(op.RangeBytes()) > 0 {
		r.mu.Lock()
		switch {
		case op.IsCountOnly():
			r.counts++
		case op.MinModRev() > 0:
			r.changed++
		default:
			r.full++
		}
		r.mu.Unlock()
	}
	return r.KV.Get(ctx, key, opts...)
}

func (r *rangeKV) take() (full, changed, counts int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	full, changed, counts = r.full, r.changed, r.counts
	r.full, r.changed, r.counts = 0, 0, 0
	return
}

// The etcd store's node cache (state/etcdnodes.go) serves a fleet's nodes
// without reading them while nothing changed, follows this store's own
// writes, catches up with another server's writes by reading only what
// changed, and reads in full when a node was deleted meanwhile; it is
// right after a compaction, and callers cannot corrupt it.
func TestEtcdNodeCache(t *testing.T) {
	c := etcdtest.Shared(t)
	ctx := context.Background()
	prefix := etcdtest.Prefix(t.Name())
	cli := c.Client(t)
	counted := &rangeKV{KV: cli.KV, prefix: prefix + "nodes/"}
	cli.KV = counted
	a := openEtcd(t, cli, state.EtcdOptions{Prefix: prefix})         // the server under test
	b := openEtcd(t, c.Client(t), state.EtcdOptions{Prefix: prefix}) // another server

	put := func(s state.Store, nodes ...state.Node) {
		t.Helper()
		if err := s.Update(ctx, func(tx state.Tx) error {
			for _, n := range nodes {
				if err := tx.PutNode(n); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	node := func(i int, st state.NodeState) state.Node {
		return state.Node{ID: fmt.Sprintf("n%02d", i), Fleet: "f", State: st, InstanceID: fmt.Sprintf("i-%d", i)}
	}
	read := func(s state.Store) []state.Node { t.Helper(); return statetest.Nodes(t, s, "f") }
	// want is what a store without a cache for the fleet reads: a fresh
	// one on the same prefix.
	want := func() string {
		t.Helper()
		return fmt.Sprint(read(openEtcd(t, c.Client(t), state.EtcdOptions{Prefix: prefix})))
	}
	if err := a.Update(ctx, func(tx state.Tx) error {
		_, err := tx.PutFleet(state.Fleet{Name: "f"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	put(a, node(1, state.NodeRunning), node(2, state.NodeRunning), node(3, state.NodeBooting))
	read(a) // loads the cache

	for _, step := range []struct {
		name string
		do   func()
		// the range reads of a's next read: full, changed-since, count
		full, changed, counts int
	}{
		{"unchanged", func() {}, 0, 0, 0},
		{"own write", func() { put(a, node(3, state.NodeRunning), node(4, state.NodeRequested)) }, 0, 0, 0},
		{"another server's write", func() { put(b, node(1, state.NodeDraining), node(5, state.NodeRequested)) }, 0, 1, 1},
		{"unchanged after catching up", func() {}, 0, 0, 0},
		{"another server's write, then compaction", func() {
			put(b, node(2, state.NodeFailed))
			resp, err := cli.Get(ctx, prefix+"commit")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
				t.Fatal(err)
			}
		}, 0, 1, 1},
		{"another server's delete", func() {
			if err := b.Update(ctx, func(tx state.Tx) error { return tx.DeleteNode("f", "n03") }); err != nil {
				t.Fatal(err)
			}
		}, 1, 1, 1},
		{"own delete", func() {
			if err := a.Update(ctx, func(tx state.Tx) error { return tx.DeleteNode("f", "n01") }); err != nil {
				t.Fatal(err)
			}
		}, 0, 0, 0},
		{"a caller changes what it read", func() {
			nodes := read(a)
			nodes[0].State, nodes[0].InstanceID = state.NodeTerminated, "i-changed"
			counted.take()
		}, 0, 0, 0},
	} {
		step.do()
		counted.take()
		got := fmt.Sprint(read(a))
		full, changed, counts := counted.take()
		if w := want(); got != w {
			t.Errorf("%s: read %s; want %s", step.name, got, w)
		}
		if full != step.full || changed != step.changed || counts != step.counts {
			t.Errorf("%s: read ranged the nodes %d times in full, %d for changes, %d to count; want %d, %d, %d",
				step.name, full, changed, counts, step.full, step.changed, step.counts)
		}
	}
	if got := read(a); len(got) != 3 || got[0].ID != "n02" || got[0].State != state.NodeFailed {
		t.Errorf("after all steps read %v; want n02 (failed), n04, n05", got)
	}
}

// Reads in an Update see the transaction's own node writes, not the cache.
func TestEtcdNodeCacheOwnWrites(t *testing.T) {
	ctx := context.Background()
	s := openEtcd(t, etcdtest.Shared(t).Client(t), state.EtcdOptions{})
	if err := s.Update(ctx, func(tx state.Tx) error {
		if _, err := tx.PutFleet(state.Fleet{Name: "f"}); err != nil {
			return err
		}
		return tx.PutNode(state.Node{ID: "a", Fleet: "f", State: state.NodeRunning})
	}); err != nil {
		t.Fatal(err)
	}
	statetest.Nodes(t, s, "f") // loads the cache
	var inside []state.Node
	if err := s.Update(ctx, func(tx state.Tx) error {
		if err := tx.PutNode(state.Node{ID: "b", Fleet: "f", State: state.NodeRequested}); err != nil {
			return err
		}
		var err error
		inside, err = tx.Nodes("f")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(inside) != 2 || inside[1].ID != "b" {
		t.Errorf("inside the update read %v; want a and b", inside)
	}
	// A failed update leaves the cache as it was.
	boom := fmt.Errorf("boom")
	if err := s.Update(ctx, func(tx state.Tx) error {
		if err := tx.DeleteNode("f", "a"); err != nil {
			return err
		}
		return boom
	}); err != boom {
		t.Fatalf("update = %v; want %v", err, boom)
	}
	if after := statetest.Nodes(t, s, "f"); len(after) != 2 {
		t.Errorf("after a failed delete read %v; want a and b", after)
	}
}
