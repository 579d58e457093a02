package fleet

// Fuzz targets for every request the daemon accepts, driven through the
// daemon's real handler (auth, body limits, decoding, the backend, the
// store, the rendezvous service). Each asserts: no panic, no hang, never a
// 5xx, and a refused request (4xx) changes nothing — fleets, nodes, the
// event log, the offerings records, the rendezvous rounds, the log ring and
// the notices taken are all as they were.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/providers/providertest"
	"github.com/fleetd/fleetd/rendezvous"
)

// fuzzSpec is memSpec with timers no fuzz run outlives: nothing changes
// between two looks at the state except through a request.
var fuzzSpec = memFleetSpec("train", 2, 3, "1h", "10m", "2h")

// fuzzDaemon is a daemon without a reconcile loop or listener: requests go
// to its Handler, so the state changes only through them.
type fuzzDaemon struct {
	*Daemon
	nodes []string // ids of the fleet's nodes, all with instances
}

func newFuzzDaemon(tb testing.TB) *fuzzDaemon {
	tb.Helper()
	dir, err := os.MkdirTemp("", "fleetd-fuzz-")
	if err != nil {
		tb.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Listen, cfg.DataDir, cfg.TokenFile = "127.0.0.1:0", dir, ""
	if err := cfg.Finish(); err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	d, err := New(ctx, Options{Config: cfg, Version: "fuzz", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Schema: memSchema, Providers: staticProviders{providertest.MemName: providertest.NewMemProvider()}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		d.Close()
		os.RemoveAll(dir)
	})
	fd := &fuzzDaemon{Daemon: d}
	if rec := fd.serve(tb, "POST", "/v1/fleets", "Bearer "+d.Token(), mustJSON(api.ApplyRequest{Filename: "train.hcl", Source: fuzzSpec})); rec.Code != 200 {
		tb.Fatalf("apply: HTTP %d %s", rec.Code, rec.Body)
	}
	// Reconcile passes, as the loop would run them, until the nodes exist.
	for range 20 {
		d.ctrl.ReconcileAll(ctx)
		var nodes []state.Node
		_ = d.store.View(ctx, func(tx state.Tx) error {
			nodes, err = tx.Nodes("train")
			return err
		})
		fd.nodes = fd.nodes[:0]
		for _, n := range nodes {
			if n.InstanceID != "" {
				fd.nodes = append(fd.nodes, n.ID)
			}
		}
		if len(fd.nodes) >= 3 {
			break
		}
	}
	if len(fd.nodes) < 2 {
		tb.Fatalf("only %d nodes launched", len(fd.nodes))
	}
	// Node 0 registered and both in the rendezvous, so heartbeats, leaves
	// and watches have members to act on.
	a, b := fd.nodes[0], fd.nodes[1]
	if rec := fd.serve(tb, "POST", "/v1/agent/train/"+a+"/register", "Bearer "+d.NodeToken("train", a), []byte(`{"address":"127.0.0.21"}`)); rec.Code != 200 {
		tb.Fatalf("register: HTTP %d %s", rec.Code, rec.Body)
	}
	for i, id := range []string{a, b} {
		body := mustJSON(rendezvous.JoinRequest{NodeID: id, Addr: fmt.Sprintf("127.0.0.%d", 21+i), Nproc: 1, Session: "s"})
		if rec := fd.serve(tb, "POST", "/v1/rendezvous/train/join", "Bearer "+d.NodeToken("train", id), body); rec.Code != 200 {
			tb.Fatalf("join: HTTP %d %s", rec.Code, rec.Body)
		}
	}
	fd.drainRendezvousEvents()
	return fd
}

// serve runs one request through the handler. It fails on a request that
// does not return within 10 s of its own deadline (a hang). Reads get a
// short deadline (long-polls end there); writes a long one, so a slow
// fsync is not mistaken for a failure.
func (fd *fuzzDaemon) serve(tb testing.TB, method, target, authz string, body []byte) *httptest.ResponseRecorder {
	tb.Helper()
	req := httptest.NewRequest(method, "http://fleetd"+target, bytes.NewReader(body))
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	deadline := 5 * time.Second
	if method == http.MethodGet {
		deadline = 50 * time.Millisecond
	}
	return testutil.ServeWithin(tb, fd.Handler(), req, deadline)
}

// drainRendezvousEvents takes the rendezvous events queued for the event
// log (no writer runs) and says how many there were.
func (fd *fuzzDaemon) drainRendezvousEvents() int {
	n := 0
	for {
		select {
		case <-fd.rdzv.events:
			n++
		default:
			return n
		}
	}
}

// fingerprint is everything a request could change, as JSON.
func (fd *fuzzDaemon) fingerprint(tb testing.TB) []byte {
	tb.Helper()
	ctx := context.Background()
	type fleetState struct {
		Fleet state.Fleet
		Nodes []state.Node
		Rdzv  *rendezvous.Status
		Logs  int
	}
	var out struct {
		Stats     state.Stats
		Fleets    []fleetState
		Offerings []state.OfferingRecord
		Notices   map[string]int
	}
	var err error
	if out.Stats, err = fd.store.Stats(ctx); err != nil {
		tb.Fatal(err)
	}
	err = fd.store.View(ctx, func(tx state.Tx) error {
		fleets, err := tx.Fleets()
		if err != nil {
			return err
		}
		for _, f := range fleets {
			fs := fleetState{Fleet: f, Logs: len(fd.agentAPI.Logs(f.Name, "", 0))}
			if fs.Nodes, err = tx.Nodes(f.Name); err != nil {
				return err
			}
			if st, err := fd.rdzv.rz().Status(f.Name); err == nil {
				fs.Rdzv = &st
			}
			out.Fleets = append(out.Fleets, fs)
		}
		out.Offerings, err = tx.Offerings()
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	out.Notices = map[string]int{}
	for _, f := range out.Fleets {
		if v, ok := fd.ctrl.View(f.Fleet.Name); ok {
			out.Notices[f.Fleet.Name] = v.Notices
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// check runs one request and asserts the fuzz properties. readOnly routes
// must change nothing whatever the answer.
func (fd *fuzzDaemon) check(t *testing.T, method, target, authz string, body []byte, readOnly bool) *httptest.ResponseRecorder {
	t.Helper()
	fd.drainRendezvousEvents()
	before := fd.fingerprint(t)
	rec := fd.serve(t, method, target, authz, body)
	events := fd.drainRendezvousEvents()
	t.Logf("%s %s: HTTP %d", method, target, rec.Code)
	if rec.Code >= 500 {
		t.Fatalf("%s %s: HTTP %d %s\nbody: %q", method, target, rec.Code, rec.Body, body)
	}
	if rec.Code >= 400 || readOnly {
		if after := fd.fingerprint(t); !bytes.Equal(before, after) {
			t.Fatalf("%s %s (HTTP %d %s) changed the state:\nbefore %s\nafter  %s", method, target, rec.Code, rec.Body, before, after)
		}
		if events > 0 {
			t.Fatalf("%s %s (HTTP %d) emitted %d rendezvous events", method, target, rec.Code, events)
		}
	}
	if rec.Code >= 400 && rec.Code != http.StatusNotFound && rec.Code != http.StatusMethodNotAllowed {
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("HTTP %d with a body that is not JSON: %q", rec.Code, rec.Body)
		}
	}
	return rec
}

func specSeeds(f *testing.F) {
	f.Add(mustJSON(api.ApplyRequest{Filename: "train.hcl", Source: fuzzSpec}))
	f.Add(mustJSON(api.ApplyRequest{Filename: "train.hcl", Source: strings.Replace(fuzzSpec, "max_nodes = 3", "max_nodes = 4", 1)}))
	f.Add(mustJSON(api.ApplyRequest{Filename: "other.hcl", Source: strings.Replace(fuzzSpec, `fleet "train"`, `fleet "other"`, 1)}))
	f.Add(mustJSON(api.ApplyRequest{Filename: "v.hcl", Source: "variable \"n\" { default = 2 }\n" + strings.Replace(fuzzSpec, "min_nodes = 2", "min_nodes = var.n", 1), Vars: map[string]string{"n": "3"}}))
	f.Add(mustJSON(api.ApplyRequest{Filename: "f.hcl", Source: strings.Replace(fuzzSpec, `["python3", "train.py"]`, `[file("cmd.txt")]`, 1), BaseDir: "/w", Files: map[string]string{"/w/cmd.txt": "x"}}))
	f.Add(mustJSON(api.ApplyRequest{Filename: "e.hcl", Source: strings.Replace(fuzzSpec, `"train.py"`, `env("SCRIPT")`, 1), Env: map[string]string{"SCRIPT": "t.py"}}))
	f.Add(mustJSON(api.ApplyRequest{Filename: "bad.hcl", Source: `fleet "x" { min_nodes = "many" }`}))
	f.Add(mustJSON(api.ApplyRequest{Source: strings.Replace(fuzzSpec, "min_nodes = 2", "min_nodes = 5", 1)}))
	f.Add(mustJSON(api.ApplyRequest{Source: strings.Replace(fuzzSpec, `provider "mem" {}`, `provider "aws" { regions = ["us-east-1"] }`, 1)}))
	f.Add([]byte(`{"source":"fleet \"a\" {","filename":"x.hcl"}`))
	f.Add([]byte(`{"source":""}`))
	f.Add([]byte(`{"source":"x","extra":1}`))
	f.Add([]byte(`{"source":"x"} trailing`))
	f.Add([]byte(`[1,2,3]`))
	f.Add([]byte(``))
	for _, p := range []string{"local.hcl", "aws.hcl"} {
		if b, err := os.ReadFile(filepath.Join("..", "configs", "examples", p)); err == nil {
			f.Add(mustJSON(api.ApplyRequest{Filename: p, Source: string(b)}))
		}
	}
}

// FuzzPlanRequest: POST /v1/plan never changes anything, valid or not.
func FuzzPlanRequest(f *testing.F) {
	fuzzSpecPost(f, "/v1/plan", true, nil)
}

// fuzzSpecPost fuzzes POST path with spec request bodies as the admin;
// read says it must change nothing; also checks each answer further.
func fuzzSpecPost(f *testing.F, path string, read bool, also func(*testing.T, *httptest.ResponseRecorder)) {
	specSeeds(f)
	fd := newFuzzDaemon(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := fd.check(t, "POST", path, "Bearer "+fd.Token(), body, read)
		if also != nil {
			also(t, rec)
		}
	})
}

// FuzzApplyRequest: POST /v1/fleets either applies a valid spec or refuses
// with a clear error and changes nothing.
func FuzzApplyRequest(f *testing.F) {
	fuzzSpecPost(f, "/v1/fleets", false, func(t *testing.T, rec *httptest.ResponseRecorder) {
		if rec.Code == http.StatusUnprocessableEntity {
			var e api.Error
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || len(e.Diagnostics) == 0 {
				t.Fatalf("a spec error without diagnostics: %s", rec.Body)
			}
			for _, d := range e.Diagnostics {
				if d.Summary == "" {
					t.Fatalf("a diagnostic without a summary: %s", rec.Body)
				}
			}
		}
	})
}

// FuzzOfferingsRequest: POST /v1/offerings is a read.
func FuzzOfferingsRequest(f *testing.F) {
	fuzzSpecPost(f, "/v1/offerings", true, nil)
}

// FuzzAgentRequest: the agent routes with the node's own token, for the
// fleet's nodes and one that does not exist.
func FuzzAgentRequest(f *testing.F) {
	for op := range uint8(4) {
		for _, b := range []string{
			`{"address":"127.0.0.31","zone":"z1","instance_id":"i-1","agent_version":"v1"}`,
			`{"kind":"spot-interruption","deadline":"2030-01-01T00:00:00Z","source":"imds","detail":"d","id":"n-1"}`,
			`{"kind":"rebalance","source":"imds"}`,
			`{"kind":"no-such-kind","source":"imds"}`,
			`{"round":3,"rank":1,"lines":["step 1","step 2"]}`,
			`{"success":true,"step":100,"detail":"done"}`,
			`{"success":"yes"}`,
			`{}`, `null`, ``, `{"address":1}`, `{"lines":[1]}`,
		} {
			f.Add(op, uint8(0), []byte(b))
		}
	}
	f.Add(uint8(0), uint8(7), []byte(`{"address":"127.0.0.31"}`))
	fd := newFuzzDaemon(f)
	ops := []string{"register", "notice", "logs", "done"}
	f.Fuzz(func(t *testing.T, op, node uint8, body []byte) {
		id := "train-77-77" // unknown: 403 for its (derivable) token
		if int(node)%4 < len(fd.nodes) {
			id = fd.nodes[int(node)%4]
		}
		fd.check(t, "POST", "/v1/agent/train/"+id+"/"+ops[op%4], "Bearer "+fd.NodeToken("train", id), body, false)
	})
}

// FuzzInterruptRequest: POST /v1/fleets/{fleet}/nodes/{node}/interrupt.
func FuzzInterruptRequest(f *testing.F) {
	for _, b := range []string{``, `{}`, `{"kind":"spot-interruption","lead":120000000000}`, `{"kind":"preempted"}`,
		`{"kind":"bogus"}`, `{"lead":-1}`, `{"kind":1}`, `{"kind":"rebalance"} {}`} {
		f.Add(uint8(0), []byte(b))
	}
	f.Add(uint8(5), []byte(`{}`))
	fd := newFuzzDaemon(f)
	f.Fuzz(func(t *testing.T, node uint8, body []byte) {
		id := "train-77-77"
		if int(node)%4 < len(fd.nodes) {
			id = fd.nodes[int(node)%4]
		}
		fd.check(t, "POST", "/v1/fleets/train/nodes/"+url.PathEscape(id)+"/interrupt", "Bearer "+fd.Token(), body, false)
	})
}

// FuzzRendezvousRequest: join, heartbeat and leave bodies, with the admin
// token (acts for any node) or node 0's token (only for node 0).
func FuzzRendezvousRequest(f *testing.F) {
	for op := range uint8(3) {
		for _, b := range []string{
			`{"node_id":"%s","addr":"127.0.0.41","zone":"z1","nproc":2,"session":"s2"}`,
			`{"node_id":"%s","round":2,"step":10,"workers":"running"}`,
			`{"node_id":"%s"}`,
			`{"node_id":"%s","addr":"::1","nproc":1024}`,
			`{"node_id":"%s","addr":"0.0.0.0","nproc":1}`,
			`{"node_id":"","addr":"127.0.0.1","nproc":1}`,
			`{"node_id":"%s","round":-1}`,
			`{"node_id":"%s","x":1}`,
		} {
			f.Add(op, uint8(0), []byte(b))
			f.Add(op, uint8(1), []byte(b))
		}
	}
	fd := newFuzzDaemon(f)
	ops := []string{"join", "heartbeat", "leave"}
	f.Fuzz(func(t *testing.T, op, tok uint8, body []byte) {
		// %s in a body names node 0, so seeds reach real members.
		body = bytes.ReplaceAll(body, []byte("%s"), []byte(fd.nodes[0]))
		authz := "Bearer " + fd.Token()
		if tok%2 == 1 {
			authz = "Bearer " + fd.NodeToken("train", fd.nodes[0])
		}
		fd.check(t, "POST", "/v1/rendezvous/train/"+ops[op%3], authz, body, false)
	})
}

// FuzzQueryParams: the query strings of the read routes — events (with
// long-poll waits), the event stream, logs and the rendezvous watch — never
// hang past their request, never 5xx and change nothing.
func FuzzQueryParams(f *testing.F) {
	for r := range uint8(5) {
		for _, q := range []string{"", "since=0&limit=10", "since=1&wait=5m", "since=18446744073709551615&wait=1ns",
			"limit=0", "limit=99999999999999999999", "wait=-1s", "since=-1", "tail=5&node=x", "tail=-5",
			"node=%s&after=0&state=assigned&wait=0s", "node=%s&after=99&state=waiting&wait=5m", "node=%s&state=bogus",
			"node=&wait=1h", "fleet=train&since=0", "since=abc"} {
			f.Add(r, q)
		}
	}
	fd := newFuzzDaemon(f)
	f.Fuzz(func(t *testing.T, route uint8, query string) {
		query = strings.ReplaceAll(query, "%s", fd.nodes[0])
		q, err := url.ParseQuery(query)
		if err != nil {
			return // not a query string a client could send
		}
		path := []string{"/v1/events", "/v1/events/stream", "/v1/fleets/train/logs", "/v1/rendezvous/train/watch", "/v1/fleets/train"}[route%5]
		fd.check(t, "GET", path+"?"+q.Encode(), "Bearer "+fd.Token(), nil, true)
	})
}

// FuzzDaemonConfig: daemon.hcl parsing never panics; an accepted config is
// complete (durations parsed, token file placed, TLS files paired).
func FuzzDaemonConfig(f *testing.F) {
	for _, s := range []string{
		"listen = \"127.0.0.1:7777\"\ndata_dir = \"/var/lib/fleetd\"\n",
		"data_dir = \"d\"\norphan_grace = \"10m\"\ntls {\n  hosts = [\"fleetd.internal\"]\n}\n",
		"tls {\n  cert_file = \"c.pem\"\n}\n",
		"plugin \"x\" {\n  sha256 = \"" + strings.Repeat("a", 64) + "\"\n}\nplugin \"x\" {\n  sha256 = \"" + strings.Repeat("a", 64) + "\"\n}\n",
		"orphan_grace = \"-1s\"\n", "bogus = 1\n", "tls { enabled = false }\n", "listen = ",
	} {
		f.Add([]byte(s))
	}
	// The shipped example must be accepted, or the target fuzzes only the
	// error path.
	example, err := os.ReadFile(filepath.Join("..", "configs", "daemon.hcl"))
	if err != nil {
		f.Fatal(err)
	}
	if _, _, diags := ParseConfig("daemon.hcl", example); diags.HasErrors() {
		f.Fatalf("configs/daemon.hcl is refused: %s", diags.Error())
	}
	f.Add(example)
	f.Fuzz(func(t *testing.T, src []byte) {
		cfg, _, diags := ParseConfig("/etc/fleetd/daemon.hcl", src)
		if diags.HasErrors() {
			return
		}
		if cfg.DataDir != "" && cfg.TokenFile == "" {
			t.Fatal("accepted config without a token file")
		}
		if cfg.OrphanGraceDuration() < 0 {
			t.Fatalf("negative orphan grace %s", cfg.OrphanGraceDuration())
		}
		if cfg.TLS != nil && (cfg.TLS.CertFile == "") != (cfg.TLS.KeyFile == "") {
			t.Fatal("accepted a TLS cert without its key")
		}
		for _, p := range []string{cfg.DataDir, cfg.TokenFile, cfg.PluginDir} {
			if p != "" && !filepath.IsAbs(p) {
				t.Fatalf("relative path %q survived", p)
			}
		}
	})
}
