package ckpt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/testutil"
)

// writeStep writes a complete checkpoint step-N into dir the way the
// contract asks: files first, COMPLETE last.
func writeStep(t *testing.T, dir string, step int64, files map[string][]byte) {
	t.Helper()
	d := filepath.Join(dir, StepName(step))
	for rel, b := range files {
		p := filepath.Join(d, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(d, CompleteMarker), fmt.Appendf(nil, `{"step": %d}`, step), 0o644); err != nil {
		t.Fatal(err)
	}
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func stepFiles(step int64) map[string][]byte {
	return map[string][]byte{
		"model.pt":          randBytes(uint64(step), 300<<10),
		"optim/shard-0.bin": randBytes(uint64(step)+1, 70<<10),
		"optim/shard-1.bin": randBytes(uint64(step)+2, 0),
		"meta.json":         fmt.Appendf(nil, `{"step": %d}`, step),
	}
}

// eventLog collects a manager's events.
type eventLog struct {
	mu sync.Mutex
	ev []Event
}

func (l *eventLog) add(e Event) { l.mu.Lock(); l.ev = append(l.ev, e); l.mu.Unlock() }

func (l *eventLog) kinds() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.ev {
		out = append(out, fmt.Sprintf("%s:%d", e.Kind, e.Step))
	}
	return out
}

func (l *eventLog) has(kind string, step int64) bool {
	return slices.Contains(l.kinds(), fmt.Sprintf("%s:%d", kind, step))
}

func fileStore(t *testing.T) (*BucketStore, string) {
	t.Helper()
	root := t.TempDir()
	s, err := OpenBucket(context.Background(), "file://"+root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, root
}

func testConfig(t *testing.T, dir string, log *eventLog) Config {
	return Config{Dir: dir, Keep: 2, Fleet: "f", Node: "n1", StateDir: t.TempDir(), Poll: 20 * time.Millisecond,
		RetryMin: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond, OnEvent: log.add}
}

// waitFor polls cond for at most d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, d, 10*time.Millisecond, what, cond)
}

func storeKeys(t *testing.T, s Store) []string {
	t.Helper()
	objs, err := s.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range objs {
		keys = append(keys, o.Key)
	}
	slices.Sort(keys)
	return keys
}

func sameTree(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for rel, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s differs after restore", rel)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, CompleteMarker)); err != nil {
		t.Fatalf("restored dir has no %s: %v", CompleteMarker, err)
	}
}

// runManager runs m until the test ends.
func runManager(t *testing.T, m *Manager) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// storeRoundTrip is the life of a job's checkpoints against one store:
// only complete steps are uploaded, the store and the dir keep 2, and a
// new node restores the latest.
func storeRoundTrip(t *testing.T, store Store) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	log := &eventLog{}
	m := New(testConfig(t, dir, log), store)
	runManager(t, m)

	// A step being written (no COMPLETE yet) is never uploaded.
	partial := filepath.Join(dir, StepName(10))
	if err := os.MkdirAll(partial, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(partial, "model.pt"), []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, step := range []int64{50, 100, 150} {
		writeStep(t, dir, step, stepFiles(step))
		waitFor(t, 10*time.Second, fmt.Sprintf("step %d uploaded", step), func() bool { return log.has(EventUploaded, step) })
	}
	waitFor(t, 5*time.Second, "step 50 pruned", func() bool { return log.has(EventPruned, 50) })
	keys := storeKeys(t, store)
	for _, k := range keys {
		if strings.Contains(k, "step-50") || strings.Contains(k, "step-10/") || strings.Contains(k, "step-10.") {
			t.Errorf("store still holds %s: %v", k, keys)
		}
	}
	for _, k := range []string{ManifestKey(100), ManifestKey(150), DataKey(150, "optim/shard-0.bin"), DataKey(150, CompleteMarker)} {
		if !slices.Contains(keys, k) {
			t.Errorf("store lacks %s: %v", k, keys)
		}
	}
	waitFor(t, 5*time.Second, "local step-50 pruned", func() bool {
		_, err := os.Stat(filepath.Join(dir, StepName(50)))
		return errors.Is(err, os.ErrNotExist)
	})
	if _, err := os.Stat(partial); err != nil {
		t.Errorf("the partial step was touched: %v", err)
	}
	st, _ := m.Status()
	if st.LastStep != 150 || st.LocalStep != 150 || st.LastBytes == 0 || st.UploadMiBps <= 0 || st.Uploads != 3 || st.Error != "" {
		t.Errorf("status = %+v", st)
	}

	// A new node: nothing local, restores step 150.
	dir2 := filepath.Join(t.TempDir(), "ckpt")
	log2 := &eventLog{}
	m2 := New(testConfig(t, dir2, log2), store)
	r, err := m2.Restore(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.Step != 150 || r.Local || r.Dir != filepath.Join(dir2, StepName(150)) {
		t.Fatalf("restored %+v", r)
	}
	sameTree(t, r.Dir, stepFiles(150))
	if ents, _ := os.ReadDir(dir2); len(ents) != 1 {
		t.Errorf("restore left %d entries in the dir, want step-150 only", len(ents))
	}
	st2, _ := m2.Status()
	if st2.RestoredStep != 150 || st2.RestoreMiBps <= 0 || st2.LastStep != 150 {
		t.Errorf("status after restore = %+v", st2)
	}
	// The node already has it: nothing downloaded.
	r, err = m2.Restore(context.Background())
	if err != nil || r.Step != 150 || !r.Local {
		t.Fatalf("second restore = %+v, %v", r, err)
	}
}

func TestFileStoreRoundTrip(t *testing.T) {
	s, _ := fileStore(t)
	storeRoundTrip(t, s)
}

// failingStore fails every Put of a key containing failOn after the first
// n bytes have gone through, the way a killed agent or a dropped
// connection cuts an upload short.
type failingStore struct {
	Store
	mu     sync.Mutex
	failOn string
	puts   []string
}

func (f *failingStore) Put(ctx context.Context, key string, r io.Reader, size int64, md5 []byte) error {
	f.mu.Lock()
	f.puts = append(f.puts, key)
	fail := f.failOn != "" && strings.Contains(key, f.failOn)
	f.mu.Unlock()
	if fail {
		_, _ = io.CopyN(io.Discard, r, size/2)
		return &StoreError{Op: "write", Key: key, Kind: KindUnreachable, Err: errors.New("connection reset (test)")}
	}
	return f.Store.Put(ctx, key, r, size, md5)
}

func (f *failingStore) putKeys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.puts)
}

func TestInterruptedUploadNeverLatestAndResumes(t *testing.T) {
	base, _ := fileStore(t)
	dir := filepath.Join(t.TempDir(), "ckpt")
	writeStep(t, dir, 100, stepFiles(100))
	log := &eventLog{}
	cfg := testConfig(t, dir, log)
	cfg.Parallel = 1
	if err := New(cfg, base).Upload(context.Background(), LocalStep{Step: 100, Dir: filepath.Join(dir, StepName(100))}); err != nil {
		t.Fatal(err)
	}
	writeStep(t, dir, 200, stepFiles(200))
	fs := &failingStore{Store: base, failOn: "shard-0"}
	err := New(cfg, fs).Upload(context.Background(), LocalStep{Step: 200, Dir: filepath.Join(dir, StepName(200))})
	if err == nil || ErrorKind(err) != KindUnreachable {
		t.Fatalf("upload error = %v, want unreachable", err)
	}
	keys := storeKeys(t, base)
	if slices.Contains(keys, ManifestKey(200)) {
		t.Fatalf("an interrupted upload wrote its manifest: %v", keys)
	}
	if !slices.Contains(keys, DataKey(200, "meta.json")) {
		t.Fatalf("the files before the failure are not in the store: %v", keys)
	}
	// Another node restores the previous complete checkpoint.
	r, err := New(testConfig(t, filepath.Join(t.TempDir(), "c"), &eventLog{}), base).Restore(context.Background())
	if err != nil || r.Step != 100 {
		t.Fatalf("restore during the interrupted upload = %+v, %v; want step 100", r, err)
	}
	// The restarted agent resumes: what is in already is not sent again.
	fs2 := &failingStore{Store: base}
	if err := New(cfg, fs2).Upload(context.Background(), LocalStep{Step: 200, Dir: filepath.Join(dir, StepName(200))}); err != nil {
		t.Fatal(err)
	}
	puts := fs2.putKeys()
	if slices.Contains(puts, DataKey(200, "meta.json")) || !slices.Contains(puts, DataKey(200, "optim/shard-0.bin")) || puts[len(puts)-1] != ManifestKey(200) {
		t.Fatalf("resumed upload put %v: want the missing files, then the manifest last", puts)
	}
	r, err = New(testConfig(t, filepath.Join(t.TempDir(), "c"), &eventLog{}), base).Restore(context.Background())
	if err != nil || r.Step != 200 {
		t.Fatalf("restore after the resumed upload = %+v, %v", r, err)
	}
	sameTree(t, r.Dir, stepFiles(200))
}

func TestCorruptCheckpointFallsBack(t *testing.T) {
	s, root := fileStore(t)
	dir := filepath.Join(t.TempDir(), "ckpt")
	cfg := testConfig(t, dir, &eventLog{})
	cfg.Keep = 3
	m := New(cfg, s)
	for _, step := range []int64{100, 200, 300} {
		writeStep(t, dir, step, stepFiles(step))
		if err := m.Upload(context.Background(), LocalStep{Step: step, Dir: filepath.Join(dir, StepName(step))}); err != nil {
			t.Fatal(err)
		}
	}
	// Step 300: one byte flipped, same size. Step 200: a file gone.
	obj := filepath.Join(root, filepath.FromSlash(DataKey(300, "model.pt")))
	b, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	b[1000] ^= 0xff
	if err := os.WriteFile(obj, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, filepath.FromSlash(DataKey(200, "optim/shard-0.bin")))); err != nil {
		t.Fatal(err)
	}
	log := &eventLog{}
	dir2 := filepath.Join(t.TempDir(), "ckpt")
	r, err := New(testConfig(t, dir2, log), s).Restore(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.Step != 100 || !slices.Equal(r.Skipped, []int64{300, 200}) {
		t.Fatalf("restored %+v, want step 100 after skipping 300 and 200", r)
	}
	sameTree(t, r.Dir, stepFiles(100))
	if !log.has(EventCorrupt, 300) || !log.has(EventCorrupt, 200) || !log.has(EventRestored, 100) {
		t.Fatalf("events %v", log.kinds())
	}
	ents, _ := os.ReadDir(dir2)
	if len(ents) != 1 {
		t.Fatalf("the failed restores left files behind: %d entries", len(ents))
	}
	// A corrupt manifest is skipped the same way.
	if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(ManifestKey(100))), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err = New(testConfig(t, filepath.Join(t.TempDir(), "c"), &eventLog{}), s).Restore(context.Background())
	if !errors.Is(err, ErrNoCheckpoint) || len(r.Skipped) != 3 {
		t.Fatalf("restore with every checkpoint corrupt = %+v, %v", r, err)
	}
}

func TestLocalOnlyPrunes(t *testing.T) {
	dir := t.TempDir()
	m := New(testConfig(t, dir, &eventLog{}), nil)
	runManager(t, m)
	for _, step := range []int64{1, 2, 3} {
		writeStep(t, dir, step, map[string][]byte{"w": {byte(step)}})
	}
	waitFor(t, 5*time.Second, "step-1 pruned", func() bool {
		_, err := os.Stat(filepath.Join(dir, StepName(1)))
		return errors.Is(err, os.ErrNotExist)
	})
	local, _ := LocalSteps(dir)
	if len(local) != 2 || local[0].Step != 3 {
		t.Fatalf("local steps %+v", local)
	}
}

func TestMissingFileStore(t *testing.T) {
	_, err := OpenBucket(context.Background(), "file://"+filepath.Join(t.TempDir(), "not-mounted"))
	if ErrorKind(err) != KindNotFound {
		t.Fatalf("err = %v (kind %s), want not-found", err, ErrorKind(err))
	}
}

// unreachableStore answers every call like a store nobody listens for.
func TestUnreachableStoreKeepsLocal(t *testing.T) {
	dir := t.TempDir()
	signer := &funcSigner{err: &StoreError{Op: "list", Kind: KindUnreachable, Err: errors.New("dial tcp 127.0.0.1:1: connection refused")}}
	log := &eventLog{}
	m := New(testConfig(t, dir, log), NewSignedStore(signer, nil, "s3://b/p"))
	runManager(t, m)
	for _, step := range []int64{1, 2, 3} {
		writeStep(t, dir, step, map[string][]byte{"w": {byte(step)}})
	}
	waitFor(t, 5*time.Second, "a reported failure", func() bool { return log.has(EventUploadFailed, 3) })
	st, _ := m.Status()
	if st.ErrorKind != KindUnreachable || !strings.Contains(st.Error, "store unreachable") || st.LocalStep != 3 || st.LastStep != -1 {
		t.Fatalf("status %+v", st)
	}
	if local, _ := LocalSteps(dir); len(local) != 3 {
		t.Fatalf("local checkpoints were deleted while the store is unreachable: %+v", local)
	}
}

// funcSigner fails every call with err.
type funcSigner struct{ err error }

func (f *funcSigner) Sign(context.Context, string, []string) (map[string]string, time.Time, error) {
	return nil, time.Time{}, f.err
}
func (f *funcSigner) List(context.Context, string) ([]Object, error) { return nil, f.err }
func (f *funcSigner) Delete(context.Context, []string) error         { return f.err }

func TestManifestChecks(t *testing.T) {
	good := Manifest{Format: ManifestFormat, Step: 5, Bytes: 3, Files: []FileEntry{{Path: "a/b", Size: 3, SHA256: strings.Repeat("0", 64)}}}
	for name, mod := range map[string]func(*Manifest){
		"format":    func(m *Manifest) { m.Format = "x" },
		"step":      func(m *Manifest) { m.Step = 6 },
		"escape":    func(m *Manifest) { m.Files[0].Path = "../etc/passwd" },
		"absolute":  func(m *Manifest) { m.Files[0].Path = "/etc/passwd" },
		"unclean":   func(m *Manifest) { m.Files[0].Path = "a//b" },
		"bytes":     func(m *Manifest) { m.Bytes = 4 },
		"bad sha":   func(m *Manifest) { m.Files[0].SHA256 = "abc" },
		"negative":  func(m *Manifest) { m.Files[0].Size = -1; m.Bytes = -1 },
		"backslash": func(m *Manifest) { m.Files[0].Path = `a\..\..\x` },
	} {
		m := good
		m.Files = slices.Clone(good.Files)
		mod(&m)
		b, _ := json.Marshal(m)
		if _, err := ParseManifest(b, 5); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	b, _ := json.Marshal(good)
	if _, err := ParseManifest(b, 5); err != nil {
		t.Fatal(err)
	}
}
