package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
)

// Stream defaults.
const (
	// DefaultStreamHeartbeat is how often an idle stream sends a comment
	// line, so proxies and clients see the connection is alive.
	DefaultStreamHeartbeat = 15 * time.Second
	// DefaultStreamWriteTimeout bounds one write to a client: a client that
	// stops reading is disconnected instead of holding events in memory.
	DefaultStreamWriteTimeout = 10 * time.Second
	// DefaultMaxStreams bounds concurrent streams per daemon.
	DefaultMaxStreams = 64
	// streamPage is how many events a stream reads from the log at once;
	// with write-then-read it is the whole per-connection buffer.
	streamPage = 256
)

// Stream serves the event log as Server-Sent Events:
// GET /v1/events/stream?since=N[&fleet=NAME]. Each event is one message
// with `id: <seq>`, `event: <type>` and `data: <the event as JSON>`; a
// reconnecting client's Last-Event-ID header resumes after that seq.
//
// A stream reads the log a page at a time and writes the page before it
// reads the next, so a connection never buffers more than one page, and a
// client that stops reading is cut off by the write timeout.
type Stream struct {
	backend Backend
	auth    func(http.HandlerFunc) http.Handler
	// inScope says whether a project-limited token may see a fleet's events.
	inScope func(ctx context.Context, fleet string) bool

	// Heartbeat, WriteTimeout and MaxStreams default to the constants above.
	Heartbeat    time.Duration
	WriteTimeout time.Duration
	MaxStreams   int

	active    atomic.Int64
	done      chan struct{}
	closeOnce sync.Once
}

// EventStream returns the SSE handler of s's backend, behind a read token
// like every other /v1 read route; a token limited to a project gets its
// project's fleets' events only. Mount it at GET /v1/events/stream and
// call Close when the HTTP server shuts down.
func (s *Server) EventStream() *Stream {
	return &Stream{backend: s.backend, auth: func(h http.HandlerFunc) http.Handler { return s.RequireScoped(RoleRead, h) },
		inScope: s.InScope, done: make(chan struct{})}
}

// Close ends every open stream; later requests get 503.
func (st *Stream) Close() { st.closeOnce.Do(func() { close(st.done) }) }

// Active is the number of open streams.
func (st *Stream) Active() int { return int(st.active.Load()) }

func (st *Stream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st.auth(st.serve).ServeHTTP(w, r)
}

func (st *Stream) heartbeat() time.Duration {
	if st.Heartbeat > 0 {
		return st.Heartbeat
	}
	return DefaultStreamHeartbeat
}

func (st *Stream) writeTimeout() time.Duration {
	if st.WriteTimeout > 0 {
		return st.WriteTimeout
	}
	return DefaultStreamWriteTimeout
}

func (st *Stream) maxStreams() int {
	if st.MaxStreams > 0 {
		return st.MaxStreams
	}
	return DefaultMaxStreams
}

// streamSince is where a stream starts: Last-Event-ID (a reconnecting
// EventSource) wins over ?since=.
func streamSince(r *http.Request) (uint64, error) {
	v := r.Header.Get("Last-Event-ID")
	src := "Last-Event-ID"
	if v == "" {
		v, src = r.URL.Query().Get("since"), "since"
	}
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", src, err)
	}
	return n, nil
}

func (st *Stream) serve(w http.ResponseWriter, r *http.Request) {
	since, err := streamSince(r)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err)
		return
	}
	fleet := r.URL.Query().Get("fleet")
	proj := ProjectScope(r.Context())
	if proj != "" && st.inScope == nil {
		WriteAuthError(w, ScopeError(proj, "this stream cannot tell fleets' projects"))
		return
	}
	scoped := proj != ""
	select {
	case <-st.done:
		WriteError(w, http.StatusServiceUnavailable, errors.New("daemon is shutting down"))
		return
	default:
	}
	if n := st.active.Add(1); n > int64(st.maxStreams()) {
		st.active.Add(-1)
		w.Header().Set("Retry-After", "5")
		WriteError(w, http.StatusServiceUnavailable, fmt.Errorf("too many event streams open (max %d)", st.maxStreams()))
		return
	}
	defer st.active.Add(-1)

	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	// The retry hint also gets the headers to the client at once.
	if !st.write(w, rc, "retry: 3000\n\n") {
		return
	}
	hb := time.NewTicker(st.heartbeat())
	defer hb.Stop()
	var buf strings.Builder
	for {
		// Subscribe before reading so an event appended in between is not missed.
		changed := st.backend.EventsChanged()
		evs, err := st.backend.Events(r.Context(), since, streamPage)
		if err != nil {
			if r.Context().Err() == nil {
				b, _ := json.Marshal(Error{Error: err.Error()})
				st.write(w, rc, "event: error\ndata: "+string(b)+"\n\n")
			}
			return
		}
		buf.Reset()
		// Per page: a fleet name destroyed and re-applied in another
		// project is judged again on the next page.
		visible := map[string]bool{}
		for _, e := range evs {
			since = e.Seq
			if fleet != "" && e.Fleet != fleet {
				continue
			}
			if scoped {
				ok, seen := visible[e.Fleet]
				if !seen {
					ok = e.Fleet != "" && st.inScope(r.Context(), e.Fleet)
					visible[e.Fleet] = ok
				}
				if !ok {
					continue
				}
			}
			writeSSE(&buf, e)
		}
		if buf.Len() > 0 && !st.write(w, rc, buf.String()) {
			return
		}
		if len(evs) == streamPage {
			continue
		}
		select {
		case <-changed:
		case <-hb.C:
			if !st.write(w, rc, ": heartbeat\n\n") {
				return
			}
		case <-r.Context().Done():
			return
		case <-st.done:
			return
		}
	}
}

// writeSSE renders one event as an SSE message.
func writeSSE(w io.Writer, e state.Event) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	// Event types are identifiers; a line break would end the field early.
	typ := strings.NewReplacer("\r", "", "\n", "").Replace(e.Type)
	fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, typ, b)
}

// write sends s and flushes it under the write timeout; false means the
// client is gone or too slow and the stream must end.
func (st *Stream) write(w http.ResponseWriter, rc *http.ResponseController, s string) bool {
	if err := rc.SetWriteDeadline(time.Now().Add(st.writeTimeout())); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return false
	}
	if _, err := io.WriteString(w, s); err != nil {
		return false
	}
	if err := rc.Flush(); err != nil {
		return false
	}
	return true
}
