package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec/spectest"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// fleetSpec is the fleet every scale benchmark applies: min = max = n, so
// the rendezvous round closes on the n-th join and every replacement
// restores min_nodes (never a growth wave that would wait for the
// scale-up cooldown). colocate = "region" lets a replacement use the other
// zone's spot capacity once its own offering is marked interrupted (with
// "zone", the in-memory catalog leaves no spot offering to replace into).
// The rendezvous timings are the spec defaults except dead_after, which
// the reconcile benchmark raises (see benchReconcile).
func fleetSpec(name string, n int, deadAfter time.Duration) string {
	return spectest.Fleet{
		Name: name, Min: n, Max: n, Spot: true,
		LastCall: "5s", Heartbeat: "2s", DeadAfter: deadAfter.String(),
	}.HCL()
}

// launchRecord is one Create call the daemon made.
type launchRecord struct {
	At   time.Time
	Node string
}

// recordingProvider is the in-memory provider with a log of Create calls:
// the moment the daemon asked the "cloud" for each replacement.
type recordingProvider struct {
	*providertest.MemProvider
	mu      sync.Mutex
	creates []launchRecord
}

func (r *recordingProvider) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	r.mu.Lock()
	r.creates = append(r.creates, launchRecord{At: time.Now(), Node: req.Tags[providers.TagNodeID]})
	r.mu.Unlock()
	return r.MemProvider.Create(ctx, cfg, req)
}

// Creates returns the Create calls made at or after since.
func (r *recordingProvider) Creates(since time.Time) []launchRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []launchRecord
	for _, c := range r.creates {
		if !c.At.Before(since) {
			out = append(out, c)
		}
	}
	return out
}

// warnCounter is a slog handler that counts the daemon's warnings and
// errors by message (they say when the daemon sheds load).
type warnCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (w *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnCounter) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	w.counts[r.Level.String()+": "+r.Message]++
	w.mu.Unlock()
	return nil
}
func (w *warnCounter) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnCounter) WithGroup(string) slog.Handler      { return w }

// Lines returns "N× LEVEL: message" for every distinct warning, sorted.
func (w *warnCounter) Lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for m, n := range w.counts {
		out = append(out, fmt.Sprintf("%d× %s", n, m))
	}
	sort.Strings(out)
	return out
}

// benchDaemon is a real fleetd daemon (fleet.New, the same wiring as
// `fleetd serve`: default tick, default reconcile parameters, bbolt state
// with fsync) serving HTTP on loopback, with the in-memory provider.
type benchDaemon struct {
	*fleet.Daemon
	mem    *recordingProvider
	fleet  string
	inc    string // the fleet's incarnation, read by populate
	warns  *warnCounter
	cancel context.CancelFunc
	done   chan error
}

// newBenchDaemon creates the daemon, applies a fleet of n nodes and
// records n nodes in state nodeState with live instances, as a daemon
// restarted under a fleet of that size finds them. It does not serve yet.
func newBenchDaemon(ctx context.Context, dataDir, fleetName string, n int, nodeState state.NodeState, deadAfter time.Duration, opts ...func(*fleet.Config)) (*benchDaemon, error) {
	cfg := fleet.DefaultConfig()
	cfg.Listen, cfg.DataDir, cfg.TokenFile = "127.0.0.1:0", dataDir, ""
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.Finish(); err != nil {
		return nil, err
	}
	mem := &recordingProvider{MemProvider: providertest.NewMemProvider()}
	warns := &warnCounter{counts: map[string]int{}}
	d, err := fleet.New(ctx, fleet.Options{Config: cfg, Version: "bench", Logger: slog.New(warns),
		Schema: func(name string) (providers.ConfigSchema, bool) {
			if name == providertest.MemName {
				return providertest.MemSchema, true
			}
			return providers.ConfigSchema{}, false
		},
		Providers: providertest.Static{providertest.MemName: mem}})
	if err != nil {
		return nil, fmt.Errorf("new daemon: %w", err)
	}
	bd := &benchDaemon{Daemon: d, mem: mem, fleet: fleetName, warns: warns}
	if _, err := d.Apply(ctx, api.ApplyRequest{Filename: "bench.hcl", Source: fleetSpec(fleetName, n, deadAfter)}); err != nil {
		d.Close()
		return nil, fmt.Errorf("apply: %w", err)
	}
	if err := bd.populate(ctx, n, nodeState); err != nil {
		d.Close()
		return nil, fmt.Errorf("populate %d nodes: %w", n, err)
	}
	return bd, nil
}

// populate launches n instances on the in-memory provider, tagged like the
// daemon tags its launches, and records their nodes in one transaction.
func (bd *benchDaemon) populate(ctx context.Context, n int, st state.NodeState) error {
	pcfg := providers.Config{Fleet: bd.fleet, Raw: json.RawMessage("{}")}
	offs, err := bd.mem.Offerings(ctx, pcfg)
	if err != nil {
		return err
	}
	var off providers.Offering
	for _, o := range offs {
		if o.InstanceType == "m1.gpu1" && o.CapacityType == providers.Spot && o.Zone == "mem-1a" {
			off = o
		}
	}
	if off.InstanceType == "" {
		return errors.New("the in-memory catalog has no m1.gpu1 spot offering in mem-1a")
	}
	if err := bd.Store().View(ctx, func(tx state.Tx) error {
		f, err := tx.Fleet(bd.fleet)
		bd.inc = f.Incarnation
		return err
	}); err != nil {
		return err
	}
	// One Create for all instances: the in-memory provider scans every
	// live instance on each Create, so n single launches would cost O(n²)
	// in setup alone. Nodes find their instance by InstanceID, as after a
	// daemon restart, so the instances need no per-node tag.
	ins, err := bd.mem.MemProvider.Create(ctx, pcfg, providers.LaunchRequest{Offering: off, Count: n, IdempotencyToken: "bench-populate",
		Tags: map[string]string{providers.TagFleet: bd.fleet, providers.TagDaemonID: bd.DaemonID(), providers.TagIncarnation: bd.inc}})
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	nodes := make([]state.Node, 0, n)
	for i := range n {
		nodes = append(nodes, state.Node{ID: bd.nodeID(i), Fleet: bd.fleet, State: st, Reason: "bench setup", Offering: off,
			InstanceID: ins[i].ID, Address: agentAddr(i), CreatedAt: now, UpdatedAt: now})
	}
	// Several transactions: one 10,000-node transaction is fine for bbolt,
	// but this mirrors how the daemon writes (small transactions).
	for start := 0; start < len(nodes); start += 1000 {
		batch := nodes[start:min(start+1000, len(nodes))]
		if err := bd.Store().Update(ctx, func(tx state.Tx) error {
			for _, nd := range batch {
				if err := tx.PutNode(nd); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// agentAddr is a distinct address per simulated node (never bound: only
// the rendezvous sees it).
func agentAddr(i int) string { return fmt.Sprintf("10.%d.%d.%d", 1+i/65536, (i/256)%256, i%256) }

// nodeID is the id populate gives node i, in the daemon's form
// (<fleet>-<incarnation>-<n>-<random>, here a fixed "part").
func (bd *benchDaemon) nodeID(i int) string {
	return fmt.Sprintf("%s-%s-%d-part", bd.fleet, bd.inc, i+1)
}

// start serves the API and runs the reconcile loop.
func (bd *benchDaemon) start(ctx context.Context) error {
	if err := bd.Listen(); err != nil {
		return err
	}
	ctx, bd.cancel = context.WithCancel(ctx)
	bd.done = make(chan error, 1)
	go func() { bd.done <- bd.Run(ctx) }()
	return nil
}

// stop shuts the daemon down and closes its state.
func (bd *benchDaemon) stop() {
	if bd.cancel != nil {
		bd.cancel()
		<-bd.done
		bd.cancel = nil
	}
	bd.Close()
}

// countStates counts the fleet's nodes by state.
func (bd *benchDaemon) countStates(ctx context.Context) (map[state.NodeState]int, error) {
	out := map[state.NodeState]int{}
	err := bd.Store().View(ctx, func(tx state.Tx) error {
		nodes, err := tx.Nodes(bd.fleet)
		for _, n := range nodes {
			out[n.State]++
		}
		return err
	})
	return out, err
}

// reconcileStats reads the daemon's reconcile-duration histogram for the
// fleet from /metrics: passes so far, their total seconds, and how many
// took at most le seconds (le must be a bucket bound).
type reconcileStats struct {
	Count, UnderLE float64
	Sum            float64
}

func (bd *benchDaemon) reconcileStats(ctx context.Context, le string) (reconcileStats, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, bd.URL()+"/metrics", nil)
	if err != nil {
		return reconcileStats{}, err
	}
	req.Header.Set("Authorization", "Bearer "+bd.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reconcileStats{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return reconcileStats{}, fmt.Errorf("/metrics: HTTP %d: %s", resp.StatusCode, b)
	}
	return parseReconcileStats(resp.Body, bd.fleet, le)
}

// parseReconcileStats picks the fleet's fleetd_reconcile_duration_seconds
// series out of a Prometheus text exposition.
func parseReconcileStats(r io.Reader, fleetName, le string) (reconcileStats, error) {
	var st reconcileStats
	found := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	label := `fleet="` + fleetName + `"`
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "fleetd_reconcile_duration_seconds") || !strings.Contains(line, label) {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		labels, val, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return st, fmt.Errorf("metrics line %q: %w", line, err)
		}
		switch name {
		case "fleetd_reconcile_duration_seconds_count":
			st.Count, found = v, true
		case "fleetd_reconcile_duration_seconds_sum":
			st.Sum = v
		case "fleetd_reconcile_duration_seconds_bucket":
			if strings.Contains(labels, `le="`+le+`"`) {
				st.UnderLE = v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return st, err
	}
	if !found {
		return st, fmt.Errorf("no fleetd_reconcile_duration_seconds series for fleet %s", fleetName)
	}
	return st, nil
}

// diagnose prints what the daemon did: its events by type and its
// warnings (after a failed phase).
func (bd *benchDaemon) diagnose(ctx context.Context, name string) {
	evs, err := bd.Store().Events(ctx, 0, 0)
	if err != nil {
		fmt.Printf("%s: events: %v\n", name, err)
	}
	byType := map[string]int{}
	for _, e := range evs {
		byType[e.Type]++
	}
	var types []string
	for t, n := range byType {
		types = append(types, fmt.Sprintf("%s=%d", t, n))
	}
	sort.Strings(types)
	fmt.Printf("%s: daemon events: %s\n", name, strings.Join(types, " "))
	shown := 0
	for _, e := range evs {
		switch e.Type {
		case "rendezvous.round_opened", "rendezvous.round_closed", "alert", "offering.unavailable":
			if shown++; shown <= 40 {
				fmt.Printf("%s:   %s %s: %s\n", name, e.Time.Format("15:04:05.000"), e.Type, e.Message)
			}
		}
	}
	for _, l := range bd.warns.Lines() {
		fmt.Printf("%s: daemon log: %s\n", name, l)
	}
}
