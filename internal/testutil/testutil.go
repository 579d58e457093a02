// Package testutil holds the small helpers tests across the module share: a
// leaf (standard library only), so any package's tests may import it,
// providers and plugins included.
package testutil

import (
	"bytes"
	"context"
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
