package state_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/fleetd/fleetd/fleet/state"
)

// Benchmarks use the durable (fsync) configuration, since that is what the
// daemon pays for. They report throughput; nothing asserts on it.

func openBench(b *testing.B) *state.BoltStore {
	b.Helper()
	s, err := state.Open(filepath.Join(b.TempDir(), "state.db"), state.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkAppendEvents compares batched appends (concurrent callers share
// a transaction and an fsync) with one Update per event.
func BenchmarkAppendEvents(b *testing.B) {
	ctx := context.Background()
	ev := state.Event{Fleet: "bench", Node: "n1", Type: "node.transition", Message: "booting → joined",
		Data: map[string]string{"from": "booting", "to": "joined"}}
	b.Run("batched-parallel", func(b *testing.B) {
		s := openBench(b)
		b.SetParallelism(8) // many goroutines per CPU: callers mostly wait on fsync
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.AppendEvents(ctx, []state.Event{ev}); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
	b.Run("update-parallel", func(b *testing.B) {
		s := openBench(b)
		b.SetParallelism(8)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				err := s.Update(ctx, func(tx state.Tx) error {
					_, err := tx.AppendEvent(ev)
					return err
				})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
}

// BenchmarkPutNode measures durable node transitions (one Update each), the
// write the reconciler makes before acting on a node.
func BenchmarkPutNode(b *testing.B) {
	ctx := context.Background()
	s := openBench(b)
	err := s.Update(ctx, func(tx state.Tx) error {
		_, err := tx.PutFleet(state.Fleet{Name: "bench"})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	states := []state.NodeState{state.NodeRequested, state.NodeProvisioning, state.NodeBooting, state.NodeJoined, state.NodeRunning}
	var i atomic.Int64
	b.ResetTimer()
	for b.Loop() {
		n := i.Add(1)
		err := s.Update(ctx, func(tx state.Tx) error {
			return tx.PutNode(state.Node{ID: fmt.Sprintf("n%03d", n%64), Fleet: "bench", State: states[n%int64(len(states))]})
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "nodes/s")
}
