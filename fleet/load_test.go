package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/rendezvous"
)

// Load tests: a real daemon (fleet.New, bbolt with fsync, HTTP on
// loopback) under many concurrent API clients, and under 1,000 agents
// heartbeating while its reconciler runs. They report figures (t.Logf;
// go test -v) and check that nothing fails; they assert nothing about
// speed. FLEETD_CHAOS_LONG=1 (make chaos) runs the long versions.

func loadLong() bool { return os.Getenv("FLEETD_CHAOS_LONG") == "1" }

// latencies collects request durations from many goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// summary returns "n=… p50=… p90=… p99=… max=…".
func (l *latencies) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return "n=0"
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	r := func(d time.Duration) string { return d.Round(10 * time.Microsecond).String() }
	return fmt.Sprintf("n=%d p50=%s p90=%s p99=%s max=%s", len(s), r(q(0.50)), r(q(0.90)), r(q(0.99)), r(s[len(s)-1]))
}

// TestLoadAPIConcurrentClients runs 200 concurrent API clients against the
// admin API (status, fleet detail, events, metrics) of a daemon whose
// reconciler runs every 100 ms, and reports latency percentiles. Every
// request must succeed.
func TestLoadAPIConcurrentClients(t *testing.T) {
	const clients = 200
	perClient := 25
	switch {
	case loadLong():
		perClient = 250
	case testing.Short():
		perClient = 5
	}
	prov := newOutageProvider()
	td := startDaemonWith(t, t.TempDir(), prov, prov.MemProvider, reconcile.Params{})
	ctx := context.Background()
	td.apply(ctx, t, "train.hcl", outageSpec)
	td.joinBooting(t, "train", 3, 3, map[string]bool{})

	endpoints := []string{"/v1/status", "/v1/fleets/train", "/v1/events?since=0&limit=100", "/metrics"}
	per := make([]latencies, len(endpoints))
	var all latencies
	var failed atomic.Int64
	var firstErr atomic.Value
	// One connection per client, as 200 separate programs would have.
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}}
	defer hc.CloseIdleConnections()
	// get makes one request; it returns its duration.
	get := func(ep int) (time.Duration, error) {
		req, _ := http.NewRequest(http.MethodGet, td.URL()+endpoints[ep], nil)
		req.Header.Set("Authorization", "Bearer "+td.Token())
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: HTTP %d", endpoints[ep], resp.StatusCode)
		}
		return time.Since(t0), err
	}
	// Baseline: one client alone, to read the figures under load against.
	var alone latencies
	for i := range 20 * len(endpoints) {
		d, err := get(i % len(endpoints))
		if err != nil {
			t.Fatal(err)
		}
		alone.add(d)
	}

	start := make(chan struct{})
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range perClient {
				ep := (c + i) % len(endpoints)
				d, err := get(ep)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				per[ep].add(d)
				all.add(d)
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	total := clients * perClient
	t.Logf("API load: %d clients × %d requests = %d in %s (%.0f req/s), %d failed", clients, perClient, total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), failed.Load())
	t.Logf("  one client alone (baseline) %s", alone.summary())
	t.Logf("  all 200 clients             %s", all.summary())
	for i, ep := range endpoints {
		t.Logf("  %-28s %s", ep, per[i].summary())
	}
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed; first: %v", n, total, firstErr.Load())
	}
	// The fleet was left alone by the load.
	if n := countState(td.nodes(t, "train"), state.NodeRunning); n != 3 {
		t.Fatalf("%d running nodes after the load, want 3", n)
	}
}

func swarmSpec(n int) string {
	return memFleetSpec("swarm", n, n, "1s", "1s", "10s")
}

// reconcileStats reads the reconcile-pass histogram of a fleet.
func reconcileStats(t *testing.T, d *Daemon, fleet string) (passes uint64, seconds float64) {
	t.Helper()
	m := byLabel(t, d, "fleetd_reconcile_duration_seconds", "fleet")[fleet]
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestLoadThousandAgentsHeartbeat launches a 1,000-node fleet on the
// in-memory provider through the reconciler, then runs 1,000 simulated
// agents over real HTTP, each as the real agent does it: register, join
// the rendezvous, hold a watch long-poll, heartbeat every second. During
// the measured window the reconciler keeps running over the 1,000 nodes.
// No heartbeat may fail, nobody may drop out of the round.
func TestLoadThousandAgentsHeartbeat(t *testing.T) {
	const n = 1000
	window := 5 * time.Second
	switch {
	case loadLong():
		window = 30 * time.Second
	case testing.Short():
		window = 2 * time.Second
	}
	prov := newOutageProvider()
	td := startDaemonWith(t, t.TempDir(), prov, prov.MemProvider, reconcile.Params{MaxLaunchesPerPass: n})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	launchAt := time.Now()
	td.apply(ctx, t, "swarm.hcl", swarmSpec(n))
	var nodes []state.Node
	waitFor(t, fmt.Sprintf("%d booting nodes", n), 2*time.Minute, func() bool {
		nodes = td.nodes(t, "swarm")
		return countState(nodes, state.NodeBooting) == n
	})
	launched := time.Since(launchAt)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * n, MaxConnsPerHost: 0}}
	defer hc.CloseIdleConnections()
	var (
		hbLat                latencies
		hbFailed, hbWrong    atomic.Int64
		firstErr             atomic.Value
		assigned             atomic.Int64
		allAssigned          = make(chan struct{})
		measuring            atomic.Bool
		roundSeen            atomic.Int64
		wg                   sync.WaitGroup
		joinStart            = time.Now()
		closeAllAssignedOnce sync.Once
	)
	agentCtx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	fail := func(err error) {
		hbFailed.Add(1)
		firstErr.CompareAndSwap(nil, err.Error())
	}
	for i, nd := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			addr := fmt.Sprintf("10.%d.%d.%d", 1+i/65536, (i/256)%256, i%256)
			token := td.NodeToken("swarm", nd.ID)
			// Register (booting → joined), as the agent does first.
			if code := agentPost(agentCtx, hc, td.URL(), "swarm", nd.ID, token, "register", api.RegisterRequest{Address: addr, Zone: nd.Offering.Zone}); code != http.StatusOK {
				fail(fmt.Errorf("register %s: HTTP %d", nd.ID, code))
				return
			}
			c := rendezvous.NewClient(td.URL(), token, hc)
			v, err := c.Join(agentCtx, "swarm", rendezvous.JoinRequest{NodeID: nd.ID, Addr: addr, Zone: nd.Offering.Zone, Nproc: 1, Session: rendezvous.NewSession()})
			if err != nil {
				fail(fmt.Errorf("join %s: %w", nd.ID, err))
				return
			}
			// The real agent heartbeats from its join on (agent/elastic.go:
			// heartbeatLoop), also while it waits for the round: a join
			// phase longer than dead_after must not drop the first joiners.
			// round is 0 until this node is assigned.
			var round atomic.Int64
			wg.Add(1)
			go func() {
				defer wg.Done()
				every := time.Duration(v.HeartbeatMS) * time.Millisecond
				tick := time.NewTicker(every)
				defer tick.Stop()
				// Spread the agents over the interval, as independent machines are.
				select {
				case <-time.After(time.Duration(rand.Int64N(int64(every)))):
				case <-agentCtx.Done():
					return
				}
				for {
					// Only heartbeats sent after the window opened count: one
					// sent while this node waited carries round 0. The window
					// opens after every node stored its round, so r > 0 then.
					measured := measuring.Load()
					r := round.Load()
					workers := ""
					if r > 0 {
						workers = "running"
					}
					t0 := time.Now()
					resp, err := c.Heartbeat(agentCtx, "swarm", rendezvous.HeartbeatRequest{NodeID: nd.ID, Round: int(r), Workers: workers})
					if agentCtx.Err() != nil {
						return
					}
					if measured && measuring.Load() {
						switch {
						case err != nil:
							fail(fmt.Errorf("heartbeat %s: %w", nd.ID, err))
						case resp.State != rendezvous.NodeAssigned || int64(resp.Round) != r:
							hbWrong.Add(1)
							firstErr.CompareAndSwap(nil, fmt.Sprintf("heartbeat %s: state %s round %d, want assigned in %d", nd.ID, resp.State, resp.Round, r))
						default:
							hbLat.add(time.Since(t0))
						}
						roundSeen.Store(r)
					}
					select {
					case <-tick.C:
					case <-agentCtx.Done():
						return
					}
				}
			}()
			for v.State != rendezvous.NodeAssigned {
				if v, err = c.Watch(agentCtx, "swarm", nd.ID, v); err != nil {
					if agentCtx.Err() == nil {
						fail(fmt.Errorf("watch %s: %w", nd.ID, err))
					}
					return
				}
			}
			round.Store(int64(v.Round))
			if assigned.Add(1) == n {
				closeAllAssignedOnce.Do(func() { close(allAssigned) })
			}
			// Hold a long-poll like a real agent; it must not return with a
			// change while the swarm is steady.
			w, err := c.Watch(agentCtx, "swarm", nd.ID, v)
			if agentCtx.Err() == nil && (err != nil || w.Round != v.Round) {
				fail(fmt.Errorf("watch %s returned round %d (%v) during steady heartbeats", nd.ID, w.Round, err))
			}
		}()
	}
	select {
	case <-allAssigned:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%d of %d agents assigned after 2m; first error: %v", assigned.Load(), n, firstErr.Load())
	}
	joined := time.Since(joinStart)
	waitFor(t, fmt.Sprintf("%d running nodes", n), time.Minute, func() bool { return countState(td.nodes(t, "swarm"), state.NodeRunning) == n })

	passes0, secs0 := reconcileStats(t, td.Daemon, "swarm")
	measuring.Store(true)
	time.Sleep(window)
	measuring.Store(false)
	passes1, secs1 := reconcileStats(t, td.Daemon, "swarm")
	stopAgents()
	wg.Wait()

	hbs := len(hbLat.d)
	t.Logf("1,000 agents: fleet launched by the reconciler in %s; register+join → all assigned in %s", launched.Round(time.Millisecond), joined.Round(time.Millisecond))
	t.Logf("  heartbeats over %s: %d (%.0f/s), %d failed, %d wrong answers; latency %s", window, hbs, float64(hbs)/window.Seconds(), hbFailed.Load(), hbWrong.Load(), hbLat.summary())
	passes := passes1 - passes0
	mean := 0.0
	if passes > 0 {
		mean = (secs1 - secs0) / float64(passes) * 1000
	}
	t.Logf("  reconciler meanwhile: %d passes over 1,000 nodes, mean %.1f ms", passes, mean)
	if hbFailed.Load() > 0 || hbWrong.Load() > 0 {
		t.Fatalf("%d failed, %d wrong heartbeats; first: %v", hbFailed.Load(), hbWrong.Load(), firstErr.Load())
	}
	if hbs == 0 {
		t.Fatal("no heartbeat measured")
	}
	// Steady state held: the same round, every node still running.
	st, err := td.rdzv.rz().Status("swarm")
	if err != nil {
		t.Fatal(err)
	}
	if int64(st.Round) != roundSeen.Load() || len(st.Members) != n {
		t.Fatalf("rendezvous: round %d with %d members, want round %d with %d", st.Round, len(st.Members), roundSeen.Load(), n)
	}
	if c := countState(td.nodes(t, "swarm"), state.NodeRunning); c != n {
		t.Fatalf("%d running nodes after the load, want %d", c, n)
	}
	// The reconciler was never starved for good (liveness, not speed).
	waitFor(t, "a reconcile pass", 30*time.Second, func() bool {
		p, _ := reconcileStats(t, td.Daemon, "swarm")
		return p > passes0
	})
	if live := prov.Live(); live != n {
		t.Fatalf("%d live instances, want %d", live, n)
	}
}

// agentPost makes one agent API call with the node's token.
func agentPost(ctx context.Context, hc *http.Client, base, fleet, node, token, op string, body any) int {
	b, err := json.Marshal(body)
	if err != nil {
		return 0
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/agent/"+fleet+"/"+node+"/"+op, bytes.NewReader(b))
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
