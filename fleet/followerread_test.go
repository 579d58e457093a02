package fleet

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/cluster"
	"github.com/fleetd/fleetd/providers/providertest"
)

// TestFollowerReadsWithoutLeader: while no server leads (an election, or
// the leader unreachable), a follower answers status, fleets and events
// from etcd itself, marked as a follower read and naming no leader;
// writes and everything else still wait for a leader (503).
func TestFollowerReadsWithoutLeader(t *testing.T) {
	ctx, solo, client := soloCluster(t)
	opts := Options{Schema: memSchema, Providers: staticProviders{providertest.MemName: providertest.NewMemProvider()}}
	// Neither server campaigns (they are not Run): no leader exists. The
	// apply happens before any campaign, as a server's bootstrap writes do.
	a := newClusterServer(ctx, t, "a", t.TempDir(), solo, false, opts)
	if _, err := a.Apply(ctx, api.ApplyRequest{Filename: "mem.hcl", Source: memSpec}); err != nil {
		t.Fatal(err)
	}
	b := newClusterServer(ctx, t, "b", t.TempDir(), &cluster.Config{Name: "b", Etcd: &cluster.EtcdConfig{Endpoints: []string{client}}}, false, opts)
	// b runs but has not won (what lead() sets up before campaigning).
	b.cl.elector = cluster.NewElector(b.cl.cli, b.cl.cfg.Prefix, b.cl.cfg.TTL(), cluster.Server{Name: "b"})
	b.cl.campaigning.Store(true)
	srv := httptest.NewServer(b.clusterHandler(b.api))
	defer srv.Close()
	do := func(method, path string) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+b.Token())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for _, path := range []string{"/v1/status", "/v1/fleets", "/v1/fleets/train", "/v1/events"} {
		resp := do(http.MethodGet, path)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(followerReadHeader) == "" {
			t.Errorf("GET %s on a follower without a leader: HTTP %d, %s %q; want 200 marked as a follower read", path, resp.StatusCode, followerReadHeader, resp.Header.Get(followerReadHeader))
		}
		if path == "/v1/status" {
			var st api.Status
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				t.Fatal(err)
			}
			if st.Leader != "" || st.Server != "b" || len(st.Fleets) != 1 || st.Fleets[0].Name != "train" {
				t.Errorf("status from the follower: server %q leader %q fleets %+v; want server b, no leader, the fleet train", st.Server, st.Leader, st.Fleets)
			}
		}
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodPost, "/v1/apply"},
		{http.MethodGet, "/v1/offerings"},
		{http.MethodGet, "/metrics"},
	} {
		if resp := do(c.method, c.path); resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("%s %s on a follower without a leader: HTTP %d, want 503", c.method, c.path, resp.StatusCode)
		}
	}

	// A leader is elected but cannot be reached (its URL refuses): reads
	// are answered by the follower, writes fail as a bad gateway.
	ghost := cluster.NewElector(a.cl.cli, a.cl.cfg.Prefix, a.cl.cfg.TTL(), cluster.Server{Name: "ghost", URL: loopbackURL(t)})
	term, err := ghost.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer term.Resign(ctx)
	time.Sleep(1100 * time.Millisecond) // currentLeader caches for a second
	if resp := do(http.MethodGet, "/v1/fleets/train"); resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get(followerReadHeader), "leader ghost unreachable") {
		t.Errorf("GET with the leader unreachable: HTTP %d, %q", resp.StatusCode, resp.Header.Get(followerReadHeader))
	}
	if resp := do(http.MethodPost, "/v1/apply"); resp.StatusCode != http.StatusBadGateway {
		t.Errorf("POST with the leader unreachable: HTTP %d, want 502", resp.StatusCode)
	}
}
