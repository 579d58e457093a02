package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
)

// logBackend is an in-memory event log behind the Backend interface.
type logBackend struct {
	mu      sync.Mutex
	events  []state.Event
	changed chan struct{}
	// endless makes Events invent a full page of large events after any
	// seq, for the slow-client test.
	endless bool
}

func newLogBackend() *logBackend { return &logBackend{changed: make(chan struct{})} }

func (b *logBackend) append(e state.Event) {
	b.mu.Lock()
	e.Seq = uint64(len(b.events) + 1)
	e.Time = time.Now()
	b.events = append(b.events, e)
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

func (b *logBackend) Events(ctx context.Context, since uint64, limit int) ([]state.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.endless {
		out := make([]state.Event, limit)
		for i := range out {
			out[i] = state.Event{Seq: since + uint64(i) + 1, Type: "filler", Message: strings.Repeat("x", 16<<10)}
		}
		return out, nil
	}
	var out []state.Event
	for _, e := range b.events {
		if e.Seq > since && (limit <= 0 || len(out) < limit) {
			out = append(out, e)
		}
	}
	return out, nil
}

func (b *logBackend) EventsChanged() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

var errNotHere = errors.New("not part of this test backend")

func (b *logBackend) Plan(context.Context, ApplyRequest) (Plan, error) { return Plan{}, errNotHere }
func (b *logBackend) Apply(context.Context, ApplyRequest) (ApplyResponse, error) {
	return ApplyResponse{}, errNotHere
}
func (b *logBackend) Status(context.Context) (Status, error) { return Status{}, errNotHere }
func (b *logBackend) Fleet(context.Context, string) (FleetDetail, error) {
	return FleetDetail{}, errNotHere
}
func (b *logBackend) Destroy(context.Context, string) (FleetSummary, error) {
	return FleetSummary{}, errNotHere
}

const testToken = "test-token-0123456789"

func newStreamServer(t *testing.T, b *logBackend, tune func(*Stream)) (*httptest.Server, *Stream) {
	t.Helper()
	s := NewServer(b, testToken, slog.New(slog.NewTextHandler(io.Discard, nil)))
	st := s.EventStream()
	if tune != nil {
		tune(st)
	}
	s.Extra.Handle("GET /v1/events/stream", st)
	srv := httptest.NewServer(s)
	t.Cleanup(func() {
		st.Close()
		srv.Close()
	})
	return srv, st
}

// sseMessage is one parsed message of the stream.
type sseMessage struct {
	id, event, data string
	comment         string
}

// sseReader parses an SSE body the way a browser does (the subset fleetd
// sends: id, event, data, comments, retry).
type sseReader struct{ r *bufio.Reader }

func (s *sseReader) next() (sseMessage, error) {
	var m sseMessage
	seen := false
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return m, err
		}
		line = strings.TrimRight(line, "\n")
		if line == "" {
			if seen {
				return m, nil
			}
			continue
		}
		seen = true
		field, val, _ := strings.Cut(line, ":")
		val = strings.TrimPrefix(val, " ")
		switch field {
		case "":
			m.comment = val
		case "id":
			m.id = val
		case "event":
			m.event = val
		case "data":
			m.data += val
		case "retry":
		default:
			return m, fmt.Errorf("unexpected field in %q", line)
		}
	}
}

func openStream(t *testing.T, ctx context.Context, url string, header map[string]string) (*http.Response, *sseReader) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: HTTP %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q", ct)
	}
	return resp, &sseReader{r: bufio.NewReader(resp.Body)}
}

// nextEvent skips comments (heartbeats).
func nextEvent(t *testing.T, r *sseReader) sseMessage {
	t.Helper()
	for {
		m, err := r.next()
		if err != nil {
			t.Fatalf("read stream: %v", err)
		}
		if m.id != "" || m.event != "" {
			return m
		}
	}
}

func TestStreamDeliversLiveEventsAndResumes(t *testing.T) {
	b := newLogBackend()
	b.append(state.Event{Fleet: "a", Type: "fleet.applied", Message: "one"})
	b.append(state.Event{Fleet: "b", Type: "fleet.applied", Message: "two"})
	srv, _ := newStreamServer(t, b, func(s *Stream) { s.Heartbeat = 50 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, r := openStream(t, ctx, srv.URL+"/v1/events/stream?since=0", nil)
	for want := 1; want <= 2; want++ {
		m := nextEvent(t, r)
		if m.id != strconv.Itoa(want) || m.event != "fleet.applied" || !strings.Contains(m.data, `"seq":`+strconv.Itoa(want)) {
			t.Fatalf("message %d = %+v", want, m)
		}
	}
	// Live: an event appended now arrives without reconnecting, and idle
	// time brings heartbeat comments.
	go func() {
		time.Sleep(120 * time.Millisecond)
		b.append(state.Event{Fleet: "a", Node: "n1", Type: "notice", Message: "spot", Data: map[string]string{"kind": "spot-interruption"}})
	}()
	sawHeartbeat := false
	for {
		m, err := r.next()
		if err != nil {
			t.Fatal(err)
		}
		if m.comment == "heartbeat" {
			sawHeartbeat = true
			continue
		}
		if m.id != "3" || m.event != "notice" || !strings.Contains(m.data, `"kind":"spot-interruption"`) {
			t.Fatalf("live message = %+v", m)
		}
		break
	}
	if !sawHeartbeat {
		t.Error("no heartbeat comment while idle")
	}

	// Last-Event-ID (a reconnecting EventSource) wins over ?since=.
	_, r2 := openStream(t, ctx, srv.URL+"/v1/events/stream?since=0", map[string]string{"Last-Event-ID": "2"})
	if m := nextEvent(t, r2); m.id != "3" {
		t.Fatalf("resume after 2 gave %+v", m)
	}
	// ?fleet= filters.
	_, r3 := openStream(t, ctx, srv.URL+"/v1/events/stream?fleet=b", nil)
	if m := nextEvent(t, r3); m.id != "2" {
		t.Fatalf("fleet=b gave %+v", m)
	}
}

func TestStreamAuthAndLimits(t *testing.T) {
	b := newLogBackend()
	srv, st := newStreamServer(t, b, func(s *Stream) { s.MaxStreams = 1 })
	for _, tc := range []struct {
		name, auth, query string
		want              int
	}{
		{"no token", "", "", http.StatusUnauthorized},
		{"wrong token", "Bearer nope", "", http.StatusUnauthorized},
		{"bad since", "Bearer " + testToken, "?since=x", http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", srv.URL+"/v1/events/stream"+tc.query, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("HTTP %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, _ := openStream(t, ctx, srv.URL+"/v1/events/stream", nil)
	req, _ := http.NewRequest("GET", srv.URL+"/v1/events/stream", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("second stream over MaxStreams=1: HTTP %d, want 503", resp2.StatusCode)
	}
	// Close (the daemon's shutdown) ends open streams: the client sees EOF.
	st.Close()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, resp.Body)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("stream ended with %v, want a clean EOF", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stream still open after Close")
	}
}

// A client that stops reading is cut off by the write timeout instead of
// making the daemon hold its events.
func TestStreamDropsStalledClient(t *testing.T) {
	b := newLogBackend()
	b.endless = true
	srv, st := newStreamServer(t, b, func(s *Stream) { s.WriteTimeout = 200 * time.Millisecond })
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/events/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", testToken)
	// Never read: the socket buffers fill, a write blocks, the deadline fires.
	deadline := time.Now().Add(20 * time.Second)
	for st.Active() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st.Active() == 0 {
		t.Fatal("stream never started")
	}
	for st.Active() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("stalled client still holds its stream")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
