package imds

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers/local/imdsfake"
)

// fakeIMDS is an imdsfake server behind a swappable handler that counts
// token requests.
type fakeIMDS struct {
	ts   *httptest.Server
	clk  *imdsfake.Clock
	puts atomic.Int32
	mu   sync.Mutex
	srv  *imdsfake.Server
}

func newFake(t *testing.T) *fakeIMDS {
	t.Helper()
	f := &fakeIMDS{clk: imdsfake.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))}
	f.restart()
	f.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			f.puts.Add(1)
		}
		f.mu.Lock()
		s := f.srv
		f.mu.Unlock()
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(f.ts.Close)
	return f
}

// restart replaces the server, forgetting every token it issued, as a
// rebooted metadata service would.
func (f *fakeIMDS) restart() *imdsfake.Server {
	s := imdsfake.New(imdsfake.Identity{InstanceID: "i-0abc", AvailabilityZone: "local-a", LifeCycle: "spot"}, nil)
	s.Now = f.clk.Now
	f.mu.Lock()
	f.srv = s
	f.mu.Unlock()
	return s
}

func (f *fakeIMDS) server() *imdsfake.Server {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.srv
}

func (f *fakeIMDS) client(t *testing.T, ttl time.Duration) *Client {
	t.Helper()
	c, err := NewClient(f.ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	c.TokenTTL, c.Now = ttl, f.clk.Now
	return c
}

func TestClientReusesAndRefreshesToken(t *testing.T) {
	f := newFake(t)
	c := f.client(t, time.Minute)
	for i := 0; i < 3; i++ {
		b, err := c.Get(t.Context(), "meta-data/instance-id")
		if err != nil || string(b) != "i-0abc" {
			t.Fatalf("get %d: %q, %v", i, b, err)
		}
	}
	if n := f.puts.Load(); n != 1 {
		t.Fatalf("%d token requests for 3 gets, want 1", n)
	}
	// 50 s into a 60 s token: less than the refresh margin is left, so the
	// client renews before the request instead of risking a 401.
	f.clk.Add(50 * time.Second)
	if _, err := c.Get(t.Context(), "meta-data/instance-id"); err != nil {
		t.Fatal(err)
	}
	if n := f.puts.Load(); n != 2 {
		t.Fatalf("%d token requests after nearing expiry, want 2", n)
	}
}

func TestClientRefetchesTokenOn401(t *testing.T) {
	f := newFake(t)
	c := f.client(t, time.Hour)
	if _, err := c.Get(t.Context(), "meta-data/instance-id"); err != nil {
		t.Fatal(err)
	}
	f.restart() // the old token is now unknown: the next GET gets 401
	b, err := c.Get(t.Context(), "meta-data/instance-id")
	if err != nil || string(b) != "i-0abc" {
		t.Fatalf("after restart: %q, %v", b, err)
	}
	if n := f.puts.Load(); n != 2 {
		t.Fatalf("%d token requests, want 2", n)
	}
}

func TestClientErrors(t *testing.T) {
	f := newFake(t)
	c := f.client(t, time.Hour)
	if _, err := c.Get(t.Context(), PathInstanceAction); !errors.Is(err, ErrNotFound) {
		t.Fatalf("404: err = %v, want ErrNotFound", err)
	}

	// A server that always answers 401 must not make the client loop.
	var gets atomic.Int32
	always401 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			_, _ = w.Write([]byte("tok"))
			return
		}
		gets.Add(1)
		http.Error(w, "no", http.StatusUnauthorized)
	}))
	defer always401.Close()
	c2, _ := NewClient(always401.URL)
	var se *StatusError
	if _, err := c2.Get(t.Context(), "meta-data/instance-id"); !errors.As(err, &se) || se.Code != 401 {
		t.Fatalf("persistent 401: err = %v", err)
	}
	if n := gets.Load(); n != 2 {
		t.Fatalf("%d GETs on persistent 401, want 2 (one retry)", n)
	}

	// A TTL outside 1..21600 is clamped instead of being sent and refused.
	c3 := f.client(t, 48*time.Hour)
	if _, err := c3.Get(t.Context(), "meta-data/instance-id"); err != nil {
		t.Fatalf("over-long TTL: %v", err)
	}

	if _, err := NewClient("169.254.169.254"); err == nil {
		t.Fatal("NewClient accepted a URL without scheme")
	}
}

func TestClientTimeout(t *testing.T) {
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hang.Close()
	defer close(release)
	c, _ := NewClient(hang.URL)
	_, err := c.Get(t.Context(), "meta-data/instance-id")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("hanging IMDS: err = %v, want a timeout", err)
	}
}
