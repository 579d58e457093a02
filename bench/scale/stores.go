package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fleetd/fleetd/bench/internal/report"
	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/fleet/cluster"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/internal/freeport"
)

// benchStores runs the same n-node fleet on the single server's bbolt
// store and on etcd (one embedded member on loopback, the server elected
// leader as in a cluster) and measures what a reconcile pass pays for its
// state: reading every node of the fleet, and the daemon's whole pass from
// /metrics. etcd's figures include the network round trips and the
// election fence every write carries; they are what an HA deployment
// costs per pass, not a separate target.
func benchStores(ctx context.Context, r *report.Reporter, p params) error {
	for _, store := range []string{"bbolt", "etcd"} {
		if err := benchStore(ctx, r, p, store); err != nil {
			return fmt.Errorf("%s: %w", store, err)
		}
	}
	return nil
}

func benchStore(ctx context.Context, r *report.Reporter, p params, store string) error {
	n := p.Nodes
	name := fmt.Sprintf("stores.%s.%d", store, n)
	dir, ctx, done, err := scratch(ctx, "stores", 4*time.Minute)
	if err != nil {
		return err
	}
	defer done()
	var opts []func(*fleet.Config)
	if store == "etcd" {
		peer, err := loopbackURL()
		if err != nil {
			return err
		}
		client, err := loopbackURL()
		if err != nil {
			return err
		}
		opts = append(opts, func(c *fleet.Config) {
			c.Cluster = &cluster.Config{Embedded: &cluster.EmbeddedConfig{
				Name: "bench", ListenPeer: peer, ListenClient: client,
				InitialCluster: map[string]string{"bench": peer},
			}}
		})
	}
	setup := time.Now()
	// Setup writes (apply, populate) happen before the server campaigns,
	// like a server's own bootstrap, so they carry no fence.
	bd, err := newBenchDaemon(ctx, filepath.Join(dir, "data"), "big", n, state.NodeRunning, 10*time.Minute, opts...)
	if err != nil {
		return err
	}
	defer bd.stop()
	fmt.Printf("%s: %d nodes recorded in %.1fs\n", name, n, time.Since(setup).Seconds())

	var reads []time.Duration
	for range 7 {
		start := time.Now()
		var got int
		if err := bd.Store().View(ctx, func(tx state.Tx) error {
			nodes, err := tx.Nodes(bd.fleet)
			got = len(nodes)
			return err
		}); err != nil {
			return err
		}
		if got != n {
			return fmt.Errorf("read %d nodes, want %d", got, n)
		}
		reads = append(reads, time.Since(start))
	}
	fmt.Printf("%s: read all nodes: min %.1fms median %.1fms max %.1fms\n", name,
		ms(report.Quantile(reads, 0)), ms(report.Quantile(reads, 0.5)), ms(report.Quantile(reads, 1)))
	r.Info(name+".read_nodes_median", ms(report.Quantile(reads, 0.5)), "ms")

	if err := bd.start(ctx); err != nil {
		return err
	}
	mean, err := daemonPasses(ctx, bd, name, p.DaemonPasses, 60*time.Second)
	if err != nil {
		return err
	}
	r.Info(name+".pass_daemon_mean", mean, "ms")
	// populate launches around the recorder: any Create here is the
	// daemon's, over a fleet that needs none.
	if launched := len(bd.mem.Creates(setup)); launched > 0 {
		return fmt.Errorf("the daemon launched %d times over a converged fleet", launched)
	}
	return nil
}

// loopbackURL is an http URL on a free loopback port.
func loopbackURL() (string, error) {
	addr, err := freeport.Addr()
	if err != nil {
		return "", err
	}
	return "http://" + addr, nil
}
