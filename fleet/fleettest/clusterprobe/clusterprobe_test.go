package clusterprobe

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

// server answers GET /v1/cluster as a cluster member naming leader, and
// counts the connections it accepts.
func server(t *testing.T, name, leader string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var conns atomic.Int32
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/cluster" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(api.ClusterInfo{Server: name, Leader: leader, IsLeader: name == leader})
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s, &conns
}

// TestProbe: the leader is the first one named, "" while none is; every
// server must answer for AllAnswer; repeated questions reuse one
// connection per server.
func TestProbe(t *testing.T) {
	ctx := context.Background()
	p := &Probe{Timeout: 2 * time.Second}
	electing, _ := server(t, "a", "")
	b, bConns := server(t, "b", "b")
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()

	if got := p.Leader(ctx, "tok", electing.URL); got != "" {
		t.Errorf("leader during an election: %q", got)
	}
	if got := p.Leader(ctx, "tok", down.URL, electing.URL, b.URL); got != "b" {
		t.Errorf("leader %q, want b", got)
	}
	if !p.AllAnswer(ctx, "tok", electing.URL, b.URL) {
		t.Error("two answering servers: not all answer")
	}
	if p.AllAnswer(ctx, "tok", electing.URL, down.URL, b.URL) {
		t.Error("a stopped server answers")
	}
	if p.AllAnswer(ctx, "wrong", b.URL) {
		t.Error("a refused token answers")
	}
	for range 5 {
		if _, err := p.Info(ctx, b.URL, "tok"); err != nil {
			t.Fatal(err)
		}
	}
	if n := bConns.Load(); n != 2 {
		t.Errorf("%d connections to b, want 2 (one per token)", n)
	}
}
