// Package statetest is the conformance suite every state.Store passes: the
// bbolt store, the memory store, and any future backend (etcd for HA).
package statetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// Factory returns a new, empty store whose timestamps come from now. The
// factory registers its own cleanup; the suite may Close the store itself.
type Factory func(t *testing.T, now func() time.Time) state.Store

// EventAppender is the optional batched append both built-in stores offer.
type EventAppender interface {
	AppendEvents(ctx context.Context, events []state.Event) ([]state.Event, error)
}

// Clock is a settable clock for the store under test.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock starts a clock at a fixed, non-round UTC time.
func NewClock() *Clock {
	return &Clock{t: time.Date(2026, 3, 4, 5, 6, 7, 8000, time.UTC)}
}

// Now returns the current clock time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Run runs the conformance suite against stores made by newStore.
func Run(t *testing.T, newStore Factory) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s state.Store, clk *Clock)
	}{
		{"Meta", testMeta},
		{"MetaValidation", testMetaValidation},
		{"FleetGeneration", testFleetGeneration},
		{"FleetsOrderedAndNotFound", testFleetsOrdered},
		{"FleetValidation", testFleetValidation},
		{"DeleteFleetRemovesNodes", testDeleteFleet},
		{"NodesPerFleet", testNodesPerFleet},
		{"NodeReadsIsolated", testNodeReadsIsolated},
		{"NodeValidation", testNodeValidation},
		{"EventsOrderAndPaging", testEventsPaging},
		{"EventSeqGapFreeAfterRollback", testEventSeqAfterRollback},
		{"Offerings", testOfferings},
		{"Staging", testStaging},
		{"RollbackOnError", testRollback},
		{"RollbackOnPanic", testPanic},
		{"ViewIsReadOnly", testViewReadOnly},
		{"TxUnusableAfterReturn", testTxDone},
		{"CanceledContext", testCanceled},
		{"ReadYourWrites", testReadYourWrites},
		{"ConcurrentUpdates", testConcurrentUpdates},
		{"ConcurrentAppendEvents", testConcurrentAppendEvents},
		{"AppendEventsInvalid", testAppendEventsInvalid},
		{"Closed", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := NewClock()
			tc.fn(t, newStore(t, clk.Now), clk)
		})
	}
}

func update(t *testing.T, s state.Store, fn func(state.Tx) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func view(t *testing.T, s state.Store, fn func(state.Tx) error) {
	t.Helper()
	if err := s.View(context.Background(), fn); err != nil {
		t.Fatalf("View: %v", err)
	}
}

func putFleet(t *testing.T, s state.Store, name string) state.Fleet {
	t.Helper()
	var f state.Fleet
	update(t, s, func(tx state.Tx) error {
		var err error
		f, err = tx.PutFleet(state.Fleet{Name: name, Filename: name + ".hcl", Source: []byte("fleet \"" + name + "\" {}")})
		return err
	})
	return f
}

func events(t *testing.T, s state.Store, since uint64, limit int) []state.Event {
	t.Helper()
	evs, err := s.Events(context.Background(), since, limit)
	if err != nil {
		t.Fatalf("Events(%d, %d): %v", since, limit, err)
	}
	return evs
}

func seqs(evs []state.Event) []uint64 {
	out := []uint64{}
	for _, e := range evs {
		out = append(out, e.Seq)
	}
	return out
}

func seqRange(from, to uint64) []uint64 {
	out := []uint64{}
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want %v", what, err, target)
	}
}

func testMeta(t *testing.T, s state.Store, clk *Clock) {
	ctx := context.Background()
	view(t, s, func(tx state.Tx) error {
		v, err := tx.Meta(state.MetaSchemaVersion)
		if err != nil || string(v) != strconv.Itoa(state.SchemaVersion) {
			t.Errorf("schema_version = %q, %v; want %d", v, err, state.SchemaVersion)
		}
		created, err := tx.Meta(state.MetaCreatedAt)
		if err != nil {
			t.Fatal(err)
		}
		if ts, err := time.Parse(time.RFC3339Nano, string(created)); err != nil || !ts.Equal(clk.Now()) {
			t.Errorf("created_at = %q (%v); want %v", created, err, clk.Now())
		}
		absent, err := tx.Meta("no-such-key")
		if absent != nil || err != nil {
			t.Errorf("Meta(absent) = %q, %v; want nil, nil", absent, err)
		}
		return nil
	})
	id, err := state.DaemonID(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if !isLowerHex(id, 16) {
		t.Errorf("daemon id %q: want 16 lowercase hex chars", id)
	}
	in := []byte("v1")
	update(t, s, func(tx state.Tx) error { return tx.SetMeta("leader", in) })
	in[0] = 'X' // the store must have copied it
	view(t, s, func(tx state.Tx) error {
		got, err := tx.Meta("leader")
		if err != nil || string(got) != "v1" {
			t.Fatalf("Meta(leader) = %q, %v; want v1", got, err)
		}
		got[0] = 'Y' // and must hand out copies
		again, _ := tx.Meta("leader")
		if string(again) != "v1" {
			t.Errorf("Meta returned the stored slice: now %q", again)
		}
		return nil
	})
	update(t, s, func(tx state.Tx) error { return tx.SetMeta("leader", nil) })
	view(t, s, func(tx state.Tx) error {
		if got, err := tx.Meta("leader"); got != nil || err != nil {
			t.Errorf("after SetMeta(nil): %q, %v; want deleted", got, err)
		}
		return nil
	})
	if id2, _ := state.DaemonID(ctx, s); id2 != id {
		t.Errorf("daemon id changed from %q to %q", id, id2)
	}
}

func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func testMetaValidation(t *testing.T, s state.Store, _ *Clock) {
	for _, key := range []string{state.MetaSchemaVersion, state.MetaDaemonID, state.MetaCreatedAt, ""} {
		err := s.Update(context.Background(), func(tx state.Tx) error { return tx.SetMeta(key, []byte("9")) })
		wantErr(t, fmt.Sprintf("SetMeta(%q)", key), err, state.ErrInvalid)
	}
	view(t, s, func(tx state.Tx) error {
		v, _ := tx.Meta(state.MetaSchemaVersion)
		if string(v) != strconv.Itoa(state.SchemaVersion) {
			t.Errorf("schema_version changed to %q", v)
		}
		return nil
	})
}

func testFleetGeneration(t *testing.T, s state.Store, clk *Clock) {
	t1 := clk.Now()
	var first state.Fleet
	update(t, s, func(tx state.Tx) error {
		var err error
		first, err = tx.PutFleet(state.Fleet{Name: "bert", Source: []byte("v1"), Generation: 42, Vars: map[string]string{"a": "b"}})
		return err
	})
	if first.Generation != 1 || !first.CreatedAt.Equal(t1) || !first.UpdatedAt.Equal(t1) {
		t.Fatalf("first PutFleet = gen %d created %v updated %v; want 1, %v, %v", first.Generation, first.CreatedAt, first.UpdatedAt, t1, t1)
	}
	clk.Advance(time.Minute)
	t2 := clk.Now()
	var second state.Fleet
	update(t, s, func(tx state.Tx) error {
		var err error
		second, err = tx.PutFleet(state.Fleet{Name: "bert", Source: []byte("v2"), CreatedAt: t2.Add(time.Hour)})
		return err
	})
	if second.Generation != 2 || !second.CreatedAt.Equal(t1) || !second.UpdatedAt.Equal(t2) || string(second.Source) != "v2" {
		t.Fatalf("second PutFleet = %+v; want gen 2, created %v, updated %v, source v2", second, t1, t2)
	}
	view(t, s, func(tx state.Tx) error {
		got, err := tx.Fleet("bert")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, second) {
			t.Errorf("Fleet() = %+v\nPutFleet returned %+v", got, second)
		}
		return nil
	})
	// Several puts in one transaction each bump the generation.
	update(t, s, func(tx state.Tx) error {
		for want := int64(3); want <= 4; want++ {
			f, err := tx.PutFleet(state.Fleet{Name: "bert"})
			if err != nil {
				return err
			}
			if f.Generation != want {
				t.Errorf("generation %d, want %d", f.Generation, want)
			}
		}
		return nil
	})
}

func testFleetsOrdered(t *testing.T, s state.Store, _ *Clock) {
	view(t, s, func(tx state.Tx) error {
		fs, err := tx.Fleets()
		if err != nil || fs == nil || len(fs) != 0 {
			t.Errorf("Fleets() on empty store = %#v, %v; want empty non-nil", fs, err)
		}
		return nil
	})
	for _, n := range []string{"gamma", "alpha", "beta"} {
		putFleet(t, s, n)
	}
	view(t, s, func(tx state.Tx) error {
		fs, err := tx.Fleets()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range fs {
			names = append(names, f.Name)
		}
		if !slices.Equal(names, []string{"alpha", "beta", "gamma"}) {
			t.Errorf("Fleets() names = %v; want sorted", names)
		}
		_, err = tx.Fleet("delta")
		wantErr(t, "Fleet(missing)", err, state.ErrNotFound)
		// Empty names are never found, whatever the backend does with empty keys.
		_, err = tx.Fleet("")
		wantErr(t, `Fleet("")`, err, state.ErrNotFound)
		_, err = tx.Nodes("")
		wantErr(t, `Nodes("")`, err, state.ErrNotFound)
		_, err = tx.Node("", "")
		wantErr(t, `Node("", "")`, err, state.ErrNotFound)
		_, err = tx.Node("alpha", "")
		wantErr(t, `Node("alpha", "")`, err, state.ErrNotFound)
		if m, err := tx.Meta(""); m != nil || err != nil {
			t.Errorf(`Meta("") = %q, %v`, m, err)
		}
		return nil
	})
}

func testFleetValidation(t *testing.T, s state.Store, _ *Clock) {
	long := string(make([]byte, 2000))
	for _, name := range []string{"", "x" + long} {
		err := s.Update(context.Background(), func(tx state.Tx) error {
			_, err := tx.PutFleet(state.Fleet{Name: name})
			return err
		})
		wantErr(t, fmt.Sprintf("PutFleet(name of %d bytes)", len(name)), err, state.ErrInvalid)
	}
	view(t, s, func(tx state.Tx) error {
		if fs, _ := tx.Fleets(); len(fs) != 0 {
			t.Errorf("invalid PutFleet stored %d fleets", len(fs))
		}
		return nil
	})
}

func node(fleet, id string, st state.NodeState) state.Node {
	return state.Node{
		ID: id, Fleet: fleet, State: st, Reason: "test",
		Offering: providers.Offering{Provider: "local", Region: "r1", Zone: "r1-a", InstanceType: "gpu8",
			CapacityType: providers.Spot, PricePerHour: 12.5, GPUs: 8, GPUType: "A100", VCPUs: 96, MemoryGiB: 1024, Available: -1},
		InstanceID: "i-" + id, Address: "127.0.0.2", TokenHash: "abc", Round: 3,
		Deadline: time.Date(2026, 3, 4, 5, 8, 0, 0, time.UTC),
	}
}

func testDeleteFleet(t *testing.T, s state.Store, _ *Clock) {
	putFleet(t, s, "a")
	putFleet(t, s, "b")
	update(t, s, func(tx state.Tx) error {
		for _, n := range []state.Node{node("a", "n1", state.NodeRunning), node("a", "n2", state.NodeBooting), node("b", "n1", state.NodeRunning)} {
			if err := tx.PutNode(n); err != nil {
				return err
			}
		}
		return nil
	})
	update(t, s, func(tx state.Tx) error { return tx.DeleteFleet("a") })
	view(t, s, func(tx state.Tx) error {
		_, err := tx.Fleet("a")
		wantErr(t, "Fleet(deleted)", err, state.ErrNotFound)
		_, err = tx.Nodes("a")
		wantErr(t, "Nodes(deleted fleet)", err, state.ErrNotFound)
		_, err = tx.Node("a", "n1")
		wantErr(t, "Node(deleted fleet)", err, state.ErrNotFound)
		if ns, err := tx.Nodes("b"); err != nil || len(ns) != 1 {
			t.Errorf("other fleet's nodes = %v, %v; want 1 node", ns, err)
		}
		return nil
	})
	err := s.Update(context.Background(), func(tx state.Tx) error { return tx.DeleteFleet("a") })
	wantErr(t, "DeleteFleet(missing)", err, state.ErrNotFound)

	// A fleet re-created under the same name starts over.
	f := putFleet(t, s, "a")
	if f.Generation != 1 {
		t.Errorf("re-created fleet generation = %d; want 1", f.Generation)
	}
	view(t, s, func(tx state.Tx) error {
		if ns, err := tx.Nodes("a"); err != nil || len(ns) != 0 {
			t.Errorf("re-created fleet has nodes %v, %v; want none", ns, err)
		}
		return nil
	})
}

func testNodesPerFleet(t *testing.T, s state.Store, clk *Clock) {
	putFleet(t, s, "a")
	putFleet(t, s, "b")
	t1 := clk.Now()
	in := map[string][]state.Node{
		"a": {node("a", "n3", state.NodeRequested), node("a", "n1", state.NodeRunning), node("a", "n2", state.NodeDraining)},
		"b": {node("b", "n9", state.NodeJoined)},
	}
	update(t, s, func(tx state.Tx) error {
		for _, ns := range in {
			for _, n := range ns {
				if err := tx.PutNode(n); err != nil {
					return err
				}
			}
		}
		return nil
	})
	for _, tc := range []struct {
		fleet string
		ids   []string
	}{
		{"a", []string{"n1", "n2", "n3"}},
		{"b", []string{"n9"}},
	} {
		view(t, s, func(tx state.Tx) error {
			ns, err := tx.Nodes(tc.fleet)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, n := range ns {
				ids = append(ids, n.ID)
				if n.Fleet != tc.fleet || !n.CreatedAt.Equal(t1) || !n.UpdatedAt.Equal(t1) {
					t.Errorf("node %s: fleet %q created %v updated %v", n.ID, n.Fleet, n.CreatedAt, n.UpdatedAt)
				}
			}
			if !slices.Equal(ids, tc.ids) {
				t.Errorf("Nodes(%s) = %v; want %v", tc.fleet, ids, tc.ids)
			}
			return nil
		})
	}
	// Round trip keeps every field; CreatedAt is preserved on update.
	clk.Advance(time.Second)
	want := node("a", "n1", state.NodeDraining)
	want.Reason = "spot interruption notice"
	update(t, s, func(tx state.Tx) error { return tx.PutNode(want) })
	want.CreatedAt, want.UpdatedAt = t1, clk.Now()
	view(t, s, func(tx state.Tx) error {
		got, err := tx.Node("a", "n1")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Node() =\n%+v\nwant\n%+v", got, want)
		}
		_, err = tx.Node("b", "n1")
		wantErr(t, "Node(other fleet)", err, state.ErrNotFound)
		return nil
	})
	update(t, s, func(tx state.Tx) error { return tx.DeleteNode("a", "n2") })
	view(t, s, func(tx state.Tx) error {
		_, err := tx.Node("a", "n2")
		wantErr(t, "Node(deleted)", err, state.ErrNotFound)
		if ns, _ := tx.Nodes("a"); len(ns) != 2 {
			t.Errorf("after delete: %d nodes, want 2", len(ns))
		}
		return nil
	})
	err := s.Update(context.Background(), func(tx state.Tx) error { return tx.DeleteNode("a", "n2") })
	wantErr(t, "DeleteNode(missing)", err, state.ErrNotFound)
}

func testNodeValidation(t *testing.T, s state.Store, _ *Clock) {
	putFleet(t, s, "a")
	for _, tc := range []struct {
		name string
		n    state.Node
		want error
	}{
		{"unknown fleet", node("nope", "n1", state.NodeRunning), state.ErrNotFound},
		{"empty id", node("a", "", state.NodeRunning), state.ErrInvalid},
		{"empty fleet", node("", "n1", state.NodeRunning), state.ErrInvalid},
		{"unknown state", node("a", "n1", "exploded"), state.ErrInvalid},
		{"empty state", node("a", "n1", ""), state.ErrInvalid},
	} {
		err := s.Update(context.Background(), func(tx state.Tx) error { return tx.PutNode(tc.n) })
		wantErr(t, tc.name, err, tc.want)
	}
	view(t, s, func(tx state.Tx) error {
		if ns, _ := tx.Nodes("a"); len(ns) != 0 {
			t.Errorf("invalid PutNode stored %v", ns)
		}
		_, err := tx.Nodes("nope")
		wantErr(t, "Nodes(unknown fleet)", err, state.ErrNotFound)
		return nil
	})
}

func testEventsPaging(t *testing.T, s state.Store, clk *Clock) {
	if got := events(t, s, 0, 0); got == nil || len(got) != 0 {
		t.Fatalf("Events on empty store = %#v; want empty non-nil", got)
	}
	explicit := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 1; i <= 5; i++ {
		clk.Advance(time.Second)
		e := state.Event{Seq: 999, Fleet: "a", Type: "test", Message: fmt.Sprint("m", i), Data: map[string]string{"i": fmt.Sprint(i)}}
		if i == 3 {
			e.Time = explicit
		}
		var got state.Event
		update(t, s, func(tx state.Tx) error {
			var err error
			got, err = tx.AppendEvent(e)
			return err
		})
		wantTime := clk.Now()
		if i == 3 {
			wantTime = explicit
		}
		if got.Seq != uint64(i) || !got.Time.Equal(wantTime) {
			t.Fatalf("AppendEvent #%d: seq %d time %v; want %d %v", i, got.Seq, got.Time, i, wantTime)
		}
	}
	all := events(t, s, 0, 0)
	for i, e := range all {
		if e.Message != fmt.Sprint("m", i+1) || e.Data["i"] != fmt.Sprint(i+1) || e.Fleet != "a" {
			t.Errorf("event %d = %+v", i, e)
		}
	}
	for _, tc := range []struct {
		since uint64
		limit int
		want  []uint64
	}{
		{0, 0, seqRange(1, 5)},
		{0, -1, seqRange(1, 5)},
		{0, 2, []uint64{1, 2}},
		{2, 2, []uint64{3, 4}},
		{4, 10, []uint64{5}},
		{5, 10, []uint64{}},
		{100, 0, []uint64{}},
		{math.MaxUint64, 0, []uint64{}},
	} {
		if got := seqs(events(t, s, tc.since, tc.limit)); !slices.Equal(got, tc.want) {
			t.Errorf("Events(since=%d, limit=%d) = %v; want %v", tc.since, tc.limit, got, tc.want)
		}
	}
	// Paging by the last seen seq visits every event exactly once.
	var paged []uint64
	for since, pages := uint64(0), 0; pages < 10; pages++ {
		page := events(t, s, since, 2)
		if len(page) == 0 {
			break
		}
		paged = append(paged, seqs(page)...)
		since = page[len(page)-1].Seq
	}
	if !slices.Equal(paged, seqRange(1, 5)) {
		t.Errorf("paging by 2 = %v", paged)
	}
	// An invalid event consumes no seq.
	err := s.Update(context.Background(), func(tx state.Tx) error {
		_, err := tx.AppendEvent(state.Event{Message: "no type"})
		return err
	})
	wantErr(t, "AppendEvent(no type)", err, state.ErrInvalid)
	update(t, s, func(tx state.Tx) error {
		e, err := tx.AppendEvent(state.Event{Type: "test"})
		if e.Seq != 6 {
			t.Errorf("seq after invalid event = %d; want 6", e.Seq)
		}
		return err
	})
}

func testEventSeqAfterRollback(t *testing.T, s state.Store, _ *Clock) {
	update(t, s, func(tx state.Tx) error {
		_, err := tx.AppendEvent(state.Event{Type: "test"})
		return err
	})
	boom := errors.New("boom")
	err := s.Update(context.Background(), func(tx state.Tx) error {
		for range 3 {
			if _, err := tx.AppendEvent(state.Event{Type: "rolled-back"}); err != nil {
				return err
			}
		}
		return boom
	})
	wantErr(t, "Update", err, boom)
	update(t, s, func(tx state.Tx) error {
		_, err := tx.AppendEvent(state.Event{Type: "test"})
		return err
	})
	got := events(t, s, 0, 0)
	if !slices.Equal(seqs(got), []uint64{1, 2}) {
		t.Errorf("seqs after a rolled-back append = %v; want [1 2] (committed seqs are gap-free)", seqs(got))
	}
	for _, e := range got {
		if e.Type != "test" {
			t.Errorf("rolled-back event visible: %+v", e)
		}
	}
}

func testOfferings(t *testing.T, s state.Store, clk *Clock) {
	keys := []string{"local/r1/r1-b/gpu8/spot", "aws/us-east-1/us-east-1a/p4d.24xlarge/spot", "gcp/us-central1/us-central1-a/a3-highgpu-8g/on-demand"}
	view(t, s, func(tx state.Tx) error {
		r, err := tx.Offering(keys[0])
		if err != nil || !reflect.DeepEqual(r, state.OfferingRecord{Key: keys[0]}) {
			t.Errorf("Offering(absent) = %+v, %v; want zero record with key", r, err)
		}
		return nil
	})
	until := time.Date(2026, 3, 4, 6, 0, 0, 0, time.UTC)
	update(t, s, func(tx state.Tx) error {
		for i, k := range keys {
			err := tx.PutOffering(state.OfferingRecord{Key: k, UnavailableUntil: until, UnavailableReason: "capacity",
				Interruptions: i, Launches: 10 + i, RunSeconds: 3600.5})
			if err != nil {
				return err
			}
		}
		return nil
	})
	view(t, s, func(tx state.Tx) error {
		rs, err := tx.Offerings()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range rs {
			got = append(got, r.Key)
		}
		sorted := slices.Sorted(slices.Values(keys))
		if !slices.Equal(got, sorted) {
			t.Errorf("Offerings() keys = %v; want %v", got, sorted)
		}
		r, err := tx.Offering(keys[1])
		want := state.OfferingRecord{Key: keys[1], UnavailableUntil: until, UnavailableReason: "capacity",
			Interruptions: 1, Launches: 11, RunSeconds: 3600.5, UpdatedAt: clk.Now()}
		if err != nil || !reflect.DeepEqual(r, want) {
			t.Errorf("Offering() = %+v, %v\nwant %+v", r, err, want)
		}
		return nil
	})
	err := s.Update(context.Background(), func(tx state.Tx) error { return tx.PutOffering(state.OfferingRecord{}) })
	wantErr(t, "PutOffering(no key)", err, state.ErrInvalid)
}

// testStaging: staging records are kept per node and mount path, replaced
// by a newer report, refused for a node that does not exist, and deleted
// with their node (not a node whose id extends it) and their fleet.
func testStaging(t *testing.T, s state.Store, clk *Clock) {
	putFleet(t, s, "a")
	putFleet(t, s, "b")
	rec := func(fleet, node, mount, report string) state.StagingRecord {
		return state.StagingRecord{Fleet: fleet, Node: node, MountPath: mount, Report: []byte(report)}
	}
	update(t, s, func(tx state.Tx) error {
		for _, n := range []state.Node{node("a", "n1", state.NodeRunning), node("a", "n10", state.NodeRunning), node("b", "n1", state.NodeRunning)} {
			if err := tx.PutNode(n); err != nil {
				return err
			}
		}
		for _, r := range []state.StagingRecord{
			rec("a", "n1", "/data/b", `{"bytes":1}`), rec("a", "n1", "/data/a", `{"bytes":2}`),
			rec("a", "n10", "/data/a", `{"bytes":3}`), rec("b", "n1", "/data/a", `{"bytes":4}`),
		} {
			if err := tx.PutStaging(r); err != nil {
				return err
			}
		}
		return nil
	})
	clk.Advance(time.Second)
	update(t, s, func(tx state.Tx) error { return tx.PutStaging(rec("a", "n1", "/data/b", `{"bytes":5,"done":true}`)) })
	keys := func(fleet string) []string {
		var out []string
		view(t, s, func(tx state.Tx) error {
			rs, err := tx.Stagings(fleet)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				out = append(out, r.Node+" "+r.MountPath+" "+string(r.Report))
			}
			return nil
		})
		return out
	}
	want := []string{`n1 /data/a {"bytes":2}`, `n1 /data/b {"bytes":5,"done":true}`, `n10 /data/a {"bytes":3}`}
	if got := keys("a"); !slices.Equal(got, want) {
		t.Errorf("Stagings(a) = %q; want %q", got, want)
	}
	view(t, s, func(tx state.Tx) error {
		rs, err := tx.Stagings("a")
		if err != nil || len(rs) != 3 || !rs[1].UpdatedAt.Equal(clk.Now()) || !rs[0].UpdatedAt.Equal(clk.Now().Add(-time.Second)) {
			t.Errorf("UpdatedAt of the replaced record and an old one: %+v, %v", rs, err)
		}
		return nil
	})

	err := s.Update(context.Background(), func(tx state.Tx) error { return tx.PutStaging(rec("a", "gone", "/data/a", `{}`)) })
	wantErr(t, "PutStaging(unknown node)", err, state.ErrNotFound)
	err = s.Update(context.Background(), func(tx state.Tx) error { return tx.PutStaging(rec("a", "n1", "/data/a", `{not json`)) })
	wantErr(t, "PutStaging(bad report)", err, state.ErrInvalid)
	err = s.Update(context.Background(), func(tx state.Tx) error { return tx.PutStaging(rec("a", "n1", "", `{}`)) })
	wantErr(t, "PutStaging(no mount path)", err, state.ErrInvalid)

	update(t, s, func(tx state.Tx) error { return tx.DeleteNode("a", "n1") })
	if got, want := keys("a"), []string{`n10 /data/a {"bytes":3}`}; !slices.Equal(got, want) {
		t.Errorf("after DeleteNode(n1): %q; want %q", got, want)
	}
	update(t, s, func(tx state.Tx) error { return tx.DeleteFleet("a") })
	putFleet(t, s, "a")
	if got := keys("a"); len(got) != 0 {
		t.Errorf("re-created fleet has staging records %q", got)
	}
	if got := keys("b"); len(got) != 1 {
		t.Errorf("other fleet's records = %q; want 1", got)
	}
	if got := keys("none"); len(got) != 0 {
		t.Errorf("unknown fleet's records = %q", got)
	}
}

// snapshot is everything visible through the interface.
type snapshot struct {
	Fleets    []state.Fleet
	Nodes     map[string][]state.Node
	Offerings []state.OfferingRecord
	Meta      string
	Events    []state.Event
}

func snap(t *testing.T, s state.Store) snapshot {
	t.Helper()
	sn := snapshot{Nodes: map[string][]state.Node{}}
	view(t, s, func(tx state.Tx) error {
		var err error
		if sn.Fleets, err = tx.Fleets(); err != nil {
			return err
		}
		for _, f := range sn.Fleets {
			if sn.Nodes[f.Name], err = tx.Nodes(f.Name); err != nil {
				return err
			}
		}
		if sn.Offerings, err = tx.Offerings(); err != nil {
			return err
		}
		m, err := tx.Meta("custom")
		sn.Meta = string(m)
		return err
	})
	sn.Events = events(t, s, 0, 0)
	return sn
}

// writeAll writes one of everything, including an overwrite and deletions.
func writeAll(tx state.Tx) error {
	if _, err := tx.PutFleet(state.Fleet{Name: "a"}); err != nil {
		return err
	}
	if _, err := tx.PutFleet(state.Fleet{Name: "z"}); err != nil {
		return err
	}
	if err := tx.PutNode(node("a", "n7", state.NodeFailed)); err != nil {
		return err
	}
	if err := tx.DeleteNode("a", "n1"); err != nil {
		return err
	}
	if err := tx.DeleteFleet("b"); err != nil {
		return err
	}
	if err := tx.SetMeta("custom", []byte("changed")); err != nil {
		return err
	}
	if err := tx.PutOffering(state.OfferingRecord{Key: "k2"}); err != nil {
		return err
	}
	_, err := tx.AppendEvent(state.Event{Type: "x"})
	return err
}

func seed(t *testing.T, s state.Store) {
	putFleet(t, s, "a")
	putFleet(t, s, "b")
	update(t, s, func(tx state.Tx) error {
		if err := tx.PutNode(node("a", "n1", state.NodeRunning)); err != nil {
			return err
		}
		if err := tx.PutNode(node("b", "n1", state.NodeRunning)); err != nil {
			return err
		}
		if err := tx.SetMeta("custom", []byte("orig")); err != nil {
			return err
		}
		if err := tx.PutOffering(state.OfferingRecord{Key: "k1"}); err != nil {
			return err
		}
		_, err := tx.AppendEvent(state.Event{Type: "seed"})
		return err
	})
}

func testRollback(t *testing.T, s state.Store, _ *Clock) {
	seed(t, s)
	before := snap(t, s)
	boom := errors.New("boom")
	err := s.Update(context.Background(), func(tx state.Tx) error {
		if err := writeAll(tx); err != nil {
			t.Fatalf("writeAll: %v", err)
		}
		return boom
	})
	wantErr(t, "Update", err, boom)
	if after := snap(t, s); !reflect.DeepEqual(before, after) {
		t.Errorf("failed Update changed the store:\nbefore %+v\nafter  %+v", before, after)
	}
	// The same writes commit when fn succeeds.
	update(t, s, writeAll)
	if after := snap(t, s); reflect.DeepEqual(before, after) {
		t.Errorf("successful Update changed nothing")
	}
}

func testPanic(t *testing.T, s state.Store, _ *Clock) {
	seed(t, s)
	before := snap(t, s)
	func() {
		defer func() {
			if r := recover(); r != "test panic" {
				t.Errorf("recovered %v; want the fn's panic", r)
			}
		}()
		_ = s.Update(context.Background(), func(tx state.Tx) error {
			if err := writeAll(tx); err != nil {
				t.Errorf("writeAll: %v", err)
			}
			panic("test panic")
		})
	}()
	if after := snap(t, s); !reflect.DeepEqual(before, after) {
		t.Errorf("panicking Update changed the store:\nbefore %+v\nafter  %+v", before, after)
	}
	putFleet(t, s, "after-panic") // the writer lock was released
}

func writeOps() map[string]func(state.Tx) error {
	return map[string]func(state.Tx) error{
		"SetMeta":     func(tx state.Tx) error { return tx.SetMeta("k", []byte("v")) },
		"PutFleet":    func(tx state.Tx) error { _, err := tx.PutFleet(state.Fleet{Name: "a"}); return err },
		"DeleteFleet": func(tx state.Tx) error { return tx.DeleteFleet("a") },
		"PutNode":     func(tx state.Tx) error { return tx.PutNode(node("a", "n1", state.NodeRunning)) },
		"DeleteNode":  func(tx state.Tx) error { return tx.DeleteNode("a", "n1") },
		"AppendEvent": func(tx state.Tx) error { _, err := tx.AppendEvent(state.Event{Type: "x"}); return err },
		"PutOffering": func(tx state.Tx) error { return tx.PutOffering(state.OfferingRecord{Key: "k"}) },
		"PutStaging": func(tx state.Tx) error {
			return tx.PutStaging(state.StagingRecord{Fleet: "a", Node: "n1", MountPath: "/d", Report: []byte(`{}`)})
		},
	}
}

func testViewReadOnly(t *testing.T, s state.Store, _ *Clock) {
	seed(t, s)
	before := snap(t, s)
	for name, op := range writeOps() {
		err := s.View(context.Background(), op)
		wantErr(t, "View: "+name, err, state.ErrReadOnly)
	}
	if after := snap(t, s); !reflect.DeepEqual(before, after) {
		t.Errorf("writes inside View changed the store")
	}
}

func testTxDone(t *testing.T, s state.Store, _ *Clock) {
	seed(t, s)
	var kept state.Tx
	update(t, s, func(tx state.Tx) error { kept = tx; return nil })
	for name, op := range writeOps() {
		wantErr(t, "late "+name, op(kept), state.ErrTxDone)
	}
	_, err := kept.Fleets()
	wantErr(t, "late Fleets", err, state.ErrTxDone)
	view(t, s, func(tx state.Tx) error { kept = tx; return nil })
	_, err = kept.Meta("custom")
	wantErr(t, "late Meta", err, state.ErrTxDone)
}

func testCanceled(t *testing.T, s state.Store, _ *Clock) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	fn := func(state.Tx) error { called = true; return nil }
	wantErr(t, "View", s.View(ctx, fn), context.Canceled)
	wantErr(t, "Update", s.Update(ctx, fn), context.Canceled)
	_, err := s.Events(ctx, 0, 0)
	wantErr(t, "Events", err, context.Canceled)
	if a, ok := s.(EventAppender); ok {
		_, err := a.AppendEvents(ctx, []state.Event{{Type: "x"}})
		wantErr(t, "AppendEvents", err, context.Canceled)
	}
	if called {
		t.Error("fn ran despite a canceled context")
	}
	if got := events(t, s, 0, 0); len(got) != 0 {
		t.Errorf("canceled AppendEvents wrote %v", got)
	}
}

func testReadYourWrites(t *testing.T, s state.Store, _ *Clock) {
	seed(t, s)
	update(t, s, func(tx state.Tx) error {
		if _, err := tx.PutFleet(state.Fleet{Name: "new"}); err != nil {
			return err
		}
		if fs, _ := tx.Fleets(); len(fs) != 3 || fs[2].Name != "new" {
			t.Errorf("Fleets() inside tx = %v; want the new fleet", fs)
		}
		if err := tx.PutNode(node("new", "n0", state.NodeRequested)); err != nil {
			return err
		}
		if ns, _ := tx.Nodes("new"); len(ns) != 1 {
			t.Errorf("Nodes() inside tx = %v; want the new node", ns)
		}
		if err := tx.DeleteNode("a", "n1"); err != nil {
			return err
		}
		if _, err := tx.Node("a", "n1"); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("deleted node still visible: %v", err)
		}
		if ns, err := tx.Nodes("a"); err != nil || len(ns) != 0 {
			t.Errorf("Nodes() after DeleteNode inside tx = %v, %v; want none", ns, err)
		}
		if err := tx.DeleteFleet("b"); err != nil {
			return err
		}
		if err := tx.PutNode(node("b", "n2", state.NodeRunning)); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("PutNode into a fleet deleted in this tx: %v; want ErrNotFound", err)
		}
		// Re-creating the fleet in the same tx must not resurrect old nodes.
		if _, err := tx.PutFleet(state.Fleet{Name: "b"}); err != nil {
			return err
		}
		if ns, _ := tx.Nodes("b"); len(ns) != 0 {
			t.Errorf("re-created fleet shows old nodes %v", ns)
		}
		return nil
	})
	view(t, s, func(tx state.Tx) error {
		if ns, _ := tx.Nodes("b"); len(ns) != 0 {
			t.Errorf("after commit re-created fleet has nodes %v", ns)
		}
		return nil
	})
}

// Concurrently runs fn(w, i) for every i < each in each of workers
// goroutines, and fails t on the first error once all are done.
func Concurrently(t testing.TB, workers, each int, fn func(w, i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				errs <- fn(w, i)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// checkGapFree asserts the log holds exactly seqs 1..n in order.
func checkGapFree(t *testing.T, s state.Store, n int) []state.Event {
	t.Helper()
	got := events(t, s, 0, 0)
	if !slices.Equal(seqs(got), seqRange(1, uint64(n))) {
		t.Fatalf("event seqs = %v; want 1..%d", seqs(got), n)
	}
	return got
}

func testConcurrentUpdates(t *testing.T, s state.Store, _ *Clock) {
	const workers, each = 8, 25
	Concurrently(t, workers, each, func(w, i int) error {
		return s.Update(context.Background(), func(tx state.Tx) error {
			_, err := tx.AppendEvent(state.Event{Type: "c", Message: fmt.Sprintf("%d/%d", w, i)})
			return err
		})
	})
	seen := map[string]bool{}
	for _, e := range checkGapFree(t, s, workers*each) {
		if seen[e.Message] {
			t.Errorf("event %s stored twice", e.Message)
		}
		seen[e.Message] = true
	}
}

func testConcurrentAppendEvents(t *testing.T, s state.Store, _ *Clock) {
	a, ok := s.(EventAppender)
	if !ok {
		t.Skip("store has no AppendEvents")
	}
	const workers, calls = 16, 20
	type result struct {
		w, call int
		evs     []state.Event
		err     error
	}
	results := make(chan result, workers*calls)
	var wg sync.WaitGroup
	total := 0
	for w := range workers {
		for c := range calls {
			total += 1 + (w+c)%3
		}
		wg.Go(func() {
			for c := range calls {
				batch := make([]state.Event, 1+(w+c)%3)
				for i := range batch {
					batch[i] = state.Event{Type: "batch", Message: fmt.Sprintf("%d/%d/%d", w, c, i)}
				}
				evs, err := a.AppendEvents(context.Background(), batch)
				results <- result{w, c, evs, err}
			}
		})
	}
	wg.Wait()
	close(results)
	bySeq := map[uint64]string{}
	for r := range results {
		if r.err != nil {
			t.Fatalf("AppendEvents: %v", r.err)
		}
		if len(r.evs) != 1+(r.w+r.call)%3 {
			t.Fatalf("AppendEvents returned %d events", len(r.evs))
		}
		for i, e := range r.evs {
			if want := fmt.Sprintf("%d/%d/%d", r.w, r.call, i); e.Message != want {
				t.Errorf("returned event %d = %q; want %q", i, e.Message, want)
			}
			if i > 0 && e.Seq != r.evs[i-1].Seq+1 {
				t.Errorf("one call's seqs are not consecutive: %v", seqs(r.evs))
			}
			if prev, dup := bySeq[e.Seq]; dup {
				t.Errorf("seq %d returned for %s and %s", e.Seq, prev, e.Message)
			}
			bySeq[e.Seq] = e.Message
		}
	}
	for _, e := range checkGapFree(t, s, total) {
		if bySeq[e.Seq] != e.Message {
			t.Errorf("stored seq %d = %q; AppendEvents returned %q", e.Seq, e.Message, bySeq[e.Seq])
		}
	}
}

func testAppendEventsInvalid(t *testing.T, s state.Store, _ *Clock) {
	a, ok := s.(EventAppender)
	if !ok {
		t.Skip("store has no AppendEvents")
	}
	_, err := a.AppendEvents(context.Background(), []state.Event{{Type: "ok"}, {Message: "no type"}})
	wantErr(t, "AppendEvents(invalid)", err, state.ErrInvalid)
	if got, err := a.AppendEvents(context.Background(), nil); err != nil || len(got) != 0 {
		t.Errorf("AppendEvents(nil) = %v, %v", got, err)
	}
	if got := events(t, s, 0, 0); len(got) != 0 {
		t.Errorf("failed AppendEvents wrote %v", seqs(got))
	}
}

func testClosed(t *testing.T, s state.Store, _ *Clock) {
	seed(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fn := func(state.Tx) error { return nil }
	wantErr(t, "View", s.View(context.Background(), fn), state.ErrClosed)
	wantErr(t, "Update", s.Update(context.Background(), fn), state.ErrClosed)
	_, err := s.Events(context.Background(), 0, 0)
	wantErr(t, "Events", err, state.ErrClosed)
	if a, ok := s.(EventAppender); ok {
		_, err := a.AppendEvents(context.Background(), []state.Event{{Type: "x"}})
		wantErr(t, "AppendEvents", err, state.ErrClosed)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// testNodeReadsIsolated: a caller changing the nodes Nodes returned does
// not change what later reads return (a store may cache them); what
// SharedNodes returned stays as it was read when the fleet then changes,
// and later reads see the change.
func testNodeReadsIsolated(t *testing.T, s state.Store, _ *Clock) {
	putFleet(t, s, "a")
	update(t, s, func(tx state.Tx) error {
		for _, id := range []string{"n1", "n2", "n3"} {
			if err := tx.PutNode(node("a", id, state.NodeRunning)); err != nil {
				return err
			}
		}
		return nil
	})
	read := func(shared bool) []state.Node {
		t.Helper()
		var nodes []state.Node
		view(t, s, func(tx state.Tx) error {
			var err error
			if shared {
				nodes, err = tx.SharedNodes("a")
			} else {
				nodes, err = tx.Nodes("a")
			}
			return err
		})
		return nodes
	}
	states := func(nodes []state.Node) string {
		var b strings.Builder
		for _, n := range nodes {
			fmt.Fprintf(&b, "%s=%s/%s ", n.ID, n.State, n.InstanceID)
		}
		return b.String()
	}
	const orig = "n1=running/i-n1 n2=running/i-n2 n3=running/i-n3 "
	for _, shared := range []bool{false, true} {
		read(shared) // a store with a cache loads it here
	}
	mine := read(false)
	mine[0].State, mine[1].InstanceID = state.NodeFailed, "i-changed"
	copy(mine[1:], mine[2:]) // and reorders it
	for _, shared := range []bool{false, true} {
		if got := states(read(shared)); got != orig {
			t.Errorf("after a caller changed its copy, read (shared %v) %s; want %s", shared, got, orig)
		}
	}
	before := read(true)
	update(t, s, func(tx state.Tx) error {
		if err := tx.PutNode(node("a", "n2", state.NodeDraining)); err != nil {
			return err
		}
		return tx.DeleteNode("a", "n3")
	})
	if got := states(before); got != orig {
		t.Errorf("a shared read changed under its reader to %s; want %s", got, orig)
	}
	const changed = "n1=running/i-n1 n2=draining/i-n2 "
	for _, shared := range []bool{false, true} {
		if got := states(read(shared)); got != changed {
			t.Errorf("after the update read (shared %v) %s; want %s", shared, got, changed)
		}
	}
}

// Nodes reads a fleet's nodes from s in a View, failing the test on an error.
func Nodes(t testing.TB, s state.Store, fleet string) []state.Node {
	t.Helper()
	nodes, err := state.Read(context.Background(), s, func(tx state.Tx) ([]state.Node, error) { return tx.Nodes(fleet) })
	if err != nil {
		t.Fatalf("read the nodes of %s: %v", fleet, err)
	}
	return nodes
}
