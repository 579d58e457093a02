package controller

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/spec/spectest"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// BenchmarkPassConverged measures one pass of a converged 10,000-node
// fleet on the single server's store (bbolt): what every tick costs the
// leader when nothing happens. It reports CPU time per pass beside wall
// time, since wall time on a shared machine is noisy.
//
//	go test ./fleet/controller -run '^$' -bench PassConverged -benchtime 20x
func BenchmarkPassConverged(b *testing.B) {
	const n = 10000
	ctx := context.Background()
	st, err := state.Open(filepath.Join(b.TempDir(), "state.db"), state.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	mem := providertest.NewMemProvider()
	src := spectest.Fleet{Name: "big", Min: 1, Max: n, Desired: n}.HCL()
	var f state.Fleet
	if err := st.Update(ctx, func(tx state.Tx) error {
		f, err = tx.PutFleet(state.Fleet{Name: "big", Filename: "big.hcl", Source: []byte(src)})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	pcfg := providers.Config{Fleet: "big"}
	offs, err := mem.Offerings(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	var off providers.Offering
	for _, o := range offs {
		if o.InstanceType == "m1.gpu1" && o.CapacityType == providers.Spot && o.Zone == "mem-1a" {
			off = o
		}
	}
	ins, err := mem.Create(ctx, pcfg, providers.LaunchRequest{Offering: off, Count: n, IdempotencyToken: "bench",
		Tags: map[string]string{providers.TagFleet: "big", providers.TagDaemonID: "d-bench", providers.TagIncarnation: f.Incarnation}})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC()
	for start := 0; start < n; start += 1000 {
		if err := st.Update(ctx, func(tx state.Tx) error {
			for i := start; i < min(start+1000, n); i++ {
				if err := tx.PutNode(state.Node{ID: fmt.Sprintf("big-%s-%d-abcd", f.Incarnation, i+1), Fleet: "big", State: state.NodeRunning,
					Reason: "bench setup", Offering: off, InstanceID: ins[i].ID, Address: fmt.Sprintf("10.%d.%d.%d", 1+i/65536, (i/256)%256, i%256),
					CreatedAt: now, UpdatedAt: now}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	c := New(Options{Store: st, Providers: memProviders{mem}, Specs: parsedSpecs{}, Recorder: &countingRecorder{}, Boot: fixedBoot{},
		DaemonID: "d-bench", StartedAt: now.Add(-time.Hour)})
	// A first pass settles what a new runtime writes once.
	if err := c.Reconcile(ctx, f); err != nil {
		b.Fatal(err)
	}
	creates := mem.Calls(providertest.OpCreate)
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ResetTimer()
	start := cpu()
	for b.Loop() {
		if err := c.Reconcile(ctx, f); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpu()-start)/float64(b.N)/1e6, "cpu-ms/pass")
	b.StopTimer()
	if got := mem.Calls(providertest.OpCreate); got != creates {
		b.Fatalf("the pass launched %d times over a converged fleet", got-creates)
	}
}
