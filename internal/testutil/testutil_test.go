package testutil

import (
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"
)

func TestSyncBufferConcurrentWrites(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x"))
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 800 {
		t.Fatalf("%d bytes written, want 800", n)
	}
}

func TestReadJSONAndCheckModes(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := dir + "/c.json"
	if err := os.WriteFile(path, []byte(`{"step": 7}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := ReadJSON[struct{ Step int }](t, path); got.Step != 7 {
		t.Errorf("ReadJSON: step %d, want 7", got.Step)
	}
	CheckModes(t, dir, 0o700, 0o600, "c.json")
}

func TestWaitForAndServeWithin(t *testing.T) {
	n := 0
	WaitFor(t, 5*time.Second, time.Millisecond, "three polls", func() bool { n++; return n == 3 })
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // returns once the deadline ends the request
		w.WriteHeader(http.StatusTeapot)
	})
	rec := ServeWithin(t, h, httptest.NewRequest(http.MethodGet, "/", nil), 10*time.Millisecond)
	if rec.Code != http.StatusTeapot {
		t.Errorf("code %d, want %d", rec.Code, http.StatusTeapot)
	}
	if err := Context(t, time.Minute).Err(); err != nil {
		t.Errorf("fresh context already done: %v", err)
	}
}
