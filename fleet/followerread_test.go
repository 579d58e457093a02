package fleet

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/fleet/cluster"
	"github.com/fleetd/fleetd/fleet/projects"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// TestFollowerReadsWithoutLeader: while no server leads (an election, or
// the leader unreachable), a follower answers status, fleets and events
// from etcd itself, marked as a follower read and naming no leader;
// writes and everything else still wait for a leader (503).
func TestFollowerReadsWithoutLeader(t *testing.T) {
	ctx, solo, client := soloCluster(t)
	opts := Options{Schema: memSchema, Providers: staticProviders{providertest.MemName: providertest.NewMemProvider()}}
	opts.Config.Projects = projects.Config{Projects: []projects.Project{{Name: "vision", QuotaGPUs: 1, MaxGPUs: 4,
		Budget: &budget.Limits{Total: 100, WarnAt: 0.8, OnExhausted: budget.Pause}}}}
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

	// Projects: each project's use from its live nodes, and its spend from
	// the ledger the leader last saved, both read from etcd.
	if _, err := a.Apply(ctx, api.ApplyRequest{Filename: "pa.hcl", Source: projectSpec("pa", "vision", 1, 3), SkipCheck: true}); err != nil {
		t.Fatal(err)
	}
	// pb has no node and no leader admitted it: it waits in the queue.
	if _, err := a.Apply(ctx, api.ApplyRequest{Filename: "pb.hcl", Source: projectSpec("pb", "vision", 1, 1), SkipCheck: true}); err != nil {
		t.Fatal(err)
	}
	err := a.store.Update(ctx, func(tx state.Tx) error {
		for i := range 3 {
			n := state.Node{ID: fmt.Sprintf("pa-%d", i), Fleet: "pa", State: state.NodeRunning, InstanceID: fmt.Sprintf("i-%d", i),
				Offering: providers.Offering{Provider: providertest.MemName, GPUs: 1, PricePerHour: 1}}
			if err := tx.PutNode(n); err != nil {
				return err
			}
		}
		var l budget.Ledger
		l.Observe(time.Now(), "pa", "vision", budget.Spend{Spot: 12.5}, budget.Spend{Spot: 3})
		b, err := l.Marshal()
		if err != nil {
			return err
		}
		return tx.SetMeta(budget.MetaKey, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	resp := do(http.MethodGet, "/v1/projects")
	var pr api.ProjectsResponse
	if resp.StatusCode != http.StatusOK || resp.Header.Get(followerReadHeader) == "" || json.NewDecoder(resp.Body).Decode(&pr) != nil {
		t.Fatalf("GET /v1/projects on a follower without a leader: HTTP %d %q", resp.StatusCode, resp.Header.Get(followerReadHeader))
	}
	i := slices.IndexFunc(pr.Projects, func(p api.Project) bool { return p.Name == "vision" })
	if i < 0 {
		t.Fatalf("projects from the follower: %+v", pr.Projects)
	}
	if v := pr.Projects[i]; v.UsedGPUs != 3 || v.BorrowedGPUs != 2 || !slices.Contains(v.Fleets, "pa") || v.Budget == nil ||
		v.Budget.SpentUSD < 12.5 || v.Budget.SpentUSD > 12.6 || v.Budget.BurnPerHour != 3 {
		t.Errorf("project vision from the follower: %+v (budget %+v); want 3 GPUs used, 2 borrowed, $12.50 spent at $3/h", v, v.Budget)
	}
	if v := pr.Projects[i]; v.Queued != 1 {
		t.Errorf("project vision from the follower: %d queued, want 1 (pb)", v.Queued)
	}
	resp = do(http.MethodGet, "/v1/queue")
	var q api.QueueResponse
	if resp.StatusCode != http.StatusOK || resp.Header.Get(followerReadHeader) == "" || json.NewDecoder(resp.Body).Decode(&q) != nil {
		t.Fatalf("GET /v1/queue on a follower without a leader: HTTP %d %q", resp.StatusCode, resp.Header.Get(followerReadHeader))
	}
	if len(q.Queue) != 1 || q.Queue[0].Fleet != "pb" || q.Queue[0].Position != 1 || q.Queue[0].Reason == "" {
		t.Errorf("queue from the follower: %+v, want pb first with a reason", q.Queue)
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
