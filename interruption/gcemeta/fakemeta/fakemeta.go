// Package fakemeta is a fake GCE metadata server for tests: it requires
// the Metadata-Flavor: Google request header (403 otherwise), answers
// with Metadata-Flavor and ETag headers, and honours hanging GETs
// (?wait_for_change=true&last_etag=E&timeout_sec=N) like the real one:
// a request whose last_etag differs from the current ETag returns at
// once, otherwise it blocks until the value changes or timeout_sec passes.
package fakemeta

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxWait caps a hanging GET without timeout_sec.
const MaxWait = 5 * time.Minute

// Options sets the instance identity the fake serves.
type Options struct {
	InstanceID    string // default "4520031799277581759"
	ProjectNumber string // default "123456789012"
	ProjectID     string // default "fleetd-test"
	Zone          string // default "us-central1-a"
	Name          string // default "fleetd-node-1"
	Spot          bool   // instance/scheduling/preemptible = TRUE
}

// Server is a running fake metadata server. Its methods are safe for
// concurrent use.
type Server struct {
	// URL is the server root; BaseURL() is the v1 root a client wants.
	URL string
	// Host is host:port, for GCE_METADATA_HOST.
	Host string

	srv    *httptest.Server
	closed chan struct{}

	mu       sync.Mutex
	values   map[string]*entry
	failNext int
	failCode int
	noFlavor bool
	requests int
	waiting  int
}

type entry struct {
	value   string
	version int
	changed chan struct{} // closed and replaced on every change
}

func (e *entry) etag(key string) string {
	h := sha256.Sum256([]byte(key + "\x00" + strconv.Itoa(e.version) + "\x00" + e.value))
	return hex.EncodeToString(h[:8])
}

// New starts a fake on a loopback port with the instance keys set and
// instance/preempted FALSE, instance/maintenance-event NONE.
func New(opts Options) *Server {
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&opts.InstanceID, "4520031799277581759")
	def(&opts.ProjectNumber, "123456789012")
	def(&opts.ProjectID, "fleetd-test")
	def(&opts.Zone, "us-central1-a")
	def(&opts.Name, "fleetd-node-1")
	s := &Server{values: map[string]*entry{}, closed: make(chan struct{})}
	spot := "FALSE"
	if opts.Spot {
		spot = "TRUE"
	}
	for k, v := range map[string]string{
		"instance/id":                             opts.InstanceID,
		"instance/name":                           opts.Name,
		"instance/hostname":                       opts.Name + "." + opts.Zone + ".c." + opts.ProjectID + ".internal",
		"instance/zone":                           "projects/" + opts.ProjectNumber + "/zones/" + opts.Zone,
		"instance/preempted":                      "FALSE",
		"instance/maintenance-event":              "NONE",
		"instance/scheduling/preemptible":         spot,
		"instance/scheduling/on-host-maintenance": "TERMINATE",
		"project/project-id":                      opts.ProjectID,
		"project/numeric-project-id":              opts.ProjectNumber,
	} {
		s.values[k] = &entry{value: v, changed: make(chan struct{})}
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	u, _ := url.Parse(s.URL)
	s.Host = u.Host
	return s
}

// BaseURL is the v1 root: URL + "/computeMetadata/v1/".
func (s *Server) BaseURL() string { return s.URL + "/computeMetadata/v1/" }

// Close wakes every hanging GET and shuts the server down.
func (s *Server) Close() {
	s.mu.Lock()
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	s.mu.Unlock()
	s.srv.Close()
}

// Set sets a key (e.g. "instance/preempted" to "TRUE"), changing its ETag
// and waking the hanging GETs on it.
func (s *Server) Set(key, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.values[key]
	if !ok {
		e = &entry{changed: make(chan struct{})}
		s.values[key] = e
	}
	e.value = value
	e.version++
	close(e.changed)
	e.changed = make(chan struct{})
}

// Value returns a key's value.
func (s *Server) Value(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.values[key]
	if !ok {
		return "", false
	}
	return e.value, true
}

// FailNext makes the next n requests fail with HTTP status code.
func (s *Server) FailNext(n, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext, s.failCode = n, code
}

// OmitFlavor makes responses lack the Metadata-Flavor header, as an
// impostor's would.
func (s *Server) OmitFlavor(omit bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noFlavor = omit
}

// Stats returns the number of requests served and of hanging GETs now
// waiting.
func (s *Server) Stats() (requests, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests, s.waiting
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests++
	if !s.noFlavor {
		w.Header().Set("Metadata-Flavor", "Google")
	}
	w.Header().Set("Server", "Metadata Server for VM")
	fail := 0
	if s.failNext > 0 {
		s.failNext--
		fail = s.failCode
	}
	s.mu.Unlock()

	switch {
	case r.Method != http.MethodGet:
		http.Error(w, "Method not allowed", http.StatusMethodNotAllowed)
		return
	case r.Header.Get("Metadata-Flavor") != "Google":
		http.Error(w, "Your client does not have permission to get URL "+r.URL.Path+" from this server. Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	case r.Header.Get("X-Forwarded-For") != "":
		// The real server refuses proxied requests.
		http.Error(w, "Your client does not have permission to get URL "+r.URL.Path+" from this server.", http.StatusForbidden)
		return
	case fail != 0:
		http.Error(w, http.StatusText(fail), fail)
		return
	}
	key, ok := strings.CutPrefix(r.URL.Path, "/computeMetadata/v1/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	wait := q.Get("wait_for_change") == "true"
	timeout := MaxWait
	if v := q.Get("timeout_sec"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			http.Error(w, "Invalid timeout_sec", http.StatusBadRequest)
			return
		}
		timeout = min(time.Duration(n)*time.Second, MaxWait)
	}

	s.mu.Lock()
	e, ok := s.values[key]
	if !ok {
		s.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	if wait {
		last := q.Get("last_etag")
		if last == "" || last == e.etag(key) {
			changed := e.changed
			s.waiting++
			s.mu.Unlock()
			t := time.NewTimer(timeout)
			select {
			case <-changed:
			case <-t.C:
			case <-r.Context().Done():
			case <-s.closed:
			}
			t.Stop()
			s.mu.Lock()
			s.waiting--
		}
	}
	value, etag := e.value, e.etag(key)
	s.mu.Unlock()
	w.Header().Set("ETag", etag)
	w.Header().Set("Content-Type", "application/text")
	fmt.Fprint(w, value)
}
