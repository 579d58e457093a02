package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/freeport"
)

// tokenAuth is a per-node bearer-token authorizer like the daemon's.
type tokenAuth struct {
	fleet  string
	tokens map[string]string // token → node
}

func (a tokenAuth) Authorize(r *http.Request, fleet, node string) error {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return fmt.Errorf("%w: missing bearer token", ErrUnauthenticated)
	}
	owner, known := a.tokens[tok]
	if !known {
		return fmt.Errorf("%w: invalid token", ErrUnauthenticated)
	}
	if owner != node || fleet != a.fleet {
		return fmt.Errorf("%w: this token acts for node %s only", ErrForbidden, owner)
	}
	return nil
}

func testAuth(fleet string, nodes ...string) tokenAuth {
	a := tokenAuth{fleet: fleet, tokens: map[string]string{}}
	for _, n := range nodes {
		a.tokens["tok-"+n] = n
	}
	return a
}

func startHTTP(t *testing.T, svc *Service, auth Authorizer) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(svc.Handler(auth)) // 127.0.0.1
	t.Cleanup(srv.Close)
	return srv
}

func TestHTTPJoinWatchAssignAndExclude(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	svc := newService(t, Options{})
	cfg := testConfig(2, 3) // the third join closes the round at max
	if err := svc.Configure(ctx, "bert", cfg); err != nil {
		t.Fatal(err)
	}
	nodes := []string{"n0", "n1", "n2"}
	srv := startHTTP(t, svc, testAuth("bert", nodes...))

	views := make([]View, len(nodes))
	var wg sync.WaitGroup
	errs := make(chan error, len(nodes))
	for i, id := range nodes {
		wg.Go(func() {
			c := NewClient(srv.URL, "tok-"+id, srv.Client())
			v, err := c.Join(ctx, "bert", JoinRequest{NodeID: id, Addr: addrOf(id), Zone: "us-east-1a", Nproc: i + 1, Session: NewSession()})
			for err == nil && v.State != NodeAssigned {
				v, err = c.Watch(ctx, "bert", id, v)
			}
			views[i] = v
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	seen := map[int]string{}
	var master string
	for i, v := range views {
		a := v.Assignment
		if v.Round != 1 || a.WorldSize != 6 || a.GroupWorldSize != 3 || a.LocalWorldSize != i+1 || a.MasterPort != cfg.MasterPort {
			t.Fatalf("%s: %+v", nodes[i], a)
		}
		if prev, dup := seen[a.GroupRank]; dup {
			t.Fatalf("group rank %d for %s and %s", a.GroupRank, prev, nodes[i])
		}
		seen[a.GroupRank] = nodes[i]
		if a.GroupRank == 0 {
			master = addrOf(nodes[i])
		}
	}
	for _, v := range views {
		if v.Assignment.MasterAddr != master || v.Assignment.RunID != views[0].Assignment.RunID {
			t.Fatalf("assignments disagree: %+v", v.Assignment)
		}
	}

	// Everyone long-polls with a 30s wait; the exclusion must wake them all.
	type result struct {
		i   int
		v   View
		err error
		dt  time.Duration
	}
	results := make(chan result, len(nodes))
	for i, id := range nodes {
		go func() {
			c := NewClient(srv.URL, "tok-"+id, srv.Client())
			start := time.Now()
			v, err := c.Watch(ctx, "bert", id, views[i])
			results <- result{i, v, err, time.Since(start)}
		}()
	}
	time.Sleep(100 * time.Millisecond) // let the long-polls arrive (not needed for correctness)
	excluded := seen[1]
	if err := svc.Exclude(ctx, "bert", excluded, "spot interruption notice"); err != nil {
		t.Fatal(err)
	}
	for range nodes {
		r := <-results
		if r.err != nil {
			t.Fatalf("%s: %v", nodes[r.i], r.err)
		}
		t.Logf("%s woke after %s: %s round %d", nodes[r.i], r.dt, r.v.State, r.v.Round)
		if nodes[r.i] == excluded {
			if r.v.State != NodeExcluded {
				t.Fatalf("excluded node sees %+v", r.v)
			}
			continue
		}
		a := r.v.Assignment
		if r.v.State != NodeAssigned || r.v.Round != 2 || a.GroupWorldSize != 2 {
			t.Fatalf("%s after exclusion: %+v", nodes[r.i], r.v)
		}
		if want := map[string]int{seen[0]: 0, seen[2]: 1}[nodes[r.i]]; a.GroupRank != want {
			t.Fatalf("%s: group rank %d, want %d (survivors keep their order)", nodes[r.i], a.GroupRank, want)
		}
	}
	// The excluded node cannot come back.
	c := NewClient(srv.URL, "tok-"+excluded, srv.Client())
	if v, err := c.Join(ctx, "bert", JoinRequest{NodeID: excluded, Addr: addrOf(excluded), Nproc: 1}); err != nil || v.State != NodeExcluded {
		t.Fatalf("rejoin of an excluded node: %+v %v", v, err)
	}
	hb, err := c.Heartbeat(ctx, "bert", HeartbeatRequest{NodeID: excluded, Round: 1})
	if err != nil || hb.State != NodeExcluded || hb.Round != 2 {
		t.Fatalf("heartbeat %+v %v", hb, err)
	}
	step := int64(1200)
	c0 := NewClient(srv.URL, "tok-"+seen[0], srv.Client())
	hb, err = c0.Heartbeat(ctx, "bert", HeartbeatRequest{NodeID: seen[0], Round: 2, Step: &step, Workers: "running"})
	if err != nil || hb.State != NodeAssigned || hb.Round != 2 || hb.RoundState != RoundClosed || hb.HeartbeatMS != 1000 {
		t.Fatalf("heartbeat %+v %v", hb, err)
	}
	if st, _ := svc.Status("bert"); st.Members[0].Step == nil || *st.Members[0].Step != 1200 || st.Members[0].Workers != "running" {
		t.Fatalf("worker report not in status: %+v", st.Members[0])
	}
	if err := c0.Leave(ctx, "bert", seen[0]); err != nil {
		t.Fatal(err)
	}
	if st, _ := svc.Status("bert"); st.Round != 3 || st.State != RoundOpen {
		t.Fatalf("after leave: round %d %s", st.Round, st.State)
	}
}

func TestHTTPErrors(t *testing.T) {
	ctx := context.Background()
	svc := configuredService(ctx, t, Options{}, testConfig(2, 2))
	srv := startHTTP(t, svc, testAuth("f", "a", "b"))
	join := `{"node_id":"a","addr":"10.0.0.1","nproc":1}`
	tests := []struct {
		name, method, path, token, body string
		status                          int
		code                            string
	}{
		{"no token", "POST", "/v1/rendezvous/f/join", "", join, 401, CodeUnauthorized},
		{"bad token", "POST", "/v1/rendezvous/f/join", "nope", join, 401, CodeUnauthorized},
		{"other node's token", "POST", "/v1/rendezvous/f/join", "tok-b", join, 403, CodeForbidden},
		{"watch with other node's token", "GET", "/v1/rendezvous/f/watch?node=a&wait=0s", "tok-b", "", 403, CodeForbidden},
		{"watch without token", "GET", "/v1/rendezvous/f/watch?node=a", "", "", 401, CodeUnauthorized},
		{"oversized body", "POST", "/v1/rendezvous/f/join", "tok-a", `{"node_id":"a","zone":"` + strings.Repeat("z", MaxBodyBytes) + `"}`, 413, CodeTooLarge},
		{"oversized trailing", "POST", "/v1/rendezvous/f/heartbeat", "tok-a", `{"node_id":"a"}` + strings.Repeat(" ", MaxBodyBytes), 413, CodeTooLarge},
		{"unknown field", "POST", "/v1/rendezvous/f/join", "tok-a", `{"node_id":"a","addr":"10.0.0.1","nproc":1,"rank":0}`, 400, CodeBadRequest},
		{"trailing data", "POST", "/v1/rendezvous/f/heartbeat", "tok-a", `{"node_id":"a"} {}`, 400, CodeBadRequest},
		{"empty body", "POST", "/v1/rendezvous/f/leave", "tok-a", ``, 400, CodeBadRequest},
		{"not JSON", "POST", "/v1/rendezvous/f/join", "tok-a", `node_id=a`, 400, CodeBadRequest},
		{"hostname addr", "POST", "/v1/rendezvous/f/join", "tok-a", `{"node_id":"a","addr":"a.internal","nproc":1}`, 400, CodeBadRequest},
		{"zero nproc", "POST", "/v1/rendezvous/f/join", "tok-a", `{"node_id":"a","addr":"10.0.0.1","nproc":0}`, 400, CodeBadRequest},
		{"leave without node", "POST", "/v1/rendezvous/f/leave", "tok-a", `{}`, 400, CodeBadRequest},
		{"watch bad after", "GET", "/v1/rendezvous/f/watch?node=a&after=x", "tok-a", "", 400, CodeBadRequest},
		{"watch bad state", "GET", "/v1/rendezvous/f/watch?node=a&state=sleepy", "tok-a", "", 400, CodeBadRequest},
		{"watch too long", "GET", "/v1/rendezvous/f/watch?node=a&wait=1h", "tok-a", "", 400, CodeBadRequest},
		{"watch without node", "GET", "/v1/rendezvous/f/watch", "tok-a", "", 400, CodeBadRequest},
		{"unknown fleet", "POST", "/v1/rendezvous/g/heartbeat", "tok-a", `{"node_id":"a"}`, 403, CodeForbidden},
		{"wrong method", "GET", "/v1/rendezvous/f/join", "tok-a", "", 405, ""},
		{"join ok", "POST", "/v1/rendezvous/f/join", "tok-a", join, 200, ""},
		{"watch now", "GET", "/v1/rendezvous/f/watch?node=a&wait=0s", "tok-a", "", 200, ""},
		{"leave ok", "POST", "/v1/rendezvous/f/leave", "tok-a", `{"node_id":"a"}`, 204, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.code != "" {
				var eb ErrorBody
				if err := json.Unmarshal(b, &eb); err != nil || eb.Code != tc.code || eb.Error == "" {
					t.Fatalf("body %s, want code %s", b, tc.code)
				}
			}
			if tc.status == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Fatal("401 without WWW-Authenticate")
			}
		})
	}
	// A fleet the token may act on but that does not exist is a 404.
	svc2 := newService(t, Options{})
	srv2 := startHTTP(t, svc2, testAuth("f", "a"))
	_, err := NewClient(srv2.URL, "tok-a", srv2.Client()).Heartbeat(ctx, "f", HeartbeatRequest{NodeID: "a"})
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !errors.Is(err, ErrUnknownFleet) {
		t.Fatalf("unknown fleet: %v", err)
	}
}

func TestClientRetriesUntilDaemonIsUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Nothing listens yet: the daemon is "restarting". From freeport, so
	// that no ":0" listener takes the port before the server rebinds it.
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}

	svc := configuredService(ctx, t, Options{}, testConfig(1, 2))
	started := make(chan *http.Server, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			started <- nil
			return
		}
		hs := &http.Server{Handler: svc.Handler(testAuth("f", "a"))}
		started <- hs
		_ = hs.Serve(ln)
	}()
	c := NewClient("http://"+addr, "tok-a", &http.Client{})
	c.MinBackoff, c.MaxBackoff = 20*time.Millisecond, 100*time.Millisecond
	v, err := c.Join(ctx, "f", JoinRequest{NodeID: "a", Addr: "127.0.0.2", Nproc: 1})
	hs := <-started
	if hs == nil {
		t.Skip("port was taken before the server could rebind it")
	}
	defer hs.Close()
	if err != nil || v.State != NodeWaiting {
		t.Fatalf("join through a restart: %+v %v", v, err)
	}
	// 4xx is not retried.
	_, err = NewClient("http://"+addr, "tok-x", &http.Client{}).Join(ctx, "f", JoinRequest{NodeID: "a", Addr: "127.0.0.2", Nproc: 1})
	if !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("bad token: %v", err)
	}
	// A context that ends stops the retries.
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	_, err = NewClient("http://127.0.0.1:1", "t", &http.Client{}).Join(short, "f", JoinRequest{NodeID: "a", Addr: "127.0.0.2", Nproc: 1})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no daemon: %v", err)
	}
}

func TestClientWatchNeverSpins(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A daemon that (wrongly) answers every long-poll at once, unchanged.
	var polls atomic.Int64
	same := View{Round: 3, RoundState: RoundClosed, State: NodeStandby}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		polls.Add(1)
		writeJSON(w, http.StatusOK, same)
	}))
	defer srv.Close()
	c := NewClient(srv.URL, "t", srv.Client())
	c.MinBackoff, c.WatchWait = 50*time.Millisecond, 10*time.Second
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	if _, err := c.Watch(short, "f", "a", same); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("watch: %v", err)
	}
	if n := polls.Load(); n > 12 || n < 2 {
		t.Fatalf("%d polls in 500ms with a 50ms floor", n)
	}

	// Against the real handler, an unchanged view costs one poll per wait.
	svc := configuredService(ctx, t, Options{}, testConfig(2, 2))
	var real atomic.Int64
	h := svc.Handler(testAuth("f", "a"))
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		real.Add(1)
		h.ServeHTTP(w, r)
	}))
	defer srv2.Close()
	c2 := NewClient(srv2.URL, "tok-a", srv2.Client())
	c2.WatchWait = 100 * time.Millisecond
	v, err := c2.Join(ctx, "f", JoinRequest{NodeID: "a", Addr: "127.0.0.2", Nproc: 1})
	if err != nil {
		t.Fatal(err)
	}
	short2, cancel2 := context.WithTimeout(ctx, 550*time.Millisecond)
	defer cancel2()
	if _, err := c2.Watch(short2, "f", "a", v); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("watch: %v", err)
	}
	if n := real.Load() - 1; n > 7 {
		t.Fatalf("%d long-polls in 550ms with a 100ms wait", n)
	}
}

// TestHTTPWatchWakesOnMasterListening: a watcher learns at once that the
// master's store is up; a watcher without the parameter (an older agent)
// is not woken by it.
func TestHTTPWatchWakesOnMasterListening(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	svc := configuredService(ctx, t, Options{}, testConfig(2, 2))
	srv := startHTTP(t, svc, testAuth("f", "a", "b"))
	clients := map[string]*Client{"a": NewClient(srv.URL, "tok-a", srv.Client()), "b": NewClient(srv.URL, "tok-b", srv.Client())}
	views := map[string]View{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, c := range clients {
		wg.Go(func() {
			v, err := c.Join(ctx, "f", JoinRequest{NodeID: id, Addr: addrOf(id), Nproc: 1, Session: NewSession()})
			for err == nil && v.State != NodeAssigned {
				v, err = c.Watch(ctx, "f", id, v)
			}
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			views[id] = v
			mu.Unlock()
		})
	}
	wg.Wait()
	master, other := "a", "b"
	if views["b"].Assignment.GroupRank == 0 {
		master, other = "b", "a"
	}
	legacy := make(chan *http.Response, 1)
	go func() {
		// An older agent's watch: no listening parameter, a short wait.
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/rendezvous/f/watch?node=%s&after=1&state=assigned&wait=1500ms", srv.URL, other), nil)
		req.Header.Set("Authorization", "Bearer tok-"+other)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Error(err)
			resp = nil
		}
		legacy <- resp
	}()
	woke := make(chan View, 1)
	start := time.Now()
	go func() {
		v, err := clients[other].Watch(ctx, "f", other, views[other])
		if err != nil {
			t.Error(err)
		}
		woke <- v
	}()
	time.Sleep(200 * time.Millisecond)
	if _, err := clients[master].Heartbeat(ctx, "f", HeartbeatRequest{NodeID: master, Round: 1, Listening: 1}); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-woke:
		if !v.MasterListening || v.Round != 1 {
			t.Errorf("woken with %+v, want round 1 with the master listening", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watcher was not woken by the master's report")
	}
	resp := <-legacy
	if resp != nil {
		resp.Body.Close()
		if took := time.Since(start); took < 1200*time.Millisecond {
			t.Errorf("the legacy watch returned after %s, before its wait: woken by the listening report", took)
		}
	}
}

// TestHTTPWatcherGone: a watch whose client goes away is reported (the
// daemon then looks at the node's instance at once); a watch that ends
// with an answer, or with its wait run out, is not.
func TestHTTPWatcherGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gone := make(chan string, 4)
	svc := newService(t, Options{OnWatcherGone: func(fleet, node string) { gone <- fleet + "/" + node }})
	if err := svc.Configure(ctx, "bert", testConfig(2, 3)); err != nil {
		t.Fatal(err)
	}
	srv := startHTTP(t, svc, testAuth("bert", "n0"))
	c := NewClient(srv.URL, "tok-n0", srv.Client())
	v, err := c.Join(ctx, "bert", JoinRequest{NodeID: "n0", Addr: addrOf("n0"), Zone: "us-east-1a", Nproc: 1, Session: NewSession()})
	if err != nil {
		t.Fatal(err)
	}
	// A wait that runs out answers with the unchanged view: not gone.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/v1/rendezvous/bert/watch?node=n0&after=%d&state=%s&listening=%t&wait=100ms", srv.URL, v.Round, v.State, v.MasterListening), nil)
	req.Header.Set("Authorization", "Bearer tok-n0")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("watch: HTTP %d", resp.StatusCode)
	}
	// The client goes while the daemon holds its watch.
	wctx, drop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := c.Watch(wctx, "bert", "n0", v); done <- err }()
	time.Sleep(200 * time.Millisecond)
	select {
	case g := <-gone:
		t.Fatalf("reported %s gone while it watched", g)
	default:
	}
	drop()
	<-done
	select {
	case g := <-gone:
		if g != "bert/n0" {
			t.Fatalf("reported %q, want bert/n0", g)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a watch whose client went away was not reported")
	}
}
