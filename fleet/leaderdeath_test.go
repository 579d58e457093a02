package fleet

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fleetd/fleetd/fleet/cluster"
	"github.com/fleetd/fleetd/fleet/state/etcdtest"
)

func TestLeaderDeathProbe(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type obs struct {
		lease              clientv3.LeaseID
		reachable, refused bool
		at                 time.Duration
		depose             bool
	}
	cases := []struct {
		name string
		obs  []obs
	}{
		{"reached, then refused for the whole window", []obs{
			{1, true, false, 0, false}, {1, false, true, 500 * time.Millisecond, false},
			{1, false, true, time.Second, false}, {1, false, true, 1500 * time.Millisecond, true}}},
		{"never reached: a URL the followers cannot use is no evidence", []obs{
			{1, false, true, 0, false}, {1, false, true, time.Second, false}, {1, false, true, 5 * time.Second, false}}},
		{"a timeout in between restarts the window", []obs{
			{1, true, false, 0, false}, {1, false, true, 500 * time.Millisecond, false},
			{1, false, false, time.Second, false}, {1, false, true, 1500 * time.Millisecond, false},
			{1, false, true, 2 * time.Second, false}, {1, false, true, 2500 * time.Millisecond, true}}},
		{"an answer in between restarts the window", []obs{
			{1, true, false, 0, false}, {1, false, true, 500 * time.Millisecond, false},
			{1, true, false, time.Second, false}, {1, false, true, 1500 * time.Millisecond, false},
			{1, false, true, 2 * time.Second, false}}},
		{"a new term must be reached again", []obs{
			{1, true, false, 0, false}, {2, false, true, 500 * time.Millisecond, false},
			{2, false, true, 2 * time.Second, false}, {2, false, true, 5 * time.Second, false}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var p leaderDeathProbe
			for i, o := range tc.obs {
				if got := p.observe(o.lease, o.reachable, o.refused, t0.Add(o.at)); got != o.depose {
					t.Fatalf("observation %d (%+v): depose %v, want %v", i, o, got, o.depose)
				}
			}
		})
	}
}

// TestFollowerDeposesLeaderWhosePortRefuses: a follower that reached the
// leader's API, and then finds its port refusing connections, ends the
// leader's term at once; the lease's TTL (a minute here) is not waited for.
// A leader whose URL never answered is left alone.
func TestFollowerDeposesLeaderWhosePortRefuses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	ec := etcdtest.StartCluster(t, 1)
	cli := ec.Client(t)
	cfg := &cluster.Config{Name: "f", Prefix: "/fleetd-test/"}
	follower := &Daemon{cl: &clusterState{cfg: cfg, cli: cli}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go follower.watchLeaderDeath(ctx, cluster.Server{Name: "f", URL: "http://127.0.0.1:1"})

	leaderCampaign := func(name, url string) *cluster.Term {
		t.Helper()
		term, err := cluster.NewElector(cli, cfg.Prefix, time.Minute, cluster.Server{Name: name, URL: url}).Campaign(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return term
	}
	leaderNow := func() string {
		s, err := cluster.NewElector(cli, cfg.Prefix, time.Minute, cluster.Server{}).Leader(ctx)
		if err != nil {
			return ""
		}
		return s.Name
	}

	// A leader whose URL refuses from the start (never reached): kept.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	never := leaderCampaign("never-reached", deadURL)
	time.Sleep(3 * time.Second)
	if got := leaderNow(); got != "never-reached" {
		t.Fatalf("leader %q, want never-reached kept: the follower never reached it", got)
	}
	never.Resign(ctx)

	// A leader the follower reaches, whose process then dies.
	api := httptest.NewServer(http.NotFoundHandler())
	leaderCampaign("l", api.URL)
	time.Sleep(3 * leaderProbeEvery) // reached at least once
	if got := leaderNow(); got != "l" {
		t.Fatalf("leader %q, want l", got)
	}
	api.Close()
	deadline := time.Now().Add(15 * time.Second)
	for leaderNow() != "" {
		if time.Now().After(deadline) {
			t.Fatal("the leader whose port refuses connections kept its term (lease TTL 60s)")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
