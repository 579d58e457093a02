package state

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetd/fleetd/providers"
)

// fileNodes reads a fleet's nodes from the file, bypassing the cache.
func fileNodes(t *testing.T, s *BoltStore, fleet string) []Node {
	t.Helper()
	var out []Node
	err := s.db.View(func(btx *bolt.Tx) error {
		return runTx(&boltKV{tx: btx}, s.now, func(tx Tx) error {
			var err error
			out, err = tx.Nodes(fleet)
			return err
		})
	})
	if err != nil {
		t.Fatalf("file Nodes(%s): %v", fleet, err)
	}
	return out
}

// cachedNodes reads a fleet's nodes through the store, the way the daemon
// does, and each node again with Node.
func cachedNodes(t *testing.T, s *BoltStore, fleet string) []Node {
	t.Helper()
	var out []Node
	err := s.View(context.Background(), func(tx Tx) error {
		var err error
		if out, err = tx.Nodes(fleet); err != nil {
			return err
		}
		for _, n := range out {
			one, err := tx.Node(fleet, n.ID)
			if err != nil {
				return err
			}
			if !reflect.DeepEqual(one, n) {
				return fmt.Errorf("Node(%s) = %+v, Nodes has %+v", n.ID, one, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Nodes(%s): %v", fleet, err)
	}
	return out
}

// cacheLoaded reports whether a fleet's entry is loaded and readable now.
func cacheLoaded(s *BoltStore, fleet string) bool {
	s.nodes.mu.Lock()
	defer s.nodes.mu.Unlock()
	e := s.nodes.fleets[fleet]
	return e != nil && e.loaded && !e.writing
}

func cacheNode(fleet, id string, st NodeState) Node {
	// A local time zone and a monotonic reading: JSON keeps neither, so a
	// cache storing the value as given would differ from the file.
	at := time.Now().In(time.FixedZone("bench", 3600))
	return Node{ID: id, Fleet: fleet, State: st, Reason: "test", LastHeartbeat: at, Deadline: at.Add(time.Minute),
		Offering: providers.Offering{Provider: "mem", Region: "r", Zone: "z", InstanceType: "m1", CapacityType: providers.Spot, GPUs: 1, Available: -1}}
}

var errRollback = errors.New("rollback")

// TestNodeCacheCoherence runs sequences of writes, rollbacks, panics and
// reopens; after each step the nodes read through the store (cache) must
// equal those decoded from the file, and the cache must be in use.
func TestNodeCacheCoherence(t *testing.T) {
	type step struct {
		name   string
		fn     func(tx Tx) error // run in an Update
		panics bool
		reopen bool
		// want is the fleet a's node ids and states after the step.
		want string
	}
	put := func(fleet, id string, st NodeState) func(Tx) error {
		return func(tx Tx) error { return tx.PutNode(cacheNode(fleet, id, st)) }
	}
	seq := func(fns ...func(Tx) error) func(Tx) error {
		return func(tx Tx) error {
			for _, fn := range fns {
				if err := fn(tx); err != nil {
					return err
				}
			}
			return nil
		}
	}
	fail := func(tx Tx) error { return errRollback }
	del := func(fleet, id string) func(Tx) error { return func(tx Tx) error { return tx.DeleteNode(fleet, id) } }
	recreate := func(fleet string) func(Tx) error {
		return func(tx Tx) error {
			if err := tx.DeleteFleet(fleet); err != nil {
				return err
			}
			_, err := tx.PutFleet(Fleet{Name: fleet})
			return err
		}
	}
	// Every sequence starts with a: n1 running, n2 booting; b: n1 running.
	const seeded = "n1=running n2=booting"
	tests := []struct {
		name  string
		steps []step
	}{
		{"update a node", []step{
			{name: "transition", fn: put("a", "n2", NodeRunning), want: "n1=running n2=running"},
		}},
		{"add and delete nodes", []step{
			{name: "add n0 and n3", fn: seq(put("a", "n3", NodeRequested), put("a", "n0", NodeRequested)), want: "n0=requested n1=running n2=booting n3=requested"},
			{name: "add n15", fn: put("a", "n15", NodeRequested), want: "n0=requested n1=running n15=requested n2=booting n3=requested"},
			{name: "delete n1", fn: del("a", "n1"), want: "n0=requested n15=requested n2=booting n3=requested"},
			{name: "delete and re-add n2", fn: seq(del("a", "n2"), put("a", "n2", NodeFailed)), want: "n0=requested n15=requested n2=failed n3=requested"},
			{name: "add, update and delete at once", fn: seq(put("a", "n4", NodeRequested), put("a", "n00", NodeRequested), put("a", "n2", NodeTerminated), del("a", "n15")),
				want: "n0=requested n00=requested n2=terminated n3=requested n4=requested"},
		}},
		{"rollback leaves the cache as committed", []step{
			{name: "changes then error", fn: seq(put("a", "n1", NodeDraining), del("a", "n2"), put("a", "n9", NodeRequested), fail), want: seeded},
			{name: "a later commit", fn: put("a", "n1", NodeDraining), want: "n1=draining n2=booting"},
		}},
		{"panic leaves the cache as committed", []step{
			{name: "changes then panic", fn: seq(put("a", "n1", NodeFailed), del("a", "n2")), panics: true, want: seeded},
			{name: "a later commit", fn: put("a", "n2", NodeJoined), want: "n1=running n2=joined"},
		}},
		{"fleet deleted and recreated", []step{
			{name: "recreate a with one node", fn: seq(recreate("a"), put("a", "n5", NodeRequested)), want: "n5=requested"},
			{name: "recreate a empty", fn: recreate("a"), want: ""},
		}},
		{"rolled back fleet deletion", []step{
			{name: "delete a then error", fn: seq(recreate("a"), fail), want: seeded},
		}},
		{"reopen", []step{
			{name: "transition", fn: put("a", "n1", NodeDraining), want: "n1=draining n2=booting"},
			{name: "reopen", reopen: true, want: "n1=draining n2=booting"},
			{name: "transition after reopen", fn: put("a", "n1", NodeTerminated), want: "n1=terminated n2=booting"},
			{name: "reopen again", reopen: true, want: "n1=terminated n2=booting"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			s := testOpen(t, path, Options{NoSync: true})
			mustUpdate(t, s, func(tx Tx) error {
				for _, f := range []string{"a", "b"} {
					if _, err := tx.PutFleet(Fleet{Name: f}); err != nil {
						return err
					}
				}
				return seq(put("a", "n1", NodeRunning), put("a", "n2", NodeBooting), put("b", "n1", NodeRunning))(tx)
			})
			cachedNodes(t, s, "a") // load the cache before the steps
			cachedNodes(t, s, "b")
			bBefore := fileNodes(t, s, "b")
			for _, st := range tc.steps {
				switch {
				case st.reopen:
					if err := s.Close(); err != nil {
						t.Fatal(err)
					}
					s = testOpen(t, path, Options{NoSync: true})
				case st.panics:
					func() {
						defer func() {
							if recover() == nil {
								t.Fatalf("%s: no panic", st.name)
							}
						}()
						_ = s.Update(context.Background(), func(tx Tx) error {
							if err := st.fn(tx); err != nil {
								return err
							}
							panic("boom")
						})
					}()
				default:
					err := s.Update(context.Background(), st.fn)
					if err != nil && !errors.Is(err, errRollback) {
						t.Fatalf("%s: %v", st.name, err)
					}
				}
				got := cachedNodes(t, s, "a")
				if file := fileNodes(t, s, "a"); !reflect.DeepEqual(got, file) {
					t.Fatalf("%s: cached nodes differ from the file:\ncached %+v\nfile   %+v", st.name, got, file)
				}
				if !cacheLoaded(s, "a") {
					t.Fatalf("%s: the cache does not hold fleet a after a read", st.name)
				}
				var states []string
				for _, n := range got {
					states = append(states, n.ID+"="+string(n.State))
				}
				if line := strings.Join(states, " "); line != st.want {
					t.Fatalf("%s: nodes %q, want %q", st.name, line, st.want)
				}
				if b := cachedNodes(t, s, "b"); !reflect.DeepEqual(b, bBefore) {
					t.Fatalf("%s: fleet b changed: %+v", st.name, b)
				}
			}
		})
	}
}

// TestNodeCacheSnapshots checks that the cache never shows a reader
// another snapshot than bbolt's: a View that began before a commit keeps
// seeing the old nodes, and no reader sees an Update that is not committed.
func TestNodeCacheSnapshots(t *testing.T) {
	tests := []struct {
		name     string
		writeErr error // the writer's outcome
		// whether a View started after the writer finished sees its change
		wantNew bool
	}{
		{"commit", nil, true},
		{"rollback", errRollback, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testOpen(t, filepath.Join(t.TempDir(), "state.db"), Options{NoSync: true})
			mustUpdate(t, s, func(tx Tx) error {
				if _, err := tx.PutFleet(Fleet{Name: "a"}); err != nil {
					return err
				}
				// Padding: the writer below must not need to grow the
				// mmap while the old reader is open (bbolt would wait for it).
				for i := range 300 {
					if err := tx.SetMeta(fmt.Sprintf("pad-%03d", i), []byte(strings.Repeat("p", 2000))); err != nil {
						return err
					}
				}
				return tx.PutNode(cacheNode("a", "n1", NodeRunning))
			})
			old := cachedNodes(t, s, "a")

			writerIn, writerGo, writerDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
			readerIn, readerGo, readerDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
			// An old reader: reads, waits for the writer, reads again.
			go func() {
				readerDone <- s.View(context.Background(), func(tx Tx) error {
					first, err := tx.Nodes("a")
					if err != nil {
						return err
					}
					close(readerIn)
					<-readerGo
					again, err := tx.Nodes("a")
					if err != nil {
						return err
					}
					one, err := tx.Node("a", "n1")
					if err != nil {
						return err
					}
					if !reflect.DeepEqual(first, again) || one.State != NodeRunning {
						return fmt.Errorf("a reader's snapshot changed: %+v then %+v (Node: %s)", first, again, one.State)
					}
					return nil
				})
			}()
			<-readerIn
			go func() {
				writerDone <- s.Update(context.Background(), func(tx Tx) error {
					if err := tx.PutNode(cacheNode("a", "n1", NodeDraining)); err != nil {
						return err
					}
					close(writerIn)
					<-writerGo
					return tc.writeErr
				})
			}()
			<-writerIn
			// While the writer is open, readers see the committed nodes.
			if during := cachedNodes(t, s, "a"); !reflect.DeepEqual(during, old) {
				t.Fatalf("a reader saw an uncommitted write: %+v", during)
			}
			close(writerGo)
			select {
			case err := <-writerDone:
				if !errors.Is(err, tc.writeErr) {
					t.Fatalf("Update: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the writer did not finish (waiting on the open reader?)")
			}
			close(readerGo)
			if err := <-readerDone; err != nil {
				t.Fatal(err)
			}
			after := cachedNodes(t, s, "a")
			if got := after[0].State == NodeDraining; got != tc.wantNew {
				t.Fatalf("after the writer: n1 is %s", after[0].State)
			}
			if file := fileNodes(t, s, "a"); !reflect.DeepEqual(after, file) {
				t.Fatalf("cached nodes differ from the file:\ncached %+v\nfile   %+v", after, file)
			}
			if !cacheLoaded(s, "a") {
				t.Fatal("the cache does not hold fleet a")
			}
		})
	}
}

// TestNodeCacheRules checks when a reader may use an entry and when a
// reader's decoded nodes may fill it.
func TestNodeCacheRules(t *testing.T) {
	loaded := func(changed int, writing bool) *fleetNodes {
		return &fleetNodes{nodes: []*Node{{ID: "n1"}}, loaded: true, changed: changed, writing: writing}
	}
	tests := []struct {
		name     string
		entry    *fleetNodes // nil: none
		txid     int
		writer   bool
		wantUse  bool
		wantFill bool // an empty fill at txid replaces nothing unless allowed
	}{
		{"no entry", nil, 5, false, false, true},
		{"unloaded, never written", &fleetNodes{}, 5, false, false, true},
		{"unloaded, written after the reader began", &fleetNodes{changed: 6}, 5, false, false, false},
		{"unloaded, written before", &fleetNodes{changed: 4}, 5, false, false, true},
		{"unloaded, being written", &fleetNodes{writing: true}, 5, false, false, false},
		{"loaded, same commit", loaded(5, false), 5, false, true, false},
		{"loaded, newer than the reader", loaded(6, false), 5, false, false, false},
		{"loaded, being written: reader", loaded(4, true), 5, false, false, false},
		{"loaded, being written: the writer itself", loaded(4, true), 5, true, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newNodeCache()
			if tc.entry != nil {
				c.fleets["a"] = tc.entry
			}
			for _, shared := range []bool{false, true} {
				if _, ok := c.list("a", tc.txid, tc.writer, shared); ok != tc.wantUse {
					t.Errorf("list (shared %v) usable = %v, want %v", shared, ok, tc.wantUse)
				}
			}
			_, _, ok := c.get("a", "n1", tc.txid, tc.writer)
			if ok != tc.wantUse {
				t.Errorf("get usable = %v, want %v", ok, tc.wantUse)
			}
			if tc.writer {
				return
			}
			c.fill("a", tc.txid, []Node{})
			e := c.fleets["a"]
			filled := e.loaded && len(e.nodes) == 0
			if filled != tc.wantFill {
				t.Errorf("filled = %v, want %v", filled, tc.wantFill)
			}
		})
	}
}

// TestNodeCacheFailedCommit: when the commit itself fails, the touched
// fleets are dropped and reloaded only by readers that start later.
func TestNodeCacheFailedCommit(t *testing.T) {
	c := newNodeCache()
	c.fill("a", 3, []Node{{ID: "n1", State: NodeRunning}})
	c.begin("a")
	c.invalidate(4, map[string]*nodeWrites{"a": {puts: map[string]*Node{"n1": {ID: "n1", State: NodeFailed}}}})
	if _, ok := c.list("a", 4, false, false); ok {
		t.Fatal("a fleet whose commit failed is still served")
	}
	c.fill("a", 3, []Node{{ID: "n1", State: NodeRunning}})
	if _, ok := c.list("a", 4, false, false); ok {
		t.Fatal("a reader older than the failed commit refilled the cache")
	}
	c.fill("a", 4, []Node{{ID: "n1", State: NodeFailed}})
	if got, ok := c.list("a", 4, false, false); !ok || got[0].State != NodeFailed {
		t.Fatalf("after a later reader: %+v, %v", got, ok)
	}
}
