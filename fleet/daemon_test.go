package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec/spectest"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/providers"
	awsprov "github.com/fleetd/fleetd/providers/aws"
	gcpprov "github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/providertest"
	"github.com/fleetd/fleetd/rendezvous"
)

type staticProviders = providertest.Static

// memSpec is the fleet most daemon tests apply; tests derive variants by
// replacing its lines, so spectest keeps them word for word.
var memSpec = memFleetSpec("train", 2, 3, "200ms", "20s", "60s")

// memFleetSpec is one fleet on the mem provider with the size and
// rendezvous timers a test needs.
func memFleetSpec(name string, minNodes, maxNodes int, lastCall, heartbeat, deadAfter string) string {
	return spectest.Fleet{Name: name, Min: minNodes, Max: maxNodes, LastCall: lastCall, Heartbeat: heartbeat, DeadAfter: deadAfter}.HCL()
}

type testDaemon struct {
	*Daemon
	mem    *providertest.MemProvider
	client *api.Client
	// httpc makes raw requests (call); it trusts the daemon's CA.
	httpc  *http.Client
	cancel context.CancelFunc
	done   chan error
}

func startTestDaemon(t *testing.T, dataDir string, mem *providertest.MemProvider) *testDaemon {
	t.Helper()
	return launchTestDaemon(t, dataDir, staticProviders{providertest.MemName: mem}, mem, Options{})
}

// startBooting runs a daemon on a fresh mem provider with memSpec applied,
// returning once the fleet's 3 nodes boot.
func startBooting(t *testing.T) (*testDaemon, *providertest.MemProvider) {
	t.Helper()
	mem := providertest.NewMemProvider()
	td := startTestDaemon(t, t.TempDir(), mem)
	td.apply(context.Background(), t, "train.hcl", memSpec)
	waitFor(t, "3 booting nodes", 10*time.Second, func() bool { return countState(td.nodes(t, "train"), state.NodeBooting) == 3 })
	return td, mem
}

// launchTestDaemon runs a daemon in-process on 127.0.0.1 with the given
// providers (their schemas come from the built-in packages or the mem
// provider) and options (Tick defaults to 100ms); it stops at cleanup.
func launchTestDaemon(t *testing.T, dataDir string, provs staticProviders, mem *providertest.MemProvider, opts Options) *testDaemon {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen, cfg.DataDir, cfg.TokenFile = "127.0.0.1:0", dataDir, ""
	cfg.AgentDir, cfg.Cluster, cfg.Projects = opts.Config.AgentDir, opts.Config.Cluster, opts.Config.Projects
	if err := cfg.Finish(); err != nil {
		t.Fatal(err)
	}
	opts.Config, opts.Providers = cfg, provs
	if opts.Version == "" {
		opts.Version = "test"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Tick == 0 {
		opts.Tick = 100 * time.Millisecond
	}
	opts.Schema = func(name string) (providers.ConfigSchema, bool) {
		if _, ok := provs[name]; !ok {
			return providers.ConfigSchema{}, false
		}
		switch name {
		case providertest.MemName:
			return providertest.MemSchema, true
		case awsprov.Name:
			return awsprov.Schema, true
		case gcpprov.Name:
			return gcpprov.Schema, true
		}
		return providers.ConfigSchema{}, false
	}
	return runTestDaemon(t, opts, mem)
}

// runTestDaemon runs the daemon opts make (its Config finished) on its
// listener until cleanup, with a client holding the admin token (and
// pinning the daemon's CA when it serves TLS).
func runTestDaemon(t *testing.T, opts Options, mem *providertest.MemProvider) *testDaemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d, err := New(ctx, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := d.Listen(); err != nil {
		cancel()
		d.Close()
		t.Fatal(err)
	}
	td := &testDaemon{Daemon: d, mem: mem, cancel: cancel, done: make(chan error, 1)}
	go func() { td.done <- d.Run(ctx) }()
	t.Cleanup(td.stop)
	copts := api.ClientOptions{Token: d.Token()}
	td.httpc = &http.Client{Timeout: 30 * time.Second}
	if d.CA() != nil {
		copts.CAFingerprint = d.CA().Fingerprint
		tc, err := api.ClientTLSConfig(nil, d.CA().Fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		td.httpc.Transport = &http.Transport{TLSClientConfig: tc}
	}
	if td.client, err = api.NewClient(d.URL(), copts); err != nil {
		t.Fatal(err)
	}
	return td
}

// call makes one request with the given Authorization header value ("" for
// none) and returns the status, body and headers.
func (td *testDaemon) call(t *testing.T, method, path, authz string, body []byte, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, td.URL()+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := td.httpc.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp.StatusCode, nil, resp.Header // endless: the status is the answer
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, resp.Header
}

// apply applies src as filename, failing the test on an error.
func (td *testDaemon) apply(ctx context.Context, t *testing.T, filename, src string) {
	t.Helper()
	if _, err := td.client.Apply(ctx, api.ApplyRequest{Filename: filename, Source: src}); err != nil {
		t.Fatal(err)
	}
}

func (td *testDaemon) stop() {
	if td.cancel == nil {
		return
	}
	td.cancel()
	<-td.done
	td.Close()
	td.cancel = nil
}

// agentCall makes an agent API call with the node's own token.
func (td *testDaemon) agentCall(t *testing.T, fleet, node, op string, body any) int {
	t.Helper()
	return td.nodePost(t, fleet, node, op, body, nil)
}

func (td *testDaemon) nodes(t *testing.T, fleet string) []state.Node {
	t.Helper()
	return stateView(t, td, func(tx state.Tx) ([]state.Node, error) { return tx.Nodes(fleet) })
}

// stateView reads a value from td's store in a transaction of its own,
// failing t on an error.
func stateView[T any](t *testing.T, td *testDaemon, read func(state.Tx) (T, error)) T {
	t.Helper()
	var v T
	if err := td.Store().View(context.Background(), func(tx state.Tx) error {
		var err error
		v, err = read(tx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, timeout, 20*time.Millisecond, what, cond)
}

func countState(nodes []state.Node, s state.NodeState) int {
	n := 0
	for _, x := range nodes {
		if x.State == s {
			n++
		}
	}
	return n
}

// joinAll registers each booting node's agent and joins it to the
// rendezvous, like real agents do.
func (td *testDaemon) joinAll(t *testing.T, fleet string, joined map[string]bool) {
	t.Helper()
	for i, n := range td.nodes(t, fleet) {
		if joined[n.ID] || n.State != state.NodeBooting {
			continue
		}
		addr := fmt.Sprintf("127.0.0.%d", 10+i)
		if code := td.agentCall(t, fleet, n.ID, "register", api.RegisterRequest{Address: addr, Zone: n.Offering.Zone}); code != 200 {
			t.Fatalf("register %s: HTTP %d", n.ID, code)
		}
		c := rendezvous.NewClient(td.URL(), td.NodeToken(fleet, n.ID), nil)
		if _, err := c.Join(context.Background(), fleet, rendezvous.JoinRequest{NodeID: n.ID, Addr: addr, Zone: n.Offering.Zone, Nproc: 1, Session: "s-" + n.ID}); err != nil {
			t.Fatalf("join %s: %v", n.ID, err)
		}
		joined[n.ID] = true
	}
}

// joinBooting waits until booting nodes of fleet boot, joins them as their
// agents would (joinAll) and waits until running nodes run.
func (td *testDaemon) joinBooting(t *testing.T, fleet string, booting, running int, joined map[string]bool) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d booting nodes", booting), 10*time.Second, func() bool { return countState(td.nodes(t, fleet), state.NodeBooting) == booting })
	td.joinAll(t, fleet, joined)
	waitFor(t, fmt.Sprintf("%d running nodes", running), 10*time.Second, func() bool { return countState(td.nodes(t, fleet), state.NodeRunning) == running })
}

func TestDaemonConvergesAndReplacesOnNotice(t *testing.T) {
	td, mem := startBooting(t)
	ctx := context.Background()
	if mem.Live() != 3 {
		t.Fatalf("live instances = %d, want 3", mem.Live())
	}
	joined := map[string]bool{}
	td.joinAll(t, "train", joined)
	waitFor(t, "3 running nodes", 10*time.Second, func() bool { return countState(td.nodes(t, "train"), state.NodeRunning) == 3 })

	// A spot notice on one node: replacement launch requested within 1 s.
	victim := td.nodes(t, "train")[0]
	createsBefore := mem.Calls(providertest.OpCreate)
	noticeAt := time.Now()
	if code := td.agentCall(t, "train", victim.ID, "notice", api.NoticeRequest{Kind: "spot-interruption", Deadline: time.Now().Add(2 * time.Minute), Source: "imds"}); code != http.StatusAccepted {
		t.Fatalf("notice: HTTP %d", code)
	}
	defer func() {
		if t.Failed() {
			dumpEvents(t, td)
		}
	}()
	waitFor(t, "replacement launch", 5*time.Second, func() bool { return mem.Calls(providertest.OpCreate) > createsBefore })
	if d := time.Since(noticeAt); d > time.Second {
		t.Errorf("replacement requested %s after the notice, want ≤ 1s", d)
	}
	// The victim is draining and out of the rendezvous at once.
	st, err := td.rdzv.rz().Status("train")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.NodeID == victim.ID {
			t.Fatalf("victim still a rendezvous member: %+v", m)
		}
	}
	// Duplicate notices from another source are one event.
	td.agentCall(t, "train", victim.ID, "notice", api.NoticeRequest{Kind: "spot-interruption", Source: "sqs"})

	// The replacement's agent joins; the fleet returns to 3 running nodes.
	waitFor(t, "replacement booting", 5*time.Second, func() bool { return countState(td.nodes(t, "train"), state.NodeBooting) == 1 })
	td.joinAll(t, "train", joined)
	waitFor(t, "3 running again", 10*time.Second, func() bool { return countState(td.nodes(t, "train"), state.NodeRunning) == 3 })

	evs, err := td.client.Events(ctx, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	notices := 0
	for _, e := range evs.Events {
		if e.Type == "notice" && e.Node == victim.ID {
			notices++
		}
	}
	if notices != 1 {
		t.Errorf("%d notice events for the victim, want 1 (idempotent)", notices)
	}
}

func TestDaemonNodeTokenScope(t *testing.T) {
	mem := providertest.NewMemProvider()
	td := startTestDaemon(t, t.TempDir(), mem)
	td.apply(context.Background(), t, "train.hcl", memSpec)
	waitFor(t, "nodes", 10*time.Second, func() bool { return len(td.nodes(t, "train")) >= 2 })
	ns := td.nodes(t, "train")
	a, b := ns[0].ID, ns[1].ID
	// Node a's token acting on node b is forbidden; no token is 401; a node
	// token is not an admin token.
	tokA := "Bearer " + td.NodeToken("train", a)
	body, _ := json.Marshal(api.RegisterRequest{Address: "127.0.0.9"})
	if code, _, _ := td.call(t, "POST", "/v1/agent/train/"+b+"/register", tokA, body); code != http.StatusForbidden {
		t.Fatalf("cross-node token: HTTP %d, want 403", code)
	}
	if code, _, _ := td.call(t, "GET", "/v1/status", tokA, nil); code != http.StatusUnauthorized {
		t.Fatalf("node token on admin API: HTTP %d, want 401", code)
	}
}
