package ckpt

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Environment of the helper process TestUploadKilledNeverLatest starts.
const (
	helperEnv      = "FLEETD_CKPT_UPLOAD_HELPER"
	helperStoreEnv = "FLEETD_CKPT_HELPER_STORE"
	helperDirEnv   = "FLEETD_CKPT_HELPER_DIR"
	helperStateEnv = "FLEETD_CKPT_HELPER_STATE"
)

// slowStore paces writes so that the parent can kill the process in the
// middle of an upload.
type slowStore struct{ Store }

type slowReader struct{ r io.Reader }

func (s slowReader) Read(b []byte) (int, error) {
	time.Sleep(20 * time.Millisecond)
	return s.r.Read(b[:min(len(b), 32<<10)])
}

func (s slowStore) Put(ctx context.Context, key string, r io.Reader, size int64, md5 []byte) error {
	return s.Store.Put(ctx, key, slowReader{r}, size, md5)
}

// TestMain's helper mode: upload one step slowly, as an agent would.
func init() {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	s, err := OpenBucket(context.Background(), os.Getenv(helperStoreEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	m := New(Config{Dir: os.Getenv(helperDirEnv), Keep: 3, StateDir: os.Getenv(helperStateEnv), Parallel: 1}, slowStore{s})
	fmt.Println("uploading")
	err = m.Upload(context.Background(), LocalStep{Step: 200, Dir: filepath.Join(os.Getenv(helperDirEnv), StepName(200))})
	fmt.Println("finished", err)
	os.Exit(0)
}

// TestUploadKilledNeverLatest SIGKILLs a process in the middle of an
// upload: the store keeps the previous checkpoint as its latest, a
// restore elsewhere gets that one, and the next upload of the same step
// (a restarted agent, same journal) sends only what is missing.
func TestUploadKilledNeverLatest(t *testing.T) {
	root := t.TempDir()
	store := "file://" + root
	s, err := OpenBucket(context.Background(), store)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dir, state := filepath.Join(t.TempDir(), "ckpt"), t.TempDir()
	writeStep(t, dir, 100, stepFiles(100))
	if err := New(Config{Dir: dir, Keep: 3}, s).Upload(context.Background(), LocalStep{Step: 100, Dir: filepath.Join(dir, StepName(100))}); err != nil {
		t.Fatal(err)
	}
	files := stepFiles(200)
	files["model.pt"] = randBytes(5, 2<<20) // ~64 paced reads: seconds
	writeStep(t, dir, 200, files)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperStoreEnv+"="+store, helperDirEnv+"="+dir, helperStateEnv+"="+state)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	buf := make([]byte, 64)
	if n, _ := out.Read(buf); !strings.Contains(string(buf[:n]), "uploading") {
		t.Fatalf("helper said %q", buf[:n])
	}
	// Kill once the first files are in and model.pt is under way.
	waitFor(t, 20*time.Second, "the upload under way", func() bool {
		keys := storeKeys(t, s)
		return slices.Contains(keys, DataKey(200, "meta.json"))
	})
	time.Sleep(300 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	rest, _ := io.ReadAll(out)
	if strings.Contains(string(rest), "finished") {
		t.Fatalf("the upload finished before the kill (%s); make it slower", rest)
	}
	keys := storeKeys(t, s)
	if slices.Contains(keys, ManifestKey(200)) || slices.Contains(keys, DataKey(200, "model.pt")) {
		t.Fatalf("after the kill the store holds %v: no manifest and no half object may be there", keys)
	}
	r, err := New(Config{Dir: filepath.Join(t.TempDir(), "c"), Keep: 3}, s).Restore(context.Background())
	if err != nil || r.Step != 100 {
		t.Fatalf("restore after the kill = %+v, %v; want step 100", r, err)
	}
	// The restarted agent: same journal, only the missing files go out.
	fs := &failingStore{Store: s}
	if err := New(Config{Dir: dir, Keep: 3, StateDir: state}, fs).Upload(context.Background(), LocalStep{Step: 200, Dir: filepath.Join(dir, StepName(200))}); err != nil {
		t.Fatal(err)
	}
	puts := fs.putKeys()
	if slices.Contains(puts, DataKey(200, "meta.json")) || !slices.Contains(puts, DataKey(200, "model.pt")) {
		t.Fatalf("the resumed upload put %v", puts)
	}
	r, err = New(Config{Dir: filepath.Join(t.TempDir(), "c"), Keep: 3}, s).Restore(context.Background())
	if err != nil || r.Step != 200 {
		t.Fatalf("restore after the resumed upload = %+v, %v", r, err)
	}
	sameTree(t, r.Dir, files)
}
