package rendezvous

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchAuth accepts "Bearer tok-<node>": cheap, like a token-hash lookup.
var benchAuth = AuthorizerFunc(func(r *http.Request, fleet, node string) error {
	if r.Header.Get("Authorization") != "Bearer tok-"+node {
		return ErrUnauthenticated
	}
	return nil
})

func benchServer(b *testing.B, svc *Service, conns int) (*httptest.Server, *http.Client) {
	srv := httptest.NewServer(svc.Handler(benchAuth))
	b.Cleanup(srv.Close)
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns}
	b.Cleanup(tr.CloseIdleConnections)
	return srv, &http.Client{Transport: tr}
}

// BenchmarkJoin1000 has 1000 agents join one fleet over loopback HTTP and
// long-poll until the round (closed at max_nodes by the last join) is
// announced. It reports the time from the first join to the last agent
// holding its assignment, and the announce latency (round closed →
// assignment received) per agent.
func BenchmarkJoin1000(b *testing.B) { benchJoin(b, 1000) }

func benchJoin(b *testing.B, n int) {
	ctx := context.Background()
	var mu sync.Mutex
	closedAt := map[string]time.Time{}
	svc := newService(b, Options{OnChange: func(fleet string, ev Event) {
		if ev.Kind == EventRoundClosed {
			mu.Lock()
			closedAt[fleet] = ev.At
			mu.Unlock()
		}
	}})
	srv, hc := benchServer(b, svc, n+16)
	var roundTotal time.Duration
	var lat []time.Duration
	b.ResetTimer()
	for i := range b.N {
		fleet := fmt.Sprintf("bench-%d", i)
		cfg := Config{MinNodes: n, MaxNodes: n, LastCall: time.Minute, Heartbeat: 5 * time.Second, DeadAfter: time.Minute, MasterPort: 29500}
		if err := svc.Configure(ctx, fleet, cfg); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		got := make([]time.Time, n)
		var failed atomic.Int64
		var firstErr atomic.Value
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		var wg sync.WaitGroup
		for j := range n {
			wg.Go(func() {
				id := fmt.Sprintf("node-%d", j)
				c := NewClient(srv.URL, "tok-"+id, hc)
				v, err := c.Join(rctx, fleet, JoinRequest{NodeID: id, Addr: fmt.Sprintf("10.0.%d.%d", j/250, j%250+1), Zone: "z", Nproc: 8})
				for err == nil && v.State != NodeAssigned {
					v, err = c.Watch(rctx, fleet, id, v)
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					cancel() // one agent short: the round would never close
				}
				got[j] = time.Now()
			})
		}
		wg.Wait()
		cancel()
		if failed.Load() > 0 {
			b.Fatalf("%d agents failed, first: %v", failed.Load(), firstErr.Load())
		}
		roundTotal += time.Since(start)
		mu.Lock()
		closed := closedAt[fleet]
		mu.Unlock()
		for _, t := range got {
			lat = append(lat, max(t.Sub(closed), 0))
		}
		if err := svc.Remove(ctx, fleet); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(roundTotal)/float64(b.N), "ms/round")
	b.ReportMetric(ms(sum)/float64(len(lat)), "announce-ms-mean")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "announce-ms-p99")
	b.ReportMetric(ms(lat[len(lat)-1]), "announce-ms-max")
}

// BenchmarkHeartbeat measures heartbeats/s through the real client and
// handler against a fleet of 1000 members.
func BenchmarkHeartbeat(b *testing.B) {
	const n = 1000
	ctx := context.Background()
	svc := newService(b, Options{})
	cfg := Config{MinNodes: n, MaxNodes: n, LastCall: time.Minute, Heartbeat: 5 * time.Second, DeadAfter: time.Hour, MasterPort: 29500}
	if err := svc.Configure(ctx, "hb", cfg); err != nil {
		b.Fatal(err)
	}
	for j := range n {
		id := fmt.Sprintf("node-%d", j)
		if _, err := svc.Join(ctx, "hb", JoinRequest{NodeID: id, Addr: "10.0.0.1", Nproc: 8}); err != nil {
			b.Fatal(err)
		}
	}
	srv, hc := benchServer(b, svc, 256)
	var next atomic.Int64
	b.SetParallelism(16)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		id := fmt.Sprintf("node-%d", next.Add(1)%n)
		c := NewClient(srv.URL, "tok-"+id, hc)
		step := int64(0)
		for pb.Next() {
			step++
			r, err := c.Heartbeat(ctx, "hb", HeartbeatRequest{NodeID: id, Round: 1, Step: &step, Workers: "running"})
			if err != nil || r.State != NodeAssigned {
				b.Errorf("heartbeat: %+v %v", r, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "heartbeats/s")
}

// BenchmarkMachineRound5000 is the pure state machine's cost of a 5000
// node round: joins, close, a view per node, and one re-formation after
// an exclusion (no sockets, so it shows the O(n) work alone).
func BenchmarkMachineRound5000(b *testing.B) {
	const n = 5000
	reqs := make([]JoinRequest, n)
	for j := range reqs {
		reqs[j] = JoinRequest{NodeID: fmt.Sprintf("node-%d", j), Addr: "10.0.0.1", Zone: fmt.Sprintf("z%d", j%3), Nproc: 8}
	}
	cfg := Config{MinNodes: n - 1, MaxNodes: n, LastCall: time.Minute, Heartbeat: 5 * time.Second, DeadAfter: time.Minute, MasterPort: 29500}
	b.ReportAllocs()
	for b.Loop() {
		m, _ := NewMachine(cfg, "r", t0)
		for _, r := range reqs {
			if _, _, err := m.Join(t0, r); err != nil {
				b.Fatal(err)
			}
		}
		for _, r := range reqs {
			if m.View(r.NodeID).State != NodeAssigned {
				b.Fatal("not assigned")
			}
		}
		m.Exclude(t0, reqs[0].NodeID, "bench")
		if _, st := m.Round(); st != RoundClosed {
			b.Fatal("survivors did not re-form at once")
		}
	}
}

// BenchmarkMachineHeartbeat is the state machine's per-heartbeat cost
// with 5000 members (O(1): no scan).
func BenchmarkMachineHeartbeat(b *testing.B) {
	const n = 5000
	m, _ := NewMachine(Config{MinNodes: 1, MaxNodes: n, LastCall: time.Minute, Heartbeat: time.Second, DeadAfter: time.Hour, MasterPort: 1}, "r", t0)
	ids := make([]string, n)
	for j := range ids {
		ids[j] = fmt.Sprintf("node-%d", j)
		m.Join(t0, JoinRequest{NodeID: ids[j], Addr: "10.0.0.1", Nproc: 1})
	}
	now := t0
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		m.Heartbeat(now, HeartbeatRequest{NodeID: ids[i%n]})
		_ = m.Next(now)
		i++
	}
}
