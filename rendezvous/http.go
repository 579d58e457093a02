package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// HTTP limits.
const (
	MaxBodyBytes     = 64 << 10
	DefaultWatchWait = 30 * time.Second
	MaxWatchWait     = 5 * time.Minute
)

// Authorizer decides whether a request may act for node of fleet (the
// daemon checks the node's bearer token). Return an error wrapping
// ErrForbidden for 403; any other error gives 401.
type Authorizer interface {
	Authorize(r *http.Request, fleet, node string) error
}

// AuthorizerFunc adapts a function to Authorizer.
type AuthorizerFunc func(r *http.Request, fleet, node string) error

// Authorize implements Authorizer.
func (f AuthorizerFunc) Authorize(r *http.Request, fleet, node string) error {
	return f(r, fleet, node)
}

// ErrorBody is every error response.
type ErrorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// Error codes in ErrorBody.
const (
	CodeBadRequest   = "bad_request"
	CodeTooLarge     = "too_large"
	CodeUnauthorized = "unauthorized"
	CodeForbidden    = "forbidden"
	CodeUnknownFleet = "unknown_fleet"
	CodeUnavailable  = "unavailable"
	CodeInternal     = "internal"
)

// Handler serves the agents' rendezvous API:
//
//	POST /v1/rendezvous/{fleet}/join       JoinRequest      → View
//	POST /v1/rendezvous/{fleet}/heartbeat  HeartbeatRequest → HeartbeatResponse
//	GET  /v1/rendezvous/{fleet}/watch?node=ID&after=ROUND&state=STATE&wait=30s → View
//	POST /v1/rendezvous/{fleet}/leave      LeaveRequest     → 204
func (s *Service) Handler(auth Authorizer) http.Handler {
	if auth == nil {
		panic("rendezvous: Handler needs an Authorizer")
	}
	h := &handler{s: s, auth: auth}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/rendezvous/{fleet}/join", serveNode(h, s.Join))
	mux.HandleFunc("POST /v1/rendezvous/{fleet}/heartbeat", serveNode(h, s.Heartbeat))
	mux.HandleFunc("GET /v1/rendezvous/{fleet}/watch", h.watch)
	mux.HandleFunc("POST /v1/rendezvous/{fleet}/leave", h.leave)
	return mux
}

type handler struct {
	s    *Service
	auth Authorizer
}

// nodeRequest is a node's POST body: it names the node and checks itself.
type nodeRequest interface {
	Validate() error
	node() string
}

// serveNode answers a node's POST: it decodes and checks the body,
// authorizes its node in the path's fleet and answers what call returns.
func serveNode[Req nodeRequest, Resp any](h *handler, call func(context.Context, string, Req) (Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		fleet := r.PathValue("fleet")
		if !decode(w, r, &req) || !valid(w, req.Validate()) || !h.authorize(w, r, fleet, req.node()) {
			return
		}
		resp, err := call(r.Context(), fleet, req)
		if err != nil {
			fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, resp)
	}
}

func (h *handler) leave(w http.ResponseWriter, r *http.Request) {
	var req LeaveRequest
	fleet := r.PathValue("fleet")
	if !decode(w, r, &req) {
		return
	}
	var err error
	if !validID(req.NodeID) {
		err = errors.New("node_id is missing or invalid")
	}
	if !valid(w, err) || !h.authorize(w, r, fleet, req.NodeID) {
		return
	}
	if err := h.s.Leave(r.Context(), fleet, req.NodeID); err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) watch(w http.ResponseWriter, r *http.Request) {
	fleet := r.PathValue("fleet")
	q := r.URL.Query()
	node := q.Get("node")
	last, wait, err := parseWatch(q.Get("after"), q.Get("state"), q.Get("wait"))
	if err == nil && !validID(node) {
		err = errors.New("node is missing or invalid")
	}
	if !valid(w, err) || !h.authorize(w, r, fleet, node) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	last.MasterListening = q.Get("listening") == "true"
	v, err := h.s.Watch(ctx, fleet, node, last)
	for err == nil && !q.Has("listening") && v.Round == last.Round && v.State == last.State {
		// A client without the listening parameter predates it: only a
		// round or state change is news to it.
		last.MasterListening = v.MasterListening
		v, err = h.s.Watch(ctx, fleet, node, last)
	}
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		// Nothing new within wait: the unchanged view tells the client
		// to poll again.
	case r.Context().Err() != nil:
		// The client is gone: its node may be (see OnWatcherGone).
		if h.s.watchGone != nil && !h.s.closed.Load() {
			h.s.watchGone(fleet, node)
		}
		return
	default:
		fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// parseWatch reads the view the agent holds (after = its round, state =
// its node state, assigned by default) and the long-poll duration.
func parseWatch(after, state, wait string) (View, time.Duration, error) {
	var last View
	if after != "" {
		n, err := strconv.Atoi(after)
		if err != nil || n < 0 {
			return last, 0, fmt.Errorf("after must be a round number, got %q", after)
		}
		last.Round = n
	}
	last.State = NodeAssigned
	if state != "" {
		last.State = NodeState(state)
		if !last.State.valid() {
			return last, 0, fmt.Errorf("unknown state %q", state)
		}
	}
	d := DefaultWatchWait
	if wait != "" {
		var err error
		if d, err = time.ParseDuration(wait); err != nil || d < 0 || d > MaxWatchWait {
			return last, 0, fmt.Errorf("wait must be a duration between 0s and %s, got %q", MaxWatchWait, wait)
		}
	}
	return last, d, nil
}

func (h *handler) authorize(w http.ResponseWriter, r *http.Request, fleet, node string) bool {
	err := h.auth.Authorize(r, fleet, node)
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrForbidden):
		writeError(w, http.StatusForbidden, CodeForbidden, err)
	default:
		w.Header().Set("WWW-Authenticate", `Bearer realm="fleetd"`)
		writeError(w, http.StatusUnauthorized, CodeUnauthorized, err)
	}
	return false
}

// decode reads one JSON value strictly: size-limited, unknown fields and
// trailing data rejected.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON object")
			var mbe *http.MaxBytesError
			if errors.As(terr, &mbe) {
				err = terr
			}
		}
	}
	var mbe *http.MaxBytesError
	switch {
	case err == nil:
		return true
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Errorf("request body larger than %d bytes", mbe.Limit))
	case errors.Is(err, io.EOF):
		writeError(w, http.StatusBadRequest, CodeBadRequest, errors.New("empty request body"))
	default:
		writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Errorf("invalid JSON body: %w", err))
	}
	return false
}

func valid(w http.ResponseWriter, err error) bool {
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err)
		return false
	}
	return true
}

func fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrUnknownFleet):
		writeError(w, http.StatusNotFound, CodeUnknownFleet, err)
	case errors.Is(err, ErrClosed):
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, err)
	default:
		writeError(w, http.StatusInternalServerError, CodeInternal, err)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code string, err error) {
	writeJSON(w, status, ErrorBody{Error: err.Error(), Code: code})
}
