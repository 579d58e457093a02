package state

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetd/fleetd/fleet/state/etcdtest"
	"github.com/fleetd/fleetd/providers"
)

// lockHelperEnv makes the test binary act as a second fleetd holding the
// state file lock (see TestLockAcrossProcesses).
const lockHelperEnv = "FLEETD_STATE_TEST_LOCK_HELPER"

func TestMain(m *testing.M) {
	if path := os.Getenv(lockHelperEnv); path != "" {
		os.Exit(lockHelper(path))
	}
	code := m.Run()
	etcdtest.StopShared() // the etcd server the etcd store tests share, if started
	os.Exit(code)
}

// lockHelper opens path, says "locked", and holds the lock until stdin is
// closed (or 20s pass, so an orphaned helper cannot linger).
func lockHelper(path string) int {
	s, err := Open(path, Options{LockTimeout: 5 * time.Second})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	defer s.Close()
	fmt.Println("locked")
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
	}
	return 0
}

func testOpen(t *testing.T, path string, opts Options) *BoltStore {
	t.Helper()
	s, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustUpdate(t *testing.T, s Store, fn func(Tx) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

// dump renders everything readable through the Store interface.
func dump(t *testing.T, s Store) string {
	t.Helper()
	var d struct {
		Meta      map[string]string
		Fleets    []Fleet
		Nodes     map[string][]Node
		Offerings []OfferingRecord
		Events    []Event
	}
	d.Meta, d.Nodes = map[string]string{}, map[string][]Node{}
	err := s.View(context.Background(), func(tx Tx) error {
		for _, k := range []string{MetaSchemaVersion, MetaDaemonID, MetaCreatedAt, "custom"} {
			v, err := tx.Meta(k)
			if err != nil {
				return err
			}
			d.Meta[k] = string(v)
		}
		var err error
		if d.Fleets, err = tx.Fleets(); err != nil {
			return err
		}
		for _, f := range d.Fleets {
			if d.Nodes[f.Name], err = tx.Nodes(f.Name); err != nil {
				return err
			}
		}
		d.Offerings, err = tx.Offerings()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if d.Events, err = s.Events(context.Background(), 0, 0); err != nil {
		t.Fatal(err)
	}
	out, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// fill writes fleets, nodes, offerings, meta and n events (with padding to
// spread the file over many pages).
func fill(t *testing.T, s *BoltStore, fleets, nodesPerFleet, events int) {
	t.Helper()
	mustUpdate(t, s, func(tx Tx) error {
		if err := tx.SetMeta("custom", []byte("hello")); err != nil {
			return err
		}
		for f := range fleets {
			name := fmt.Sprintf("fleet-%02d", f)
			if _, err := tx.PutFleet(Fleet{Name: name, Source: bytes.Repeat([]byte("x"), 500), Vars: map[string]string{"f": name}}); err != nil {
				return err
			}
			for n := range nodesPerFleet {
				err := tx.PutNode(Node{ID: fmt.Sprintf("n%03d", n), Fleet: name, State: NodeRunning,
					Offering: providers.Offering{Provider: "local", Zone: "z1", GPUs: 8, Available: -1}})
				if err != nil {
					return err
				}
			}
			if err := tx.PutOffering(OfferingRecord{Key: "local/r/z/" + name + "/spot", Launches: f}); err != nil {
				return err
			}
		}
		return nil
	})
	batch := make([]Event, events)
	for i := range batch {
		batch[i] = Event{Type: "fill", Message: strings.Repeat("m", 200), Data: map[string]string{"i": fmt.Sprint(i)}}
	}
	if events > 0 {
		if _, err := s.AppendEvents(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReopenKeepsEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path, Options{}) // fsync on: this is the durability path
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, 3, 4, 10)
	before := dump(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = testOpen(t, path, Options{})
	if after := dump(t, s); after != before {
		t.Fatalf("reopened state differs:\nbefore %s\nafter  %s", before, after)
	}
	// Seqs continue after a reopen, through both write paths, and are
	// never reused.
	mustUpdate(t, s, func(tx Tx) error {
		e, err := tx.AppendEvent(Event{Type: "after-reopen"})
		if e.Seq != 11 {
			t.Errorf("first seq after reopen = %d; want 11", e.Seq)
		}
		return err
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = testOpen(t, path, Options{})
	evs, err := s.AppendEvents(context.Background(), []Event{{Type: "a"}, {Type: "b"}})
	if err != nil || evs[0].Seq != 12 || evs[1].Seq != 13 {
		t.Fatalf("AppendEvents after second reopen = %v, %v; want seqs 12, 13", evs, err)
	}
	all, err := s.Events(context.Background(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range all {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
	}
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{Path: path, Bytes: st.Bytes, SchemaVersion: SchemaVersion, Fleets: 3, Nodes: 12, Offerings: 3, LastEventSeq: 13}
	if st != want || st.Bytes <= 0 || s.Path() != path {
		t.Errorf("Stats() = %+v; want %+v", st, want)
	}
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// rawBolt edits a file with bbolt directly, bypassing the store. Files are
// written without a persisted freelist, as etcd does: bbolt would write one
// when opening them read-write.
func rawBolt(t *testing.T, path string, fn func(*bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoFreelistSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

func TestForeignBoltFiles(t *testing.T) {
	tests := []struct {
		name  string
		setup func(*bolt.Tx) error
		want  string
	}{
		{"other program's buckets", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket([]byte("config"))
			if err != nil {
				return err
			}
			return b.Put([]byte("k"), []byte("v"))
		}, `without fleetd's meta bucket (it has a bucket "config"`},
		{"meta without schema version", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			return b.Put([]byte("owner"), []byte("someone"))
		}, "meta bucket has no schema_version"},
		{"garbage schema version", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			return b.Put([]byte(MetaSchemaVersion), []byte("v2"))
		}, `schema_version "v2" is not a positive integer`},
		{"missing bucket", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			return b.Put([]byte(MetaSchemaVersion), []byte("1"))
		}, `bucket "fleets" is missing`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			rawBolt(t, path, tc.setup)
			sum := fileSum(t, path)
			s, err := Open(path, Options{})
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, ErrNotStateFile) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want ErrNotStateFile naming %s and saying %q", err, path, tc.want)
			}
			if fileSum(t, path) != sum {
				t.Error("a refused file was modified")
			}
		})
	}
}

func TestEmptyBoltFileIsInitialised(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	rawBolt(t, path, func(*bolt.Tx) error { return nil })
	s := testOpen(t, path, Options{NoSync: true})
	if id, err := DaemonID(context.Background(), s); err != nil || id == "" {
		t.Fatalf("DaemonID = %q, %v", id, err)
	}
}

// dbImage is a real state file and where things are in it.
type dbImage struct {
	data     []byte
	used     int64    // size its pages need (bbolt preallocates; the file can be larger)
	freelist [2]int64 // byte range of the freelist, which only a read-write bolt.Open reads
	branches []int64  // offsets of in-use branch pages
}

// realDB builds a multi-page state file with some churn.
func realDB(t *testing.T) dbImage {
	t.Helper()
	path := filepath.Join(t.TempDir(), "real.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, 5, 20, 400)
	// Freeing pages makes later commits put the freelist low in the file.
	for _, f := range []string{"fleet-00", "fleet-01", "fleet-02"} {
		mustUpdate(t, s, func(tx Tx) error { return tx.DeleteFleet(f) })
	}
	for i := range 3 {
		mustUpdate(t, s, func(tx Tx) error { return tx.SetMeta("custom", []byte(fmt.Sprint(i))) })
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var img dbImage
	err = db.View(func(tx *bolt.Tx) error {
		img.used = tx.Size()
		for id := 2; int64(id)*4096 < img.used; id++ {
			pi, err := tx.Page(id)
			if err != nil {
				return err
			}
			switch {
			case pi == nil:
			case pi.Type == "freelist":
				img.freelist = [2]int64{int64(id) * 4096, int64(id+1+pi.OverflowCount) * 4096}
			case pi.Type == "branch":
				img.branches = append(img.branches, int64(id)*4096)
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if img.data, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	if img.used < 50*4096 || img.freelist[1] == 0 || img.freelist[1] >= img.used || len(img.branches) == 0 {
		t.Fatalf("test db: %d bytes, freelist at %v, %d branch pages; want many pages, the freelist before the last page and a branch page",
			img.used, img.freelist, len(img.branches))
	}
	return img
}

// mmapSize is the size bbolt maps for a file of n bytes (< 1 GiB).
func mmapSize(n int64) int64 {
	m := int64(32 << 10)
	for m < n {
		m *= 2
	}
	return m
}

func patch(b []byte, fn func([]byte)) []byte {
	b = bytes.Clone(b)
	fn(b)
	return b
}

func TestCorruptFiles(t *testing.T) {
	img := realDB(t)
	real, used, freelist := img.data, img.used, img.freelist
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return b
	}
	garble := func(ranges ...[2]int64) []byte {
		b := bytes.Clone(real)
		for _, r := range ranges {
			copy(b[r[0]:r[1]], random(int(r[1]-r[0])))
		}
		return b
	}
	// detail is what the error must also say; cases that bolt.Open itself
	// rejects or panics on need none, the others prove Open's own checks.
	tests := []struct {
		name, detail string
		data         []byte
	}{
		{"random 100 bytes", "", random(100)},
		{"random 8KiB", "", random(8 << 10)},
		{"random 64KiB", "", random(64 << 10)},
		{"random 1MiB", "", random(1 << 20)},
		{"text", "", []byte("fleet \"bert\" {\n  min_nodes = 2\n}\n")},
		{"truncated to one page", "", real[:4096]},
		{"truncated to four pages", "", real[:4*4096]},
		{"truncated before the freelist", "", real[:freelist[0]]},
		{"truncated by one page", "truncated", real[:used-4096]},
		{"garbled meta pages", "", garble([2]int64{0, 2 * 4096})},
		{"garbled data pages", "reading pages", garble([2]int64{2 * 4096, freelist[0]}, [2]int64{freelist[1], used})},
		// Only the read-write bolt.Open reads the freelist; these reach it.
		{"garbled freelist", "invalid freelist page", garble(freelist)},
		// A freelist whose count spans the data pages after it loads
		// without complaint (garbage page ids, no fault); only bbolt's
		// consistency check notices, before it could hand out used pages.
		{"freelist spans data pages", "consistency check", patch(real, func(b []byte) {
			// Page header: id u64, flags u16, count u16, overflow u32. A
			// count of 0xFFFF means the real count is the first element.
			binary.NativeEndian.PutUint16(b[freelist[0]+10:], 0xFFFF)
			binary.NativeEndian.PutUint64(b[freelist[0]+16:], uint64(used-freelist[0]-24)/8)
		})},
		// A freelist running past the end of the file but inside bbolt's
		// power-of-two mmap faults (SIGBUS) in the read-write bolt.Open.
		{"freelist past end of file", "memory fault", func() []byte {
			pad := int64(4096)
			for mmapSize(int64(len(real))+pad)-(int64(len(real))+pad) < 16<<10 {
				pad += 4096
			}
			b := append(bytes.Clone(real), make([]byte, pad)...)
			binary.NativeEndian.PutUint16(b[freelist[0]+10:], 0xFFFF)
			binary.NativeEndian.PutUint64(b[freelist[0]+16:], uint64(int64(len(b))-freelist[0]+8<<10)/8)
			return b
		}()},
		// A branch element pointing 1 TiB past the mmap faults (SIGSEGV) in
		// the walk: recovered, not a crash.
		{"wild page pointer", "reading pages: bbolt: memory fault", patch(real, func(b []byte) {
			for _, off := range img.branches {
				binary.NativeEndian.PutUint64(b[off+16+8:], 1<<28) // element 0: pos u32, ksize u32, pgid u64
			}
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			for attempt := range 2 { // the second attempt proves the lock was released
				s, err := Open(path, Options{LockTimeout: 200 * time.Millisecond})
				if err == nil {
					s.Close()
					t.Fatal("Open succeeded on a corrupt file")
				}
				if !errors.Is(err, ErrNotStateFile) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a valid fleetd state file") {
					t.Fatalf("attempt %d: error %q; want ErrNotStateFile naming %s", attempt, err, path)
				}
				if !strings.Contains(err.Error(), tc.detail) {
					t.Fatalf("error %q does not say %q", err, tc.detail)
				}
			}
		})
	}
	// The intact file opens, so the cases above fail for the damage alone.
	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(path, real, 0o600); err != nil {
		t.Fatal(err)
	}
	testOpen(t, path, Options{NoSync: true})
}

func TestNewerSchemaVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	rawBolt(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte(MetaSchemaVersion), []byte("7"))
	})
	sum := fileSum(t, path)
	_, err = Open(path, Options{})
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Open = %v; want ErrSchemaTooNew", err)
	}
	for _, want := range []string{path, "schema version 7", fmt.Sprintf("up to version %d", SchemaVersion), "upgrade fleetd"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if fileSum(t, path) != sum {
		t.Error("Open modified a file from a newer fleetd")
	}
}

func TestMigrations(t *testing.T) {
	// v1→v2 adds a "labels" bucket and stamps every fleet; v2→v3 renames
	// the stamp. Real migrations follow the same shape.
	var ran []string
	m12 := migration{from: 1, name: "labels", apply: func(tx *bolt.Tx) error {
		ran = append(ran, "1→2")
		if _, err := tx.CreateBucket([]byte("labels")); err != nil {
			return err
		}
		fleets := tx.Bucket(bucketFleets)
		return fleets.ForEach(func(k, v []byte) error {
			var f Fleet
			if err := json.Unmarshal(v, &f); err != nil {
				return err
			}
			f.Vars["migrated"] = "v2"
			out, err := json.Marshal(f)
			if err != nil {
				return err
			}
			return fleets.Put(k, out)
		})
	}}
	m23 := migration{from: 2, name: "rename", apply: func(tx *bolt.Tx) error {
		ran = append(ran, "2→3")
		return tx.Bucket([]byte("labels")).Put([]byte("renamed"), []byte("yes"))
	}}
	failing := migration{from: 1, name: "breaks", apply: func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucket([]byte("half-done")); err != nil {
			return err
		}
		return errors.New("disk on fire")
	}}

	newV1 := func(t *testing.T) (path, before string) {
		path = filepath.Join(t.TempDir(), "state.db")
		s, err := open(path, Options{NoSync: true}, schema{version: 1})
		if err != nil {
			t.Fatal(err)
		}
		fill(t, s, 2, 2, 3)
		before = dump(t, s)
		s.Close()
		return path, before
	}
	// openV1 opens a file as a version-1 fleetd would: without migrating.
	openV1 := func(t *testing.T, path string) *BoltStore {
		t.Helper()
		s, err := open(path, Options{NoSync: true}, schema{version: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	bucketExists := func(t *testing.T, s *BoltStore, name string) bool {
		var ok bool
		_ = s.db.View(func(tx *bolt.Tx) error { ok = tx.Bucket([]byte(name)) != nil; return nil })
		return ok
	}

	t.Run("two steps with backup", func(t *testing.T) {
		ran = nil
		path, before := newV1(t)
		v3 := schema{version: 3, migrations: []migration{m23, m12}} // order of registration does not matter
		s, err := open(path, Options{}, v3)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ran, []string{"1→2", "2→3"}) {
			t.Errorf("migrations ran %v", ran)
		}
		st, err := s.Stats(context.Background())
		if err != nil || st.SchemaVersion != 3 {
			t.Errorf("schema version after migration = %d, %v; want 3", st.SchemaVersion, err)
		}
		if !bucketExists(t, s, "labels") {
			t.Error("migration's bucket missing")
		}
		err = s.View(context.Background(), func(tx Tx) error {
			f, err := tx.Fleet("fleet-00")
			if f.Vars["migrated"] != "v2" {
				t.Errorf("fleet not migrated: %+v", f.Vars)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()

		// The backup is the untouched v1 file.
		backup := path + ".bak-v1"
		fi, err := os.Stat(backup)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("backup mode %v; want 0600", fi.Mode().Perm())
		}
		b := openV1(t, backup)
		if got := dump(t, b); got != before {
			t.Errorf("backup differs from the pre-migration state:\n%s\n%s", got, before)
		}
		b.Close()

		// Reopening at v3 runs nothing; the v1 binary refuses the file.
		ran = nil
		if err := os.Remove(backup); err != nil {
			t.Fatal(err)
		}
		s, err = open(path, Options{}, v3)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if len(ran) != 0 {
			t.Errorf("reopen ran migrations %v", ran)
		}
		if _, err := os.Stat(backup); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("reopen at the current version wrote a backup: %v", err)
		}
		_, err = open(path, Options{}, schema{version: 2})
		if !errors.Is(err, ErrSchemaTooNew) || !strings.Contains(err.Error(), "schema version 3") {
			t.Errorf("v2 open of a v3 file = %v; want ErrSchemaTooNew naming version 3", err)
		}
	})

	t.Run("failure leaves the file unchanged", func(t *testing.T) {
		path, before := newV1(t)
		_, err := open(path, Options{}, schema{version: 2, migrations: []migration{failing}})
		if err == nil || !strings.Contains(err.Error(), "migration 1→2 (breaks): disk on fire") ||
			!strings.Contains(err.Error(), path+".bak-v1") {
			t.Fatalf("Open = %v; want the migration's error and the backup path", err)
		}
		s := openV1(t, path)
		if got := dump(t, s); got != before {
			t.Errorf("failed migration changed the data")
		}
		if bucketExists(t, s, "half-done") {
			t.Error("failed migration left a partial write")
		}
	})

	t.Run("missing migration", func(t *testing.T) {
		path, _ := newV1(t)
		sum := fileSum(t, path)
		_, err := open(path, Options{}, schema{version: 3, migrations: []migration{m12}})
		if err == nil || !strings.Contains(err.Error(), "no migration from schema version 2 to 3") {
			t.Fatalf("Open = %v; want a missing-migration error", err)
		}
		if fileSum(t, path) != sum {
			t.Error("file modified")
		}
		if _, err := os.Stat(path + ".bak-v1"); !errors.Is(err, os.ErrNotExist) {
			t.Error("backup written although no migration could run")
		}
	})
}

func TestLockTimeout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	path := filepath.Join(dir, "state.db")
	first := testOpen(t, path, Options{NoSync: true})
	_, err := Open(path, Options{LockTimeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v; want ErrLocked", err)
	}
	for _, want := range []string{path, "another fleetd may be running with data dir " + dir} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	testOpen(t, path, Options{LockTimeout: 100 * time.Millisecond})
}

func TestLockAcrossProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), lockHelperEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("helper said %q, %v", line, err)
	}

	_, err = Open(path, Options{LockTimeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "another fleetd may be running") {
		t.Fatalf("Open while another process holds the lock = %v; want ErrLocked", err)
	}
	stdin.Close() // the helper closes the store and exits
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	testOpen(t, path, Options{NoSync: true})
}

func TestPermissions(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "a", "data")
	path := filepath.Join(dir, "state.db")
	testOpen(t, path, Options{NoSync: true}).Close()
	for _, c := range []struct {
		path string
		want os.FileMode
	}{
		{filepath.Join(root, "a"), 0o700},
		{dir, 0o700},
		{path, 0o600},
	} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != c.want {
			t.Errorf("%s: mode %v; want %v", c.path, fi.Mode().Perm(), c.want)
		}
	}
	// A state file someone made world-readable is tightened on open.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	testOpen(t, path, Options{NoSync: true}).Close()
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode after reopen %v; want 0600", fi.Mode().Perm())
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, path, want string
	}{
		{"empty path", "", "empty path"},
		{"path is a directory", dir, dir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Open(tc.path, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open(%q) = %v; want an error mentioning %q", tc.path, err, tc.want)
			}
			if errors.Is(err, ErrNotStateFile) {
				t.Errorf("an I/O error was reported as a bad state file: %v", err)
			}
		})
	}
}

// TestReaderDoesNotBlockGrowingWriter holds a read transaction open while
// writers grow the file well past its first mapping. Without the reserved
// mapping the writer's remap waits for that reader; the daemon's readers
// take locks that writers hold, so that wait was a deadlock (seen as a
// daemon that stopped answering right after its first apply).
func TestReaderDoesNotBlockGrowingWriter(t *testing.T) {
	s := testOpen(t, filepath.Join(t.TempDir(), "state.db"), Options{NoSync: true})
	inView, release := make(chan struct{}), make(chan struct{})
	viewDone := make(chan error, 1)
	go func() {
		viewDone <- s.View(context.Background(), func(tx Tx) error {
			close(inView)
			<-release
			return nil
		})
	}()
	<-inView
	wrote := make(chan error, 1)
	go func() {
		// 64 MiB in 1 MiB values: far beyond bbolt's first mappings.
		val := bytes.Repeat([]byte{'x'}, 1<<20)
		for i := range 64 {
			if err := s.Update(context.Background(), func(tx Tx) error {
				return tx.SetMeta(fmt.Sprintf("grow/%03d", i), val)
			}); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		close(release)
		t.Fatal("writers blocked behind an open read transaction")
	}
	close(release)
	if err := <-viewDone; err != nil {
		t.Fatal(err)
	}
}
