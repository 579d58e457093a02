// Package testutil holds the small helpers tests across the module share: a
// leaf (standard library only), so any package's tests may import it,
// providers and plugins included.
package testutil

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Context is the test's context with a deadline d, so a test stuck on a
// call fails at d rather than at the go test timeout.
func Context(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(tb.Context(), d)
	tb.Cleanup(cancel)
	return ctx
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers: a log sink for
// a daemon's or a child process's many goroutines.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// ServeWithin runs req through h with a deadline on its context and fails
// tb when h has not returned 10 s after that: a handler that ignores the
// end of its request (a hang), which a fuzzer must report as such.
func ServeWithin(tb testing.TB, h http.Handler, req *http.Request, deadline time.Duration) *httptest.ResponseRecorder {
	tb.Helper()
	ctx, cancel := context.WithTimeout(req.Context(), deadline)
	defer cancel()
	req = req.WithContext(ctx)
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(rec, req)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		tb.Fatalf("%s %s did not return after its request ended", req.Method, req.URL)
	}
	return rec
}

// CheckModes fails tb unless dir has permissions dirMode and each named
// file in it fileMode: what a daemon's data directory must show, since it
// holds tokens and keys.
func CheckModes(tb testing.TB, dir string, dirMode, fileMode fs.FileMode, names ...string) {
	tb.Helper()
	fi, err := os.Stat(dir)
	if err != nil {
		tb.Fatal(err)
	}
	if m := fi.Mode().Perm(); m != dirMode {
		tb.Errorf("data dir mode %o, want %o", m, dirMode)
	}
	for _, name := range names {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			tb.Fatal(err)
		}
		if m := fi.Mode().Perm(); m != fileMode {
			tb.Errorf("%s mode %o, want %o", name, m, fileMode)
		}
	}
}

// WaitFor polls cond every interval until it holds, failing tb when it
// still does not after timeout; what names the awaited condition.
func WaitFor(tb testing.TB, timeout, interval time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
}

// ReadJSON decodes the JSON file at path into a T, failing tb when the file
// cannot be read or decoded.
func ReadJSON[T any](tb testing.TB, path string) T {
	tb.Helper()
	var v T
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	if err != nil {
		tb.Fatalf("%s: %v", filepath.Base(path), err)
	}
	return v
}
