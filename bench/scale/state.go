package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleetd/bench/internal/report"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

const eventsTarget = 5000 // persisted events/s

// benchState measures the bbolt store with the durability the daemon
// relies on (fsync on every commit): sustained event appends and the size
// of the state file per 10,000 nodes.
func benchState(ctx context.Context, r *report.Reporter, p params) error {
	window, appenders := p.StateWindow, p.Appenders
	dir, err := os.MkdirTemp("", "fleetd-bench-state-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	ev := state.Event{Fleet: "bench", Node: "bench-1-17", Type: "node.transition", Message: "booting → joined: agent registered from 10.0.0.17",
		Data: map[string]string{"from": "booting", "to": "joined", "offering": "aws/us-east-1/us-east-1a/p4d.24xlarge/spot"}}

	// Baseline: one durable Update per event, one caller.
	s, err := state.Open(filepath.Join(dir, "update.db"), state.Options{})
	if err != nil {
		return err
	}
	single := 0
	start := time.Now()
	for time.Since(start) < window/4 {
		if err := s.Update(ctx, func(tx state.Tx) error {
			_, err := tx.AppendEvent(ev)
			return err
		}); err != nil {
			s.Close()
			return err
		}
		single++
	}
	r.Info("state.events_per_s_one_update_each", float64(single)/time.Since(start).Seconds(), "events/s")
	s.Close()

	// Batched: concurrent AppendEvents callers share one transaction and
	// one fsync per batch (durable when AppendEvents returns). The batch
	// size, and so the rate, grows with the number of concurrent callers.
	for i, k := range appenders {
		rate, err := appendRate(ctx, filepath.Join(dir, fmt.Sprintf("batched-%d.db", k)), ev, window, k)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("state.events_per_s_batched_%d_callers", k)
		if i == len(appenders)-1 {
			r.Check(name, rate, "events/s", report.AtLeast, eventsTarget)
		} else {
			r.Info(name, rate, "events/s")
		}
	}
	return stateSize(ctx, r, filepath.Join(dir, "size.db"), p.SizeNodes)
}

// stateSize writes a fleet of 10,000 nodes as the daemon records them,
// then the five lifecycle events each node's launch and boot append, and
// reports the file size after each.
func stateSize(ctx context.Context, r *report.Reporter, path string, n int) error {
	s, err := state.Open(path, state.Options{})
	if err != nil {
		return err
	}
	defer s.Close()
	src := []byte(fleetSpec("size", n, 10*time.Second))
	if err := s.Update(ctx, func(tx state.Tx) error {
		_, err := tx.PutFleet(state.Fleet{Name: "size", Filename: "fleet.hcl", Source: src})
		return err
	}); err != nil {
		return err
	}
	off := providers.Offering{Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "p4d.24xlarge", CapacityType: providers.Spot,
		PricePerHour: 9.83, GPUs: 8, GPUType: "A100", VCPUs: 96, MemoryGiB: 1152, Available: -1}
	now := time.Now().UTC()
	for start := 0; start < n; start += 1000 {
		if err := s.Update(ctx, func(tx state.Tx) error {
			for i := start; i < min(start+1000, n); i++ {
				nd := state.Node{ID: fmt.Sprintf("size-1-%d", i+1), Fleet: "size", State: state.NodeRunning,
					Reason: "member of a closed rendezvous round", Offering: off, InstanceID: fmt.Sprintf("i-%017x", 0xabc000+i),
					Address: agentAddr(i), Round: 3, LastHeartbeat: now, CreatedAt: now, UpdatedAt: now}
				if err := tx.PutNode(nd); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	nodesOnly, err := fileMiB(s, path)
	if err != nil {
		return err
	}
	per := float64(10000) / float64(n) // scaled to 10,000 nodes
	r.Info("state.file_per_10000_nodes", nodesOnly*per, "MiB")

	transitions := []string{"requested", "provisioning", "booting", "joined", "running"}
	for start := 0; start < n; start += 200 {
		var evs []state.Event
		for i := start; i < min(start+200, n); i++ {
			for k := 1; k < len(transitions); k++ {
				evs = append(evs, state.Event{Fleet: "size", Node: fmt.Sprintf("size-1-%d", i+1), Type: "node.transition",
					Message: fmt.Sprintf("%s → %s", transitions[k-1], transitions[k]),
					Data:    map[string]string{"from": transitions[k-1], "to": transitions[k], "offering": off.Key()}})
			}
			evs = append(evs, state.Event{Fleet: "size", Node: fmt.Sprintf("size-1-%d", i+1), Type: "rendezvous.member_joined",
				Message: "node joined (round 1, participant)", Data: map[string]string{"round": "1"}})
		}
		if _, err := s.AppendEvents(ctx, evs); err != nil {
			return err
		}
	}
	withEvents, err := fileMiB(s, path)
	if err != nil {
		return err
	}
	r.Info("state.file_per_10000_nodes_with_boot_events", withEvents*per, "MiB")
	return nil
}

// fileMiB is the state file's size on disk (bbolt grows it in steps) and
// prints its in-use size as well.
func fileMiB(s *state.BoltStore, path string) (float64, error) {
	st, err := s.Stats(context.Background())
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	fmt.Printf("state: %d nodes, %d events: file %.1f MiB on disk, %.1f MiB in use\n", st.Nodes, st.LastEventSeq,
		float64(fi.Size())/(1<<20), float64(st.Bytes)/(1<<20))
	return float64(fi.Size()) / (1 << 20), nil
}

// appendRate runs callers concurrent AppendEvents loops for window and
// returns the durable events per second.
func appendRate(ctx context.Context, path string, ev state.Event, window time.Duration, callers int) (float64, error) {
	s, err := state.Open(path, state.Options{})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	var total atomic.Int64
	var firstErr atomic.Value
	var lat []time.Duration
	var latMu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(window)
	for range callers {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(deadline) {
				t := time.Now()
				if _, err := s.AppendEvents(ctx, []state.Event{ev}); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				mine = append(mine, time.Since(t))
				total.Add(1)
			}
			latMu.Lock()
			lat = append(lat, mine...)
			latMu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, ok := firstErr.Load().(error); ok {
		return 0, err
	}
	st, err := s.Stats(ctx)
	if err != nil {
		return 0, err
	}
	if int64(st.LastEventSeq) != total.Load() {
		return 0, fmt.Errorf("store holds %d events, %d appends returned", st.LastEventSeq, total.Load())
	}
	fmt.Printf("state: %d callers, %d events in %.1fs; append latency p50 %.1fms p99 %.1fms\n", callers, total.Load(), elapsed.Seconds(),
		ms(report.Quantile(lat, 0.5)), ms(report.Quantile(lat, 0.99)))
	return float64(total.Load()) / elapsed.Seconds(), nil
}
