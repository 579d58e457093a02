package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/fleetd/fleetd/bench/internal/report"
	"github.com/fleetd/fleetd/fleet/cluster"
	"github.com/fleetd/fleetd/fleet/state"
)

// writeCount updates are timed on each store.
const writeCount = 500

// benchWrites times one durable update (a node record and an event, what a
// node transition writes) on bbolt and on a three-member etcd on loopback,
// both fsyncing.
func benchWrites(r *report.Reporter) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "fleetd-bench-writes-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	bolt, err := state.Open(filepath.Join(dir, "state.db"), state.Options{})
	if err != nil {
		return err
	}
	if err := reportWrites(ctx, r, bolt, "bbolt", "bbolt"); err != nil {
		return err
	}

	members, cfg, err := startMembers(ctx, dir)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer func() {
		for _, m := range members {
			m.Close()
		}
	}()
	cli, err := cluster.Connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	et, err := state.OpenEtcd(ctx, cli, state.EtcdOptions{Prefix: "/bench/state/"})
	if err != nil {
		return err
	}
	return reportWrites(ctx, r, et, "etcd3", "etcd (3 members)")
}

// reportWrites times the updates on st, closes it and reports the figures
// ha.write.NAME.p50 and .p99; label names the store in the output.
func reportWrites(ctx context.Context, r *report.Reporter, st state.Store, name, label string) error {
	p50, p99, err := timeWrites(ctx, st)
	st.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", label, err)
	}
	fmt.Printf("%s: p50 %.2f ms, p99 %.2f ms over %d updates\n", label, p50, p99, writeCount)
	r.Info("ha.write."+name+".p50", p50, "ms")
	r.Info("ha.write."+name+".p99", p99, "ms")
	return nil
}

func startMembers(ctx context.Context, dir string) ([]*cluster.Member, *cluster.Config, error) {
	names := []string{"a", "b", "c"}
	initial := map[string]string{}
	var clients []string
	embeds := map[string]*cluster.EmbeddedConfig{}
	for _, n := range names {
		peer, client := "http://"+freeAddr(), "http://"+freeAddr()
		initial[n] = peer
		clients = append(clients, client)
		embeds[n] = &cluster.EmbeddedConfig{Name: n, ListenPeer: peer, ListenClient: client, DataDir: filepath.Join(dir, "etcd-"+n)}
	}
	type res struct {
		m   *cluster.Member
		err error
	}
	ch := make(chan res, len(names))
	for _, n := range names {
		e := embeds[n]
		e.InitialCluster, e.ClientEndpoints = initial, clients
		go func() {
			m, err := cluster.StartMember(ctx, e)
			ch <- res{m, err}
		}()
	}
	var members []*cluster.Member
	var firstErr error
	for range names {
		r := <-ch
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
		if r.m != nil {
			members = append(members, r.m)
		}
	}
	if firstErr != nil {
		for _, m := range members {
			m.Close()
		}
		return nil, nil, firstErr
	}
	cfg := &cluster.Config{Embedded: embeds["a"]}
	if err := cfg.Finish("", dir); err != nil {
		return nil, nil, err
	}
	return members, cfg, nil
}

// timeWrites runs writeCount updates and returns the 50th and 99th
// percentile latency in milliseconds.
func timeWrites(ctx context.Context, st state.Store) (p50, p99 float64, err error) {
	if err := st.Update(ctx, func(tx state.Tx) error {
		_, err := tx.PutFleet(state.Fleet{Name: "bench"})
		return err
	}); err != nil {
		return 0, 0, err
	}
	lat := make([]float64, 0, writeCount)
	for i := range writeCount {
		n := state.Node{Fleet: "bench", ID: fmt.Sprintf("bench-1-%d", i%100), State: state.NodeRunning}
		start := time.Now()
		err := st.Update(ctx, func(tx state.Tx) error {
			if err := tx.PutNode(n); err != nil {
				return err
			}
			_, err := tx.AppendEvent(state.Event{Fleet: "bench", Node: n.ID, Type: "node.transition", Message: "bench"})
			return err
		})
		if err != nil {
			return 0, 0, err
		}
		lat = append(lat, float64(time.Since(start).Microseconds())/1000)
	}
	sort.Float64s(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100], nil
}
