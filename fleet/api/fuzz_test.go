package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/internal/testutil"
)

const fuzzToken = "fleetd_0123456789abcdef0123456789abcdef"

// fuzzBackend answers like a daemon with one fleet "train" and counts what
// reached it. The embedded interface covers methods the fuzzed routes do
// not use.
type fuzzBackend struct {
	Backend
	mu        sync.Mutex
	calls     int
	mutations int
	never     chan struct{}
}

func (b *fuzzBackend) hit(mutates bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	if mutates {
		b.mutations++
	}
}

func (b *fuzzBackend) counts() (int, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls, b.mutations
}

func specCheck(req ApplyRequest) error {
	if !strings.Contains(req.Source, `fleet "`) {
		return &SpecError{Diagnostics: []Diagnostic{{Severity: "error", Summary: "Missing fleet block", Filename: req.Filename}}, Rendered: "Error: Missing fleet block"}
	}
	return nil
}

func (b *fuzzBackend) Plan(ctx context.Context, req ApplyRequest) (Plan, error) {
	b.hit(false)
	return Plan{}, specCheck(req)
}

func (b *fuzzBackend) Apply(ctx context.Context, req ApplyRequest) (ApplyResponse, error) {
	if err := specCheck(req); err != nil {
		b.hit(false)
		return ApplyResponse{}, err
	}
	b.hit(true)
	return ApplyResponse{}, nil
}

func (b *fuzzBackend) Status(ctx context.Context) (Status, error) {
	b.hit(false)
	return Status{Fleets: []FleetSummary{{Name: "train"}}}, nil
}

func (b *fuzzBackend) Fleet(ctx context.Context, name string) (FleetDetail, error) {
	b.hit(false)
	if name != "train" {
		return FleetDetail{}, fmt.Errorf("fleet %q: %w", name, state.ErrNotFound)
	}
	return FleetDetail{FleetSummary: FleetSummary{Name: name}}, nil
}

func (b *fuzzBackend) Destroy(ctx context.Context, name string) (FleetSummary, error) {
	if name != "train" {
		b.hit(false)
		return FleetSummary{}, fmt.Errorf("fleet %q: %w", name, state.ErrNotFound)
	}
	b.hit(true)
	return FleetSummary{Name: name}, nil
}

func (b *fuzzBackend) Events(ctx context.Context, since uint64, limit int) ([]state.Event, error) {
	b.hit(false)
	if since >= 3 {
		return nil, nil
	}
	return []state.Event{{Seq: since + 1, Type: "fuzz"}}, nil
}

func (b *fuzzBackend) EventsChanged() <-chan struct{} { return b.never }

// FuzzServer sends arbitrary requests to the admin API: any route, path
// segment, query, body and Authorization header. Without the admin token
// nothing reaches the backend; a refused request (4xx) mutates nothing;
// nothing is ever a 5xx; every answer of a /v1 route is JSON; and a
// long-poll ends when its request does.
func FuzzServer(f *testing.F) {
	spec, _ := json.Marshal(ApplyRequest{Filename: "train.hcl", Source: `fleet "train" {}`})
	f.Add(uint8(0), uint8(0), "", "", spec)
	f.Add(uint8(1), uint8(0), "", "", spec)
	f.Add(uint8(1), uint8(0), "", "", []byte(`{"filename":"x","source":"fleet \"a\" {}","vars":{"a":"b"},"files":{"/etc/passwd":"x"},"env":{"HOME":"/"}}`))
	f.Add(uint8(1), uint8(0), "", "", []byte(`{"source":"x"}{"source":"y"}`))
	f.Add(uint8(1), uint8(0), "", "", []byte(`{"source":"x","unknown":1}`))
	f.Add(uint8(1), uint8(1), "", "", spec)
	f.Add(uint8(1), uint8(2), "", "", spec)
	f.Add(uint8(2), uint8(0), "", "since=0&limit=10", []byte(nil))
	f.Add(uint8(2), uint8(0), "", "since=99&wait=5m", []byte(nil))
	f.Add(uint8(2), uint8(0), "", "since=-1&limit=0&wait=-1s", []byte(nil))
	f.Add(uint8(3), uint8(0), "train", "", []byte(nil))
	f.Add(uint8(4), uint8(0), "train", "", []byte(nil))
	f.Add(uint8(4), uint8(0), "../../v1/status", "", []byte(nil))
	f.Add(uint8(5), uint8(3), "", "", []byte("Bearer "+fuzzToken+" "))
	f.Fuzz(func(t *testing.T, route, auth uint8, name, query string, body []byte) {
		b := &fuzzBackend{never: make(chan struct{})}
		s := NewServer(b, fuzzToken, nil)
		method, path := http.MethodGet, ""
		switch route % 7 {
		case 0:
			method, path = http.MethodPost, "/v1/plan"
		case 1:
			method, path = http.MethodPost, "/v1/fleets"
		case 2:
			path = "/v1/events"
		case 3:
			path = "/v1/fleets/" + url.PathEscape(name)
		case 4:
			method, path = http.MethodDelete, "/v1/fleets/"+url.PathEscape(name)
		case 5:
			path = "/v1/status"
		case 6:
			path = "/healthz"
		}
		target := "http://fleetd" + path
		if q, err := url.ParseQuery(query); err == nil && query != "" {
			target += "?" + q.Encode()
		}
		req := httptest.NewRequest(method, target, strings.NewReader(string(body)))
		switch auth % 4 {
		case 0:
			req.Header.Set("Authorization", "Bearer "+fuzzToken)
		case 1:
			req.Header.Set("Authorization", "Bearer "+fuzzToken[:len(fuzzToken)-1]+"x")
		case 2: // no header
		case 3:
			req.Header["Authorization"] = []string{string(body)}
		}
		rec := testutil.ServeWithin(t, s, req, 50*time.Millisecond)
		calls, mutations := b.counts()
		code := rec.Code
		if code >= 500 {
			t.Fatalf("%s %s: HTTP %d %s", method, target, code, rec.Body)
		}
		authorized := TokenEqual(BearerToken(req), []byte(fuzzToken))
		// A path no route matches (an empty fleet name) gets the mux's own
		// 404, and an unclean one ("..") its redirect, before any handler.
		if calls == 0 && rec.Header().Get("Content-Type") != "application/json" {
			switch code {
			case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
				return
			}
		}
		if !authorized && path != "/healthz" {
			if code != http.StatusUnauthorized {
				t.Fatalf("%s %s without the admin token: HTTP %d", method, target, code)
			}
			if calls != 0 {
				t.Fatalf("an unauthenticated request reached the backend (%d calls)", calls)
			}
		}
		if code >= 400 && mutations != 0 {
			t.Fatalf("refused request (HTTP %d) mutated the backend", code)
		}
		// The mux's own 404/405 are text; everything the API writes is JSON.
		ct := rec.Header().Get("Content-Type")
		if rec.Body.Len() > 0 && code != http.StatusNotFound && code != http.StatusMethodNotAllowed && ct != "application/json" {
			t.Fatalf("HTTP %d with Content-Type %q: %q", code, ct, rec.Body)
		}
		if ct == "application/json" && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("invalid JSON answer: %q", rec.Body)
		}
	})
}

// FuzzBearerToken: the token parsed from any Authorization header is
// trimmed, comes only from the Bearer scheme, and TokenEqual is exact.
func FuzzBearerToken(f *testing.F) {
	for _, h := range []string{"Bearer abc", "bearer  abc ", "Basic YWRtaW46YWRtaW4=", "Bearer", "Bearer ", "BEARER x y", "Bearer\tabc", ""} {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, h string) {
		r := httptest.NewRequest("GET", "http://fleetd/", nil)
		r.Header["Authorization"] = []string{h}
		tok := BearerToken(r)
		if tok == "" {
			if TokenEqual(tok, []byte(fuzzToken)) {
				t.Fatal("empty token accepted")
			}
			return
		}
		if tok != strings.TrimSpace(tok) {
			t.Fatalf("token %q not trimmed", tok)
		}
		if len(h) < 7 || !strings.EqualFold(h[:7], "Bearer ") || !strings.Contains(h, tok) {
			t.Fatalf("token %q from header %q", tok, h)
		}
		if !TokenEqual(tok, []byte(tok)) || TokenEqual(tok+"x", []byte(tok)) || len(tok) > 1 && TokenEqual(tok[1:], []byte(tok)) {
			t.Fatalf("TokenEqual is not exact for %q", tok)
		}
	})
}
