// Package imdsfake is an AWS EC2 instance metadata service (IMDSv2 only)
// speaking the real wire format: the token flow, the notice endpoints and
// the identity paths fleetd reads. The local provider runs one per node;
// tests use it as the in-repo IMDS fake.
//
// It deliberately shares no types with the client in interruption/imds, so
// a misunderstanding of the format cannot hide on both sides at once.
package imdsfake

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Wire constants of IMDSv2.
const (
	HeaderTokenTTL = "X-aws-ec2-metadata-token-ttl-seconds"
	HeaderToken    = "X-aws-ec2-metadata-token"
	MaxTokenTTL    = 21600 // seconds
	// MaintenanceTimeLayout is the date layout of scheduled events.
	MaintenanceTimeLayout = "2 Jan 2006 15:04:05 GMT"
)

// maxTokens bounds the token table: a client that requests a token per
// call must not grow the fake without limit.
const maxTokens = 4096

// Identity is the static metadata of one instance.
type Identity struct {
	InstanceID       string
	InstanceType     string
	AvailabilityZone string
	Region           string
	LifeCycle        string // "spot" or "on-demand"
	LocalIPv4        string
	AccountID        string
	ImageID          string
	PendingTime      time.Time
}

// ScheduledEvent is one entry of events/maintenance/scheduled.
type ScheduledEvent struct {
	Code              string
	Description       string
	EventID           string
	State             string // active, completed, canceled
	NotBefore         time.Time
	NotAfter          time.Time
	NotBeforeDeadline time.Time // optional
}

// Server serves IMDS for one instance. Create it with New; it is an
// http.Handler and safe for concurrent use.
type Server struct {
	// Now is the clock used for token expiry; default time.Now. Set it
	// before serving.
	Now func() time.Time

	mu        sync.Mutex
	id        Identity
	userData  []byte
	tokens    map[string]time.Time // token -> expiry
	action    string
	actionAt  time.Time
	rebalance time.Time
	events    []ScheduledEvent
}

// New returns a server for the given instance.
func New(id Identity, userData []byte) *Server {
	return &Server{id: id, userData: append([]byte(nil), userData...), tokens: map[string]time.Time{}}
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// SetSpotAction makes spot/instance-action return {"action","time"}.
// action is terminate, stop or hibernate.
func (s *Server) SetSpotAction(action string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.action, s.actionAt = action, at.UTC().Truncate(time.Second)
}

// ClearSpotAction makes spot/instance-action 404 again.
func (s *Server) ClearSpotAction() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.action, s.actionAt = "", time.Time{}
}

// SetRebalance makes events/recommendations/rebalance return noticeTime.
func (s *Server) SetRebalance(noticeTime time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rebalance = noticeTime.UTC().Truncate(time.Second)
}

// SetScheduledEvents replaces the list served at events/maintenance/scheduled.
func (s *Server) SetScheduledEvents(evs []ScheduledEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append([]ScheduledEvent(nil), evs...)
}

// ServeHTTP implements the IMDS paths.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/latest/api/token" {
		s.serveToken(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "405 - Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	if !s.validToken(r.Header.Get(HeaderToken)) {
		// Missing, unknown and expired tokens look the same, as on AWS.
		http.Error(w, "401 - Unauthorized", http.StatusUnauthorized)
		return
	}
	body, ok := s.lookup(r.URL.Path)
	if !ok {
		notFound(w)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
}

func notFound(w http.ResponseWriter) {
	// Real IMDS answers 404 with this XHTML page.
	w.Header().Set("Content-Type", "text/html")
	w.WriteHeader(http.StatusNotFound)
	_, _ = fmt.Fprint(w, `<?xml version="1.0" encoding="iso-8859-1"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"
	"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">
<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">
 <head>
  <title>404 - Not Found</title>
 </head>
 <body>
  <h1>404 - Not Found</h1>
 </body>
</html>
`)
}

func (s *Server) serveToken(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut {
		w.Header().Set("Allow", "PUT")
		http.Error(w, "405 - Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	// IMDS refuses token requests that went through a proxy.
	if r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "403 - Forbidden", http.StatusForbidden)
		return
	}
	ttl, err := strconv.Atoi(strings.TrimSpace(r.Header.Get(HeaderTokenTTL)))
	if err != nil || ttl < 1 || ttl > MaxTokenTTL {
		http.Error(w, "400 - Bad Request", http.StatusBadRequest)
		return
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	tok := base64.RawURLEncoding.EncodeToString(b[:])
	now := s.now()

	s.mu.Lock()
	for t, exp := range s.tokens {
		if !now.Before(exp) {
			delete(s.tokens, t)
		}
	}
	if len(s.tokens) >= maxTokens {
		s.evictOldestLocked()
	}
	s.tokens[tok] = now.Add(time.Duration(ttl) * time.Second)
	s.mu.Unlock()

	w.Header().Set(HeaderTokenTTL, strconv.Itoa(ttl))
	w.Header().Set("Content-Type", "text/plain")
	_, _ = fmt.Fprint(w, tok)
}

func (s *Server) evictOldestLocked() {
	var oldest string
	var at time.Time
	for t, exp := range s.tokens {
		if oldest == "" || exp.Before(at) {
			oldest, at = t, exp
		}
	}
	delete(s.tokens, oldest)
}

func (s *Server) validToken(tok string) bool {
	if tok == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.tokens[tok]
	return ok && s.now().Before(exp)
}

func (s *Server) lookup(path string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.id
	region := id.Region
	if region == "" {
		region = strings.TrimRight(id.AvailabilityZone, "abcdefghijklmnopqrstuvwxyz")
	}
	switch path {
	case "/latest/meta-data/spot/instance-action":
		if s.action == "" {
			return nil, false
		}
		return mustJSON(map[string]string{"action": s.action, "time": s.actionAt.Format(time.RFC3339)}), true
	case "/latest/meta-data/spot/termination-time":
		// Legacy path, still served by AWS next to instance-action.
		if s.action == "" {
			return nil, false
		}
		return []byte(s.actionAt.Format(time.RFC3339)), true
	case "/latest/meta-data/events/recommendations/rebalance":
		if s.rebalance.IsZero() {
			return nil, false
		}
		return mustJSON(map[string]string{"noticeTime": s.rebalance.Format(time.RFC3339)}), true
	case "/latest/meta-data/events/maintenance/scheduled":
		out := make([]map[string]string, 0, len(s.events))
		for _, e := range s.events {
			m := map[string]string{
				"Code": e.Code, "Description": e.Description, "EventId": e.EventID, "State": e.State,
				"NotBefore": e.NotBefore.UTC().Format(MaintenanceTimeLayout),
				"NotAfter":  e.NotAfter.UTC().Format(MaintenanceTimeLayout),
			}
			if !e.NotBeforeDeadline.IsZero() {
				m["NotBeforeDeadline"] = e.NotBeforeDeadline.UTC().Format(MaintenanceTimeLayout)
			}
			out = append(out, m)
		}
		return mustJSON(out), true
	case "/latest/meta-data/instance-id":
		return []byte(id.InstanceID), true
	case "/latest/meta-data/instance-type":
		return []byte(id.InstanceType), true
	case "/latest/meta-data/instance-life-cycle":
		return []byte(id.LifeCycle), true
	case "/latest/meta-data/placement/availability-zone":
		return []byte(id.AvailabilityZone), true
	case "/latest/meta-data/placement/region":
		return []byte(region), true
	case "/latest/meta-data/local-ipv4":
		return []byte(id.LocalIPv4), true
	case "/latest/meta-data/ami-id":
		return []byte(id.ImageID), true
	case "/latest/dynamic/instance-identity/document":
		doc := map[string]any{
			"accountId":        id.AccountID,
			"architecture":     "x86_64",
			"availabilityZone": id.AvailabilityZone,
			"imageId":          id.ImageID,
			"instanceId":       id.InstanceID,
			"instanceType":     id.InstanceType,
			"pendingTime":      id.PendingTime.UTC().Format(time.RFC3339),
			"privateIp":        id.LocalIPv4,
			"region":           region,
			"version":          "2017-09-30",
		}
		return mustJSON(doc), true
	case "/latest/user-data":
		if len(s.userData) == 0 {
			return nil, false // AWS answers 404 when no user data was given
		}
		return append([]byte(nil), s.userData...), true
	}
	return nil, false
}

func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "\t")
	if err != nil {
		panic(err) // only maps of strings are marshalled here
	}
	return b
}

// Listener is a running HTTP server for a Server (possibly wrapped in
// other handlers); URL is its base URL, http://host:port.
type Listener struct {
	URL  string
	srv  *http.Server
	done chan error
}

// Serve starts serving h on ln in the background.
func Serve(ln net.Listener, h http.Handler) *Listener {
	l := &Listener{
		URL:  "http://" + ln.Addr().String(),
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second},
		done: make(chan error, 1),
	}
	go func() {
		err := l.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		l.done <- err
	}()
	return l
}

// Close stops the server, waiting for in-flight requests until ctx ends.
func (l *Listener) Close(ctx context.Context) error {
	err := l.srv.Shutdown(ctx)
	if err != nil {
		_ = l.srv.Close()
	}
	if serveErr := <-l.done; err == nil {
		err = serveErr
	}
	return err
}

// Clock is a clock tests move by hand, for Server.Now and the clients'
// token expiry.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock that reads t until moved.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
