package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// MaxBodyBytes bounds every request body; a spec larger than this is not a spec.
const MaxBodyBytes = 1 << 20

// SpecError is returned by the backend when a spec does not parse or validate.
type SpecError struct {
	Diagnostics []Diagnostic
	Rendered    string
}

func (e *SpecError) Error() string {
	n := 0
	for _, d := range e.Diagnostics {
		if d.Severity == "error" {
			n++
		}
	}
	return fmt.Sprintf("spec has %d error(s)", n)
}

// Backend is what the API needs from the daemon.
type Backend interface {
	Plan(ctx context.Context, req ApplyRequest) (Plan, error)
	Apply(ctx context.Context, req ApplyRequest) (ApplyResponse, error)
	Status(ctx context.Context) (Status, error)
	Fleet(ctx context.Context, name string) (FleetDetail, error)
	Destroy(ctx context.Context, name string) (FleetSummary, error)
	Events(ctx context.Context, since uint64, limit int) ([]state.Event, error)
	// EventsChanged returns a channel closed at the next appended event.
	EventsChanged() <-chan struct{}
}

// Role is what a credential may do on the admin API. Roles are ordered:
// each includes everything the ones below it may do.
type Role int

const (
	// RoleNone is no role: the request is refused.
	RoleNone Role = iota
	// RoleRead reads status, fleets, events, logs and metrics.
	RoleRead
	// RoleOperate also changes fleets: plan, apply, destroy, check,
	// offerings, interrupt.
	RoleOperate
	// RoleAdmin is the admin token: everything, incl. token management.
	RoleAdmin
)

func (r Role) String() string {
	switch r {
	case RoleRead:
		return "read"
	case RoleOperate:
		return "operate"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// ParseRole parses the role of a scoped token ("read" or "operate"); the
// admin role is not grantable.
func ParseRole(s string) (Role, error) {
	switch s {
	case "read":
		return RoleRead, nil
	case "operate":
		return RoleOperate, nil
	}
	return RoleNone, fmt.Errorf("role %q: want read or operate", s)
}

// ErrInvalidToken is what a TokenVerifier returns for a token it does not
// know (unknown, revoked, wrong secret): the request gets 401.
var ErrInvalidToken = errors.New("invalid token")

// Principal is what a request's credentials may do: a role, and for a
// token limited to a project (docs/projects.md), that project.
type Principal struct {
	Role Role
	// Project limits the token to one project's fleets; "" is every
	// project (the admin token, unlimited scoped tokens).
	Project string
}

// TokenVerifier resolves a bearer token that is not the admin token to its
// principal; ErrInvalidToken when it is not a valid scoped token.
type TokenVerifier func(ctx context.Context, token string) (Principal, error)

type principalKey struct{}

// WithPrincipal returns ctx carrying p (Require puts it there).
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// ProjectScope is the project a request's token is limited to; "" when it
// is not limited (or the request was not authorized through Require).
func ProjectScope(ctx context.Context) string {
	p, _ := ctx.Value(principalKey{}).(Principal)
	return p.Project
}

// ErrOutOfScope is what a project-limited token gets for anything outside
// its project: 403.
var ErrOutOfScope = errors.New("outside the token's project")

// ScopeError refuses a project-limited token: 403 with what it asked for.
func ScopeError(project, what string) error {
	return &AuthError{http.StatusForbidden, fmt.Errorf("%w: this token is limited to project %q; %s", ErrOutOfScope, project, what)}
}

// Server serves the HTTP API.
type Server struct {
	backend Backend
	token   []byte
	log     *slog.Logger
	mux     *http.ServeMux
	// Scoped verifies scoped (read/operate) tokens; nil means only the
	// admin token is accepted. Set it before serving.
	Scoped TokenVerifier
	// FleetProject names a fleet's project, for tokens limited to one
	// (RequireFleet, status and event filtering); an error wrapping
	// state.ErrNotFound for a fleet that does not exist. Nil: every fleet
	// is outside any project-limited token. Set it before serving.
	FleetProject func(ctx context.Context, fleet string) (string, error)
	// Extra lets other components (rendezvous, agents, metrics) mount routes
	// behind the same listener; they do their own auth.
	Extra *http.ServeMux
}

// NewServer returns a server that requires a token on every route except
// /healthz: reads need at least RoleRead, changes RoleOperate.
func NewServer(b Backend, adminToken string, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{backend: b, token: []byte(adminToken), log: log, mux: http.NewServeMux(), Extra: http.NewServeMux()}
	s.mux.HandleFunc("GET /healthz", s.healthz)
	// Project-limited tokens reach the routes below that filter or check
	// by project (RequireScoped, RequireFleet); every other route is
	// daemon-wide and refuses them (Require).
	s.mux.Handle("GET /v1/status", s.RequireScoped(RoleRead, s.status))
	// Plan and apply check the spec's projects in the backend (it parses it).
	s.mux.Handle("POST /v1/plan", s.RequireScoped(RoleOperate, s.plan))
	s.mux.Handle("POST /v1/fleets", s.RequireScoped(RoleOperate, s.apply))
	s.mux.Handle("GET /v1/fleets", s.RequireScoped(RoleRead, s.fleets))
	s.mux.Handle("GET /v1/fleets/{name}", s.RequireFleet(RoleRead, "name", s.fleet))
	s.mux.Handle("DELETE /v1/fleets/{name}", s.RequireFleet(RoleOperate, "name", s.destroy))
	s.mux.Handle("GET /v1/events", s.RequireScoped(RoleRead, s.events))
	s.mux.Handle("/", s.Extra)
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	s.mux.ServeHTTP(w, r)
}

// BearerToken extracts the bearer token of a request ("" if none).
func BearerToken(r *http.Request) string {
	h := r.Header.Get("Authorization")
	const p = "Bearer "
	if len(h) > len(p) && strings.EqualFold(h[:len(p)], p) {
		return strings.TrimSpace(h[len(p):])
	}
	return ""
}

// TokenEqual compares tokens in constant time.
func TokenEqual(got string, want []byte) bool {
	return len(want) > 0 && subtle.ConstantTimeCompare([]byte(got), want) == 1
}

// AuthError is an authentication (401) or authorization (403) failure.
type AuthError struct {
	Status int
	Err    error
}

func (e *AuthError) Error() string { return e.Err.Error() }
func (e *AuthError) Unwrap() error { return e.Err }

// Authorize returns the principal of the request's bearer token. The
// admin token is checked first; anything else goes to the scoped verifier.
func (s *Server) Authorize(r *http.Request) (Principal, error) {
	tok := BearerToken(r)
	if tok == "" {
		return Principal{}, &AuthError{http.StatusUnauthorized, errors.New("missing bearer token (set FLEETD_TOKEN)")}
	}
	if TokenEqual(tok, s.token) {
		return Principal{Role: RoleAdmin}, nil
	}
	if s.Scoped != nil {
		p, err := s.Scoped(r.Context(), tok)
		switch {
		case err == nil:
			return p, nil
		case !errors.Is(err, ErrInvalidToken):
			// The store could not be read: not the caller's fault, and
			// not a reason to answer 401 (clients would drop the token).
			return Principal{}, &AuthError{http.StatusServiceUnavailable, fmt.Errorf("verify token: %w", err)}
		}
	}
	return Principal{}, &AuthError{http.StatusUnauthorized, ErrInvalidToken}
}

// Require wraps h so that only a token with at least role reaches it: 401
// for a missing or unknown token, 403 for a valid token with a lower role
// and for a token limited to a project (the route is daemon-wide).
func (s *Server) Require(role Role, h http.HandlerFunc) http.Handler {
	return s.require(role, func(p Principal, r *http.Request) error {
		if p.Project != "" {
			return ScopeError(p.Project, fmt.Sprintf("%s %s is daemon-wide and needs a token not limited to a project", r.Method, r.URL.Path))
		}
		return nil
	}, h)
}

// RequireScoped is Require for a route that serves project-limited tokens
// itself: it filters what it shows, or checks what it changes, by
// ProjectScope(r.Context()).
func (s *Server) RequireScoped(role Role, h http.HandlerFunc) http.Handler {
	return s.require(role, nil, h)
}

// RequireFleet is Require for a route naming a fleet in the path value
// param: a project-limited token reaches it only for its project's
// fleets (a fleet that does not exist is left to h: 404).
func (s *Server) RequireFleet(role Role, param string, h http.HandlerFunc) http.Handler {
	return s.require(role, func(p Principal, r *http.Request) error {
		if p.Project == "" {
			return nil
		}
		name := r.PathValue(param)
		if s.FleetProject == nil {
			return ScopeError(p.Project, fmt.Sprintf("fleet %q is not in it", name))
		}
		proj, err := s.FleetProject(r.Context(), name)
		switch {
		case errors.Is(err, state.ErrNotFound):
			return nil
		case err != nil:
			return &AuthError{http.StatusServiceUnavailable, fmt.Errorf("fleet %q: %w", name, err)}
		case proj == "":
			return ScopeError(p.Project, fmt.Sprintf("fleet %q's stored spec cannot be read, so its project is unknown", name))
		case proj != p.Project:
			return ScopeError(p.Project, fmt.Sprintf("fleet %q is in project %q", name, proj))
		}
		return nil
	}, h)
}

func (s *Server) require(role Role, scope func(Principal, *http.Request) error, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, err := s.Authorize(r)
		if err == nil && got.Role < role {
			err = &AuthError{http.StatusForbidden, fmt.Errorf("a %s token may not do this (needs %s)", got.Role, role)}
		}
		if err == nil && scope != nil {
			err = scope(got, r)
		}
		if err != nil {
			WriteAuthError(w, err)
			return
		}
		h(w, r.WithContext(WithPrincipal(r.Context(), got)))
	})
}

// InScope reports whether fleet is visible to the request's token: always
// for a token not limited to a project.
func (s *Server) InScope(ctx context.Context, fleet string) bool {
	proj := ProjectScope(ctx)
	if proj == "" {
		return true
	}
	if s.FleetProject == nil {
		return false
	}
	got, err := s.FleetProject(ctx, fleet)
	return err == nil && got == proj
}

// WriteAuthError writes an AuthError (any other error is a 401).
func WriteAuthError(w http.ResponseWriter, err error) {
	status := http.StatusUnauthorized
	var ae *AuthError
	if errors.As(err, &ae) {
		status = ae.Status
	}
	if status == http.StatusUnauthorized {
		if errors.Is(err, ErrInvalidToken) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fleetd", error="invalid_token"`)
		} else {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fleetd"`)
		}
	}
	WriteError(w, status, err)
}

// WriteJSON writes v with the given status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// WriteError writes an Error body.
func WriteError(w http.ResponseWriter, status int, err error) {
	WriteJSON(w, status, Error{Error: err.Error()})
}

// WriteSpecError answers a request whose spec did not parse: 422 with the
// diagnostics for a *SpecError, else 400.
func WriteSpecError(w http.ResponseWriter, err error) {
	var se *SpecError
	if errors.As(err, &se) {
		WriteJSON(w, http.StatusUnprocessableEntity, Error{Error: se.Error(), Diagnostics: se.Diagnostics, Rendered: se.Rendered})
		return
	}
	WriteError(w, http.StatusBadRequest, err)
}

// WriteFailure answers a failed agent or operator call: 404 when the state
// does not hold what it names, else 500, logged.
func WriteFailure(w http.ResponseWriter, log *slog.Logger, err error) {
	switch {
	case errors.Is(err, state.ErrNotFound):
		WriteError(w, http.StatusNotFound, err)
	default:
		log.Error("agent api", "err", err)
		WriteError(w, http.StatusInternalServerError, err)
	}
}

// DecodeBody decodes a JSON body strictly, mapping an oversized body to 413.
func DecodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			WriteError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("request body larger than %d bytes", mbe.Limit))
			return false
		}
		WriteError(w, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %w", err))
		return false
	}
	if dec.More() {
		WriteError(w, http.StatusBadRequest, errors.New("invalid JSON body: trailing data"))
		return false
	}
	return true
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var se *SpecError
	var pe *PreflightError
	var ue *UnreachableError
	var ne *NoAgentError
	var ae *AuthError
	switch {
	case errors.As(err, &ae):
		WriteAuthError(w, ae)
	case errors.As(err, &ue):
		WriteError(w, http.StatusUnprocessableEntity, ue)
	case errors.As(err, &ne):
		WriteError(w, http.StatusUnprocessableEntity, ne)
	case errors.As(err, &pe):
		WriteJSON(w, http.StatusPreconditionFailed, Error{Error: pe.Error(), Preflight: &pe.Report})
	case errors.As(err, &se):
		WriteSpecError(w, se)
	case errors.Is(err, state.ErrNotFound):
		WriteError(w, http.StatusNotFound, err)
	case providers.IsAuth(err):
		// The daemon's cloud credentials failed, not the caller's token:
		// 424, so no client mistakes it for its own 401.
		WriteError(w, http.StatusFailedDependency, err)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		WriteError(w, http.StatusServiceUnavailable, err)
	default:
		s.log.Error("api request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		WriteError(w, http.StatusInternalServerError, err)
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// reply answers with v, or with err as fail maps it.
func (s *Server) reply(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	WriteJSON(w, http.StatusOK, v)
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	st, err := s.backend.Status(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	st.Fleets = s.scopeFleets(r.Context(), st.Fleets)
	WriteJSON(w, http.StatusOK, st)
}

// scopeFleets keeps the fleets a project-limited token may see.
func (s *Server) scopeFleets(ctx context.Context, fleets []FleetSummary) []FleetSummary {
	proj := ProjectScope(ctx)
	if proj == "" {
		return fleets
	}
	out := []FleetSummary{}
	for _, f := range fleets {
		if f.Project == proj {
			out = append(out, f)
		}
	}
	return out
}

func (s *Server) plan(w http.ResponseWriter, r *http.Request)  { serveSpec(s, w, r, s.backend.Plan) }
func (s *Server) apply(w http.ResponseWriter, r *http.Request) { serveSpec(s, w, r, s.backend.Apply) }

// serveSpec decodes a posted spec and answers with what call makes of it.
func serveSpec[T any](s *Server, w http.ResponseWriter, r *http.Request, call func(context.Context, ApplyRequest) (T, error)) {
	var req ApplyRequest
	if !DecodeBody(w, r, &req) {
		return
	}
	v, err := call(r.Context(), req)
	s.reply(w, r, v, err)
}

func (s *Server) fleets(w http.ResponseWriter, r *http.Request) {
	st, err := s.backend.Status(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	WriteJSON(w, http.StatusOK, s.scopeFleets(r.Context(), st.Fleets))
}

func (s *Server) fleet(w http.ResponseWriter, r *http.Request) {
	d, err := s.backend.Fleet(r.Context(), r.PathValue("name"))
	s.reply(w, r, d, err)
}

func (s *Server) destroy(w http.ResponseWriter, r *http.Request) {
	f, err := s.backend.Destroy(r.Context(), r.PathValue("name"))
	s.reply(w, r, f, err)
}

// events serves GET /v1/events?since=N&limit=L&wait=D. With wait, the call
// long-polls until an event after `since` exists or D passes, so followers
// (`fleetd events -f`) do not busy-poll.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var since uint64
	if v := q.Get("since"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			WriteError(w, http.StatusBadRequest, fmt.Errorf("since: %w", err))
			return
		}
		since = n
	}
	limit := 1000
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > 10000 {
			WriteError(w, http.StatusBadRequest, errors.New("limit must be 1..10000"))
			return
		}
		limit = n
	}
	var wait time.Duration
	if v := q.Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > 5*time.Minute {
			WriteError(w, http.StatusBadRequest, errors.New("wait must be a duration up to 5m"))
			return
		}
		wait = d
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		// Subscribe before reading so an event appended in between is not missed.
		changed := s.backend.EventsChanged()
		evs, err := s.backend.Events(r.Context(), since, limit)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		next := since
		if len(evs) > 0 {
			next = evs[len(evs)-1].Seq
		}
		if proj := ProjectScope(r.Context()); proj != "" {
			// Only the project's fleets' events; daemon-wide ones (tokens,
			// cluster) and other projects' are not the token's to see.
			// Next still passes the events left out.
			evs = s.scopeEvents(r.Context(), evs)
			if len(evs) == 0 && next > since && wait > 0 {
				since = next
				select {
				case <-deadline.C:
					wait = 0
				default:
				}
				continue
			}
		}
		if len(evs) > 0 || wait == 0 {
			if evs == nil {
				evs = []state.Event{}
			}
			WriteJSON(w, http.StatusOK, EventsResponse{Events: evs, Next: next})
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			wait = 0
		case <-r.Context().Done():
			return
		}
	}
}

// scopeEvents keeps the events of fleets in the request's project.
func (s *Server) scopeEvents(ctx context.Context, evs []state.Event) []state.Event {
	in := map[string]bool{}
	out := evs[:0:0]
	for _, e := range evs {
		if e.Fleet == "" {
			continue
		}
		ok, seen := in[e.Fleet]
		if !seen {
			ok = s.InScope(ctx, e.Fleet)
			in[e.Fleet] = ok
		}
		if ok {
			out = append(out, e)
		}
	}
	return out
}

// ReadAllLimited reads at most n bytes of r (used by the client for error bodies).
func ReadAllLimited(r io.Reader, n int64) ([]byte, error) { return io.ReadAll(io.LimitReader(r, n)) }
