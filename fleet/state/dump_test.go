package state_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/state/etcdtest"
	"github.com/fleetd/fleetd/providers"
)

// fill writes one of everything, more records than one etcd load batch,
// and a binary meta value.
func fill(t *testing.T, s state.Store) {
	t.Helper()
	ctx := context.Background()
	for c := range 3 {
		err := s.Update(ctx, func(tx state.Tx) error {
			f := fmt.Sprintf("fleet-%d", c)
			if _, err := tx.PutFleet(state.Fleet{Name: f, Source: []byte("fleet {} <&>"), Vars: map[string]string{"a": "b"}}); err != nil {
				return err
			}
			for i := range 40 {
				n := state.Node{Fleet: f, ID: fmt.Sprintf("n%02d", i), State: state.NodeRunning,
					Offering: providers.Offering{Provider: "local", InstanceType: "gpu8", GPUs: 8}}
				if err := tx.PutNode(n); err != nil {
					return err
				}
			}
			for i := range 30 {
				if _, err := tx.AppendEvent(state.Event{Fleet: f, Type: "test", Message: fmt.Sprint(i), Data: map[string]string{"k": "v"}}); err != nil {
					return err
				}
			}
			if err := tx.PutOffering(state.OfferingRecord{Key: "local/r/" + f, Launches: c}); err != nil {
				return err
			}
			for _, mount := range []string{"/data/a", "/data/b"} {
				r := state.StagingRecord{Fleet: f, Node: "n01", MountPath: mount, Report: []byte(`{"from":"n00","bytes":42}`)}
				if err := tx.PutStaging(r); err != nil {
					return err
				}
			}
			return tx.SetMeta(fmt.Sprintf("rdzv/%s", f), []byte{0xff, 0x00, byte(c)})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func dumpOf(t *testing.T, s state.Store) ([]byte, state.DumpCounts) {
	t.Helper()
	var buf bytes.Buffer
	c, err := state.Dump(context.Background(), s, &buf)
	if err != nil {
		t.Fatalf("Dump: %v", err)
	}
	return buf.Bytes(), c
}

func TestDumpLoadRoundTrip(t *testing.T) {
	cli := etcdtest.Shared(t).Client(t)
	clk := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	now := func() time.Time { return clk }
	bolt := func(name string) state.Store {
		s, err := state.Open(filepath.Join(t.TempDir(), name+".db"), state.Options{NoSync: true, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	src := bolt("src")
	fill(t, src)
	want, counts := dumpOf(t, src)
	if counts != (state.DumpCounts{Meta: 6, Fleets: 3, Nodes: 120, Events: 90, Offerings: 3, Staging: 6, EventSeq: 90}) {
		t.Errorf("counts = %+v", counts)
	}
	srcID, _ := state.DaemonID(context.Background(), src)
	// bbolt → etcd → memory → bbolt: every copy dumps identically.
	chain := []struct {
		name string
		s    state.Store
	}{
		{"etcd", openEtcd(t, cli, state.EtcdOptions{Now: now})},
		{"memory", state.NewMemoryWithClock(now)},
		{"bolt", bolt("dst")},
	}
	from := want
	for _, c := range chain {
		got, err := state.Load(context.Background(), c.s, bytes.NewReader(from), state.LoadOptions{})
		if err != nil {
			t.Fatalf("Load into %s: %v", c.name, err)
		}
		if got != counts {
			t.Errorf("Load into %s counted %+v; want %+v", c.name, got, counts)
		}
		again, _ := dumpOf(t, c.s)
		if !bytes.Equal(again, want) {
			t.Fatalf("dump of the %s copy differs:\n%s", c.name, firstDiff(want, again))
		}
		if id, _ := state.DaemonID(context.Background(), c.s); id != srcID {
			t.Errorf("%s copy has daemon id %q; want the source's %q", c.name, id, srcID)
		}
		// The copy keeps counting events where the source stopped.
		if err := c.s.Update(context.Background(), func(tx state.Tx) error {
			e, err := tx.AppendEvent(state.Event{Type: "after"})
			if e.Seq != counts.EventSeq+1 {
				t.Errorf("%s copy: next event seq %d; want %d", c.name, e.Seq, counts.EventSeq+1)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		from = again
	}
}

func firstDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\nwant %s\ngot  %s", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("%d lines vs %d", len(al), len(bl))
}

func TestLoadRefusesNonEmpty(t *testing.T) {
	cli := etcdtest.Shared(t).Client(t)
	ctx := context.Background()
	src := state.NewMemory()
	fill(t, src)
	dump, _ := dumpOf(t, src)
	targets := map[string]func() state.Store{
		"memory": func() state.Store { return state.NewMemory() },
		"bolt": func() state.Store {
			s, err := state.Open(filepath.Join(t.TempDir(), "s.db"), state.Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		"etcd": func() state.Store { return openEtcd(t, cli, state.EtcdOptions{Prefix: etcdtest.Prefix("refuse")}) },
	}
	for name, mk := range targets {
		t.Run(name, func(t *testing.T) {
			for _, what := range []string{"fleet", "meta", "event"} {
				dst := mk()
				if err := dst.Update(ctx, func(tx state.Tx) error {
					switch what {
					case "fleet":
						_, err := tx.PutFleet(state.Fleet{Name: "mine"})
						return err
					case "meta":
						return tx.SetMeta("mine", []byte("x"))
					}
					_, err := tx.AppendEvent(state.Event{Type: "mine"})
					return err
				}); err != nil {
					t.Fatal(err)
				}
				before, _ := dumpOf(t, dst)
				_, err := state.Load(ctx, dst, bytes.NewReader(dump), state.LoadOptions{})
				if !errors.Is(err, state.ErrNotEmpty) {
					t.Fatalf("Load into a store with a %s: %v; want ErrNotEmpty", what, err)
				}
				if after, _ := dumpOf(t, dst); !bytes.Equal(before, after) {
					t.Errorf("refused Load changed the target")
				}
				// -force replaces everything, including the target's own
				// meta keys and nodes the bbolt store had cached.
				if err := dst.View(ctx, func(tx state.Tx) error { _, err := tx.Fleets(); return err }); err != nil {
					t.Fatal(err)
				}
				if _, err := state.Load(ctx, dst, bytes.NewReader(dump), state.LoadOptions{Force: true}); err != nil {
					t.Fatalf("Load -force: %v", err)
				}
				if got, _ := dumpOf(t, dst); !bytes.Equal(got, dump) {
					t.Errorf("after Load -force the dump differs:\n%s", firstDiff(dump, got))
				}
			}
		})
	}
}

// Load into a bbolt store whose node cache holds the fleets it replaces.
func TestLoadInvalidatesBoltNodeCache(t *testing.T) {
	ctx := context.Background()
	dst, err := state.Open(filepath.Join(t.TempDir(), "s.db"), state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if err := dst.Update(ctx, func(tx state.Tx) error {
		if _, err := tx.PutFleet(state.Fleet{Name: "fleet-0"}); err != nil {
			return err
		}
		return tx.PutNode(state.Node{Fleet: "fleet-0", ID: "old", State: state.NodeFailed})
	}); err != nil {
		t.Fatal(err)
	}
	read := func() []string {
		var ids []string
		if err := dst.View(ctx, func(tx state.Tx) error {
			ns, err := tx.Nodes("fleet-0")
			for _, n := range ns {
				ids = append(ids, n.ID)
			}
			if _, err := tx.Node("fleet-0", "old"); err == nil {
				ids = append(ids, "old-by-id")
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	read() // loads the cache
	src := state.NewMemory()
	fill(t, src)
	dump, _ := dumpOf(t, src)
	if _, err := state.Load(ctx, dst, bytes.NewReader(dump), state.LoadOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if ids := read(); len(ids) != 40 || ids[0] != "n00" {
		t.Errorf("nodes after Load = %v; want the dump's 40", ids)
	}
}

func TestLoadRejectsBadDumps(t *testing.T) {
	src := state.NewMemory()
	fill(t, src)
	good, _ := dumpOf(t, src)
	lines := strings.SplitAfter(string(good), "\n")
	lines = lines[:len(lines)-1] // the empty string after the last newline
	edit := func(f func([]string) []string) []byte {
		return []byte(strings.Join(f(append([]string(nil), lines...)), ""))
	}
	for _, tc := range []struct {
		name string
		dump []byte
		want string
	}{
		{"empty", nil, "no \"fleetd-state\" header"},
		{"truncated", edit(func(l []string) []string { return l[:len(l)-5] }), "no end line"},
		{"record dropped", edit(func(l []string) []string { return append(l[:10], l[11:]...) }), "the end line counts"},
		{"not json", append(bytes.Clone(good), "garbage\n"...), "record"},
		{"newer format", edit(func(l []string) []string {
			l[0] = strings.Replace(l[0], `"version":1`, `"version":2`, 1)
			return l
		}), "format version 2"},
		{"unknown field", edit(func(l []string) []string {
			l[1] = strings.Replace(l[1], `{"kind"`, `{"extra":1,"kind"`, 1)
			return l
		}), "unknown field"},
		{"node before its fleet", edit(func(l []string) []string {
			for i, s := range l {
				if strings.Contains(s, `"kind":"fleet"`) {
					l[i] = strings.Replace(s, `"key":"fleet-0"`, `"key":"fleet-x"`, 1)
					break
				}
			}
			return l
		}), "fleet named"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := state.NewMemory()
			before, _ := dumpOf(t, dst)
			_, err := state.Load(context.Background(), dst, bytes.NewReader(tc.dump), state.LoadOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v; want an error containing %q", err, tc.want)
			}
			if after, _ := dumpOf(t, dst); !bytes.Equal(before, after) {
				t.Errorf("a rejected dump changed the target")
			}
		})
	}
}
