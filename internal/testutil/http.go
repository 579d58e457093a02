package testutil

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

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
