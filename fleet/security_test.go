package fleet

// Security tests: who may call what, what never leaks, and how the daemon
// protects its secrets on disk and on the wire. docs/security.md maps each
// mechanism to the test here that covers it.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/projects"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
	"github.com/fleetd/fleetd/rendezvous"
)

// captureProvider is the in-memory provider that also keeps the user-data
// of every launch: what a node would boot from.
type captureProvider struct {
	*providertest.MemProvider
	mu       sync.Mutex
	userData map[string]string // node id → user-data
}

func newCaptureProvider() *captureProvider {
	return &captureProvider{MemProvider: providertest.NewMemProvider(), userData: map[string]string{}}
}

func (c *captureProvider) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	c.mu.Lock()
	c.userData[req.Tags[providers.TagNodeID]] = req.UserData
	c.mu.Unlock()
	return c.MemProvider.Create(ctx, cfg, req)
}

func (c *captureProvider) allUserData() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]string, len(c.userData))
	for k, v := range c.userData {
		out[k] = v
	}
	return out
}

func memSchema(name string) (providers.ConfigSchema, bool) {
	if name == providertest.MemName {
		return providertest.MemSchema, true
	}
	return providers.ConfigSchema{}, false
}

// secDaemon is a daemon on a real 127.0.0.1 socket, logging at debug level
// into a buffer the tests grep, optionally serving TLS with its own CA.
type secDaemon struct {
	*testDaemon
	prov *captureProvider
	logs *testutil.SyncBuffer
}

func startSecDaemon(t *testing.T, dataDir string, withTLS bool) *secDaemon {
	t.Helper()
	return startSecDaemonOn(t, dataDir, withTLS, newCaptureProvider())
}

// startSecDaemonOn is startSecDaemon on a given provider, e.g. the one of
// a daemon that ran on dataDir before, so its instances are still there.
func startSecDaemonOn(t *testing.T, dataDir string, withTLS bool, prov *captureProvider) *secDaemon {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen, cfg.DataDir, cfg.TokenFile = "127.0.0.1:0", dataDir, ""
	if withTLS {
		cfg.TLS = &TLSConfig{}
	}
	if err := cfg.Finish(); err != nil {
		t.Fatal(err)
	}
	logs := &testutil.SyncBuffer{}
	td := runTestDaemon(t, Options{Config: cfg, Version: "test",
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Schema: memSchema, Providers: staticProviders{providertest.MemName: prov}, Tick: 100 * time.Millisecond}, prov.MemProvider)
	return &secDaemon{testDaemon: td, prov: prov, logs: logs}
}

func (sd *secDaemon) applyMem(t *testing.T) {
	t.Helper()
	if _, err := sd.client.Apply(context.Background(), api.ApplyRequest{Filename: "train.hcl", Source: memSpec}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "3 booting nodes", 15*time.Second, func() bool { return countState(sd.nodes(t, "train"), state.NodeBooting) == 3 })
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// foreignNodeToken is a well-formed node token minted by another daemon
// (another node secret) for the same fleet and node.
func foreignNodeToken(fleet, node string) string {
	m := hmac.New(sha256.New, []byte("another daemon's node secret, 32+ bytes long"))
	m.Write([]byte(fleet + "/" + node))
	return "fleetd_node_" + hex.EncodeToString(m.Sum(nil))
}

// authClass is how a route is protected.
type authClass int

const (
	public      authClass = iota // no token needed (/healthz)
	readRole                     // a read, operate or admin token
	operateRole                  // an operate or admin token
	adminOnly                    // the admin token only
	nodeScoped                   // the node's own token, or the admin token
	anyBearer                    // any bearer token (see docs/security.md, known gaps)
)

// callerKind is what a caller's credentials are worth.
type callerKind int

const (
	noCredentials callerKind = iota // nothing the daemon recognises: 401
	wrongNode                       // a well-formed node token that does not belong to this node: 403
	ownNode                         // the node's own token
	readToken                       // a valid scoped token with role read
	operateToken                    // a valid scoped token with role operate
	admin                           // the admin token
)

// role is what the caller's credentials are worth on the admin API.
func (k callerKind) role() api.Role {
	switch k {
	case readToken:
		return api.RoleRead
	case operateToken:
		return api.RoleOperate
	case admin:
		return api.RoleAdmin
	}
	return api.RoleNone
}

type caller struct {
	name   string
	authz  string // Authorization header value
	kind   callerKind
	target string // the node the request names
	// project limits a read or operate token to a project: "default"
	// (the project of the matrix's fleet train) or "other".
	project string
}

// scopeKind is how a route treats a token limited to a project.
type scopeKind int

const (
	scopeWide     scopeKind = iota // daemon-wide: 403
	scopeFiltered                  // served, showing only the project's part
	scopeTrain                     // acts on fleet train: its project only
)

// projectScopes is how each admin-API route treats project-limited
// tokens; a route not listed is daemon-wide.
var projectScopes = map[string]scopeKind{
	"GET /v1/status":        scopeFiltered,
	"GET /v1/fleets":        scopeFiltered,
	"GET /v1/events":        scopeFiltered,
	"GET /v1/events/stream": scopeFiltered,
	"GET /v1/projects":      scopeFiltered,
	"GET /v1/queue":         scopeFiltered,
	"POST /v1/plan":         scopeTrain, // the spec is train's
	"POST /v1/fleets":       scopeTrain,
	"GET /v1/fleets/{name}": scopeTrain,
	// The matrix deletes a fleet that does not exist: the project check
	// passes a fleet it cannot find on to the handler, so every project's
	// token gets its 404.
	"DELETE /v1/fleets/{name}":                       scopeFiltered,
	"GET /v1/fleets/{fleet}/logs":                    scopeTrain,
	"POST /v1/fleets/{fleet}/resume":                 scopeTrain,
	"POST /v1/fleets/{fleet}/nodes/{node}/interrupt": scopeTrain,
}

type routeCase struct {
	pattern string // exactly as registered on the mux
	class   authClass
	ok      int // the status an authorized caller gets
	// req builds the request for a caller targeting node.
	req func(node string) (method, path string, body []byte)
}

func (rc routeCase) want(c caller) int {
	switch rc.class {
	case public:
		return rc.ok
	case anyBearer:
		if len(c.authz) <= 7 || !strings.EqualFold(c.authz[:7], "bearer ") || strings.TrimSpace(c.authz[7:]) == "" {
			return http.StatusUnauthorized
		}
		return rc.ok
	case readRole, operateRole, adminOnly:
		need := map[authClass]api.Role{readRole: api.RoleRead, operateRole: api.RoleOperate, adminOnly: api.RoleAdmin}[rc.class]
		switch have := c.kind.role(); {
		case have == api.RoleNone: // node tokens too: they are not API credentials
			return http.StatusUnauthorized
		case have < need:
			return http.StatusForbidden
		}
		if c.project != "" {
			switch projectScopes[rc.pattern] {
			case scopeWide:
				return http.StatusForbidden
			case scopeTrain:
				if c.project != "default" {
					return http.StatusForbidden
				}
			}
		}
		return rc.ok
	}
	switch c.kind {
	case admin, ownNode:
		return rc.ok
	case wrongNode, readToken, operateToken: // valid, but not this node's
		return http.StatusForbidden
	}
	return http.StatusUnauthorized
}

// securityRoutes is every route the daemon serves, with how it must be
// protected. TestSecurityRouteTableIsComplete fails when a route is added
// without an entry here.
func securityRoutes() []routeCase {
	spec := mustJSON(api.ApplyRequest{Filename: "train.hcl", Source: memSpec})
	post := func(path string, body []byte) func(string) (string, string, []byte) {
		return func(string) (string, string, []byte) { return http.MethodPost, path, body }
	}
	get := func(path string) func(string) (string, string, []byte) {
		return func(string) (string, string, []byte) { return http.MethodGet, path, nil }
	}
	agent := func(op string, body []byte) func(string) (string, string, []byte) {
		return func(node string) (string, string, []byte) {
			return http.MethodPost, "/v1/agent/train/" + node + "/" + op, body
		}
	}
	rdzv := func(op string, body func(node string) any) func(string) (string, string, []byte) {
		return func(node string) (string, string, []byte) {
			return http.MethodPost, "/v1/rendezvous/train/" + op, mustJSON(body(node))
		}
	}
	return []routeCase{
		{"GET /healthz", public, 200, get("/healthz")},
		// The dashboard's page and assets carry no data; its API calls
		// send the token.
		{"GET /{$}", public, 200, get("/")},
		{"GET /ui/", public, 200, get("/ui/app.js")},
		{"GET /metrics", readRole, 200, get("/metrics")},
		{"GET /v1/events/stream", readRole, 200, get("/v1/events/stream?since=0")},
		{"GET /v1/status", readRole, 200, get("/v1/status")},
		{"POST /v1/plan", operateRole, 200, post("/v1/plan", spec)},
		{"POST /v1/fleets", operateRole, 200, post("/v1/fleets", spec)}, // unchanged spec: a no-op apply
		{"GET /v1/fleets", readRole, 200, get("/v1/fleets")},
		{"GET /v1/fleets/{name}", readRole, 200, get("/v1/fleets/train")},
		{"DELETE /v1/fleets/{name}", operateRole, 404, func(string) (string, string, []byte) {
			return http.MethodDelete, "/v1/fleets/no-such-fleet", nil
		}},
		{"GET /v1/events", readRole, 200, get("/v1/events?since=0&limit=5")},
		{"GET /v1/fleets/{fleet}/logs", readRole, 200, get("/v1/fleets/train/logs?tail=5")},
		{"POST /v1/offerings", operateRole, 200, post("/v1/offerings", spec)},
		{"POST /v1/check", operateRole, 200, post("/v1/check", spec)},
		{"GET /v1/cluster", readRole, 404, get("/v1/cluster")},
		{"GET /v1/projects", readRole, 200, get("/v1/projects")},
		{"GET /v1/queue", readRole, 200, get("/v1/queue")},
		// An admin's project changes: quota above max is refused (nothing
		// stored); deleting a project that does not exist is 404.
		{"PUT /v1/projects/{project}", adminOnly, 400, func(string) (string, string, []byte) {
			return http.MethodPut, "/v1/projects/matrix", []byte(`{"quota_gpus":4,"max_gpus":2}`)
		}},
		{"DELETE /v1/projects/{project}", adminOnly, 404, func(string) (string, string, []byte) {
			return http.MethodDelete, "/v1/projects/no-such-project", nil
		}},
		// train is not paused: authorized, then refused.
		{"POST /v1/fleets/{fleet}/resume", operateRole, 409, post("/v1/fleets/train/resume", nil)},
		// An invalid kind: authorization is checked first, then nothing is injected.
		{"POST /v1/fleets/{fleet}/nodes/{node}/interrupt", operateRole, 400, func(node string) (string, string, []byte) {
			return http.MethodPost, "/v1/fleets/train/nodes/" + node + "/interrupt", []byte(`{"kind":"not-a-kind"}`)
		}},
		// Token management: the admin token only. Each admin call creates
		// one more token; revoking an unknown id changes nothing.
		{"POST /v1/tokens", adminOnly, 201, post("/v1/tokens", []byte(`{"role":"read","name":"matrix"}`))},
		{"GET /v1/tokens", adminOnly, 200, get("/v1/tokens")},
		{"DELETE /v1/tokens/{id}", adminOnly, 404, func(string) (string, string, []byte) {
			return http.MethodDelete, "/v1/tokens/000000000000", nil
		}},
		{"POST /v1/agent/{fleet}/{node}/register", nodeScoped, 200, agent("register", []byte(`{"address":"127.0.0.21"}`))},
		{"POST /v1/agent/{fleet}/{node}/notice", nodeScoped, 400, agent("notice", []byte(`{"kind":"not-a-kind","source":"test"}`))},
		{"POST /v1/agent/{fleet}/{node}/logs", nodeScoped, 204, agent("logs", []byte(`{"round":1,"rank":0,"lines":["hello"]}`))},
		{"POST /v1/agent/{fleet}/{node}/done", nodeScoped, 400, agent("done", []byte(`{"success":`))},
		// A node that is not draining: nothing ends, 200 {"ended":false}.
		{"POST /v1/agent/{fleet}/{node}/drained", nodeScoped, 200, agent("drained", []byte(`{"checkpoint_step":-1}`))},
		// Checkpoint store calls: a node signs, lists and prunes only its
		// own fleet's keys; invalid requests are refused after the token.
		{"POST /v1/agent/{fleet}/{node}/checkpoint/sign", nodeScoped, 400, agent("checkpoint/sign", []byte(`{"method":"DELETE","keys":["manifests/step-1.json"]}`))},
		{"POST /v1/agent/{fleet}/{node}/checkpoint/list", nodeScoped, 400, agent("checkpoint/list", []byte(`{"prefix":"../other-fleet/"}`))},
		{"POST /v1/agent/{fleet}/{node}/checkpoint/delete", nodeScoped, 400, agent("checkpoint/delete", []byte(`{"keys":[]}`))},
		{"POST /v1/agent/{fleet}/{node}/checkpoint/report", nodeScoped, 200, agent("checkpoint/report", []byte(`{}`))},
		{"POST /v1/agent/{fleet}/{node}/staging", nodeScoped, 204, agent("staging", []byte(`{"source":"s3://b/p","mount_path":"/data","bytes":1,"total":2}`))},
		{"POST /v1/agent/{fleet}/{node}/staging/peer", nodeScoped, 404, agent("staging/peer", []byte(`{"source":"s3://b/p","mount_path":"/data"}`))},
		// Only the node named in the URL (or the admin) may download the
		// agent binary; the first 4 bytes are enough.
		{"GET /v1/agent/binary", nodeScoped, 206, func(node string) (string, string, []byte) {
			return http.MethodGet, "/v1/agent/binary?fleet=train&node=" + node, nil
		}},
		{"POST /v1/rendezvous/{fleet}/join", nodeScoped, 200, rdzv("join", func(node string) any {
			return rendezvous.JoinRequest{NodeID: node, Addr: "127.0.0.21", Nproc: 1, Session: "s-" + node}
		})},
		{"POST /v1/rendezvous/{fleet}/heartbeat", nodeScoped, 200, rdzv("heartbeat", func(node string) any {
			return rendezvous.HeartbeatRequest{NodeID: node}
		})},
		{"GET /v1/rendezvous/{fleet}/watch", nodeScoped, 200, func(node string) (string, string, []byte) {
			return http.MethodGet, "/v1/rendezvous/train/watch?node=" + node + "&wait=0s", nil
		}},
		{"POST /v1/rendezvous/{fleet}/leave", nodeScoped, 204, rdzv("leave", func(node string) any {
			return rendezvous.LeaveRequest{NodeID: node}
		})},
	}
}

// scopedTokens creates, through the API, the scoped tokens the matrix
// presents: a read and an operate token, a revoked one, one with the right
// id and a wrong secret, and a read token relabelled as operate.
func (sd *secDaemon) scopedTokens(t *testing.T) (read, operate, revoked, tampered, relabelled string) {
	t.Helper()
	ctx := context.Background()
	mk := func(role api.Role, name string) api.TokenCreated {
		tc, err := sd.Daemon.tokens.CreateToken(ctx, role, name, "")
		if err != nil {
			t.Fatal(err)
		}
		return tc
	}
	r, o, x := mk(api.RoleRead, "reader"), mk(api.RoleOperate, "operator"), mk(api.RoleRead, "revoked")
	if code, body, _ := sd.call(t, "DELETE", "/v1/tokens/"+x.ID, "Bearer "+sd.Token(), nil); code != 200 {
		t.Fatalf("revoke: HTTP %d %s", code, body)
	}
	secret := r.Token[strings.LastIndex(r.Token, "_")+1:]
	flipped := []byte(secret)
	flipped[0] = "01"[boolInt(flipped[0] == '0')]
	tampered = strings.TrimSuffix(r.Token, secret) + string(flipped)
	relabelled = strings.Replace(r.Token, "fleetd_read_", "fleetd_operate_", 1)
	return r.Token, o.Token, x.Token, tampered, relabelled
}

// projectTokens makes a project "other" and read and operate tokens
// limited to the project of fleet train ("default") and to "other".
func (sd *secDaemon) projectTokens(t *testing.T) (own, other map[api.Role]string) {
	t.Helper()
	ctx := context.Background()
	if _, err := sd.Daemon.projects.Set(ctx, projects.Project{Name: "other", QuotaGPUs: 1, MaxGPUs: 1}); err != nil {
		t.Fatal(err)
	}
	own, other = map[api.Role]string{}, map[api.Role]string{}
	for _, role := range []api.Role{api.RoleRead, api.RoleOperate} {
		for proj, m := range map[string]map[api.Role]string{"default": own, "other": other} {
			tc, err := sd.Daemon.tokens.CreateToken(ctx, role, proj+"-"+role.String(), proj)
			if err != nil {
				t.Fatal(err)
			}
			m[role] = tc.Token
		}
	}
	return own, other
}

// TestSecurityRouteAuthMatrix calls every route with every kind of
// credential: none, garbage, Basic instead of Bearer, another daemon's
// node token, another node's token, the token of a node that does not
// exist (forgotten), the node's own token, read and operate tokens (and
// revoked, tampered and relabelled ones) and the admin token.
func TestSecurityRouteAuthMatrix(t *testing.T) {
	sd := startSecDaemon(t, t.TempDir(), false)
	sd.applyMem(t)
	ns := sd.nodes(t, "train")
	a, b := ns[0].ID, ns[1].ID
	ghost := "train-99-99"
	adminTok := sd.Token()
	readTok, operateTok, revokedTok, tamperedTok, relabelledTok := sd.scopedTokens(t)
	own, other := sd.projectTokens(t)
	callers := []caller{
		{"project-read-token-own-project", "Bearer " + own[api.RoleRead], readToken, a, "default"},
		{"project-operate-token-own-project", "Bearer " + own[api.RoleOperate], operateToken, a, "default"},
		{"project-read-token-other-project", "Bearer " + other[api.RoleRead], readToken, a, "other"},
		{"project-operate-token-other-project", "Bearer " + other[api.RoleOperate], operateToken, a, "other"},
		{"read-token", "Bearer " + readTok, readToken, a, ""},
		{"operate-token", "Bearer " + operateTok, operateToken, a, ""},
		{"revoked-token", "Bearer " + revokedTok, noCredentials, a, ""},
		{"tampered-secret-token", "Bearer " + tamperedTok, noCredentials, a, ""},
		{"read-token-relabelled-operate", "Bearer " + relabelledTok, noCredentials, a, ""},
		{"no-token", "", noCredentials, a, ""},
		{"empty-bearer", "Bearer ", noCredentials, a, ""},
		{"garbage", "Bearer garbage-0123456789abcdef", noCredentials, a, ""},
		{"admin-token-as-basic", "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+adminTok)), noCredentials, a, ""},
		{"admin-token-truncated", "Bearer " + adminTok[:len(adminTok)-1], noCredentials, a, ""},
		{"foreign-daemon-node-token", "Bearer " + foreignNodeToken("train", a), wrongNode, a, ""},
		{"other-node-token", "Bearer " + sd.NodeToken("train", b), wrongNode, a, ""},
		{"forgotten-node-token", "Bearer " + sd.NodeToken("train", ghost), wrongNode, ghost, ""},
		{"own-node-token", "Bearer " + sd.NodeToken("train", a), ownNode, a, ""},
		{"admin-token", "Bearer " + adminTok, admin, a, ""},
		{"admin-token-lowercase-scheme", "bearer " + adminTok, admin, a, ""},
	}
	for _, rc := range securityRoutes() {
		for _, c := range callers {
			t.Run(rc.pattern+"/"+c.name, func(t *testing.T) {
				method, path, body := rc.req(c.target)
				code, resp, hdr := sd.call(t, method, path, c.authz, body, "Range", "bytes=0-3")
				if want := rc.want(c); code != want {
					t.Fatalf("%s %s as %s: HTTP %d, want %d\n%s", method, path, c.name, code, want, resp)
				}
				if code == http.StatusUnauthorized && hdr.Get("WWW-Authenticate") == "" {
					t.Errorf("401 without WWW-Authenticate")
				}
				if tok, ok := strings.CutPrefix(c.authz, "Bearer "); ok && len(tok) > 8 && bytes.Contains(resp, []byte(tok)) {
					t.Errorf("response echoes the presented token: %s", resp)
				}
			})
		}
	}
}

// TestSecurityRouteTableIsComplete finds every route registered in the
// daemon's source (fleet/..., rendezvous/) and requires an entry in
// securityRoutes, so no route ships without an authorization test.
func TestSecurityRouteTableIsComplete(t *testing.T) {
	// Subtree mounts that only delegate to muxes whose routes are listed.
	mounts := map[string]bool{"/": true, "/v1/rendezvous/": true}
	found := map[string]string{}
	for _, r := range sourceRoutes(t) {
		if !mounts[r.pattern] {
			found[r.pattern] = r.at
		}
	}
	listed := map[string]bool{}
	for _, rc := range securityRoutes() {
		listed[rc.pattern] = true
		if _, ok := found[rc.pattern]; !ok {
			t.Errorf("securityRoutes lists %q, which is no longer registered", rc.pattern)
		}
	}
	for p, pos := range found {
		if !listed[p] {
			t.Errorf("route %q (%s) has no entry in securityRoutes: add it with its protection", p, pos)
		}
	}
}

// TestSecurityForgottenNodeTokenRefused: once a fleet is destroyed and its
// node records are gone, the nodes' tokens are dead on every node route.
func TestSecurityForgottenNodeTokenRefused(t *testing.T) {
	sd := startSecDaemon(t, t.TempDir(), false)
	sd.applyMem(t)
	ctx := context.Background()
	node := sd.nodes(t, "train")[0].ID
	tok := "Bearer " + sd.NodeToken("train", node)
	register := []byte(`{"address":"127.0.0.21"}`)
	if code, body, _ := sd.call(t, "POST", "/v1/agent/train/"+node+"/register", tok, register); code != 200 {
		t.Fatalf("register before destroy: HTTP %d %s", code, body)
	}
	if _, err := sd.client.Destroy(ctx, "train"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "fleet forgotten", 15*time.Second, func() bool {
		_, err := sd.client.Fleet(ctx, "train")
		return api.IsNotFound(err)
	})
	join := mustJSON(rendezvous.JoinRequest{NodeID: node, Addr: "127.0.0.21", Nproc: 1})
	for _, r := range []struct{ method, path string }{
		{"POST", "/v1/agent/train/" + node + "/register"},
		{"POST", "/v1/rendezvous/train/join"},
	} {
		body := register
		if strings.Contains(r.path, "rendezvous") {
			body = join
		}
		if code, resp, _ := sd.call(t, r.method, r.path, tok, body); code != http.StatusForbidden {
			t.Errorf("%s with a forgotten node's token: HTTP %d, want 403: %s", r.path, code, resp)
		}
	}
}

// TestSecurityTerminatedNodeTokenRefused: once a node's instance is gone
// (state terminated), its token is refused on every node route, while the
// record is still kept for status and events.
func TestSecurityTerminatedNodeTokenRefused(t *testing.T) {
	fd := newFuzzDaemon(t) // no reconcile loop: the state stays as set here
	node := fd.nodes[1]
	tok := "Bearer " + fd.NodeToken("train", node)
	logs := []byte(`{"lines":["x"]}`)
	if rec := fd.serve(t, "POST", "/v1/agent/train/"+node+"/logs", tok, logs); rec.Code != http.StatusNoContent {
		t.Fatalf("logs while booting: HTTP %d %s", rec.Code, rec.Body)
	}
	err := fd.store.Update(context.Background(), func(tx state.Tx) error {
		n, err := tx.Node("train", node)
		if err != nil {
			return err
		}
		n.State, n.Reason = state.NodeTerminated, "instance gone"
		return tx.PutNode(n)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		path string
		body []byte
	}{
		{"/v1/agent/train/" + node + "/logs", logs},
		{"/v1/agent/train/" + node + "/register", []byte(`{"address":"127.0.0.22"}`)},
		{"/v1/rendezvous/train/join", mustJSON(rendezvous.JoinRequest{NodeID: node, Addr: "127.0.0.22", Nproc: 1})},
		{"/v1/rendezvous/train/heartbeat", mustJSON(rendezvous.HeartbeatRequest{NodeID: node})},
	} {
		if rec := fd.serve(t, "POST", r.path, tok, r.body); rec.Code != http.StatusForbidden {
			t.Errorf("%s with a terminated node's token: HTTP %d, want 403: %s", r.path, rec.Code, rec.Body)
		}
	}
	// The admin token still acts for it (operators, tests).
	if rec := fd.serve(t, "POST", "/v1/agent/train/"+node+"/logs", "Bearer "+fd.Token(), logs); rec.Code != http.StatusNoContent {
		t.Errorf("admin on a terminated node: HTTP %d", rec.Code)
	}
}

// TestSecurityTokenOfDestroyedFleetStaysDead re-creates a destroyed fleet
// under the same name: node ids used to be "<fleet>-<generation>-<n>" with
// the generation restarting at 1, so the new nodes got the old ids and,
// with tokens derived from (fleet, node id), the old tokens worked again.
// Ids now carry the incarnation; the old tokens must stay dead either way.
func TestSecurityTokenOfDestroyedFleetStaysDead(t *testing.T) {
	sd := startSecDaemon(t, t.TempDir(), false)
	sd.applyMem(t)
	ctx := context.Background()
	old := map[string]string{}
	for _, n := range sd.nodes(t, "train") {
		old[n.ID] = sd.NodeToken("train", n.ID)
	}
	if _, err := sd.client.Destroy(ctx, "train"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "fleet forgotten", 15*time.Second, func() bool {
		_, err := sd.client.Fleet(ctx, "train")
		return api.IsNotFound(err)
	})
	sd.applyMem(t)
	reused := 0
	for _, n := range sd.nodes(t, "train") {
		if _, ok := old[n.ID]; ok {
			reused++
		}
		for id, tok := range old {
			if code, _, _ := sd.call(t, "POST", "/v1/agent/train/"+n.ID+"/logs", "Bearer "+tok, []byte(`{"lines":[]}`)); code != http.StatusForbidden {
				t.Errorf("the token of %s of the destroyed fleet works for the new node %s (HTTP %d)", id, n.ID, code)
			}
		}
		if code, _, _ := sd.call(t, "POST", "/v1/agent/train/"+n.ID+"/logs", "Bearer "+sd.NodeToken("train", n.ID), []byte(`{"lines":[]}`)); code != http.StatusNoContent {
			t.Errorf("the new node %s's own token: HTTP %d", n.ID, code)
		}
	}
	t.Logf("%d of the new nodes reuse an old node id", reused)
}

// TestSecurityBodyLimits: bodies over the limit get 413 on admin, agent and
// rendezvous routes, whether or not the client announces the length, and
// bodies just under the limit are accepted.
func TestSecurityBodyLimits(t *testing.T) {
	sd := startSecDaemon(t, t.TempDir(), false)
	sd.applyMem(t)
	node := sd.nodes(t, "train")[0].ID
	adminTok, nodeTok := "Bearer "+sd.Token(), "Bearer "+sd.NodeToken("train", node)

	// A spec padded with a comment to exactly n bytes of JSON body.
	specOfSize := func(n int) []byte {
		b := mustJSON(api.ApplyRequest{Filename: "train.hcl", Source: memSpec + "#"})
		pad := n - len(b)
		return mustJSON(api.ApplyRequest{Filename: "train.hcl", Source: memSpec + "#" + strings.Repeat("x", pad)})
	}
	// A join padded with trailing whitespace (valid JSON) to n bytes.
	joinOfSize := func(n int) []byte {
		b := mustJSON(rendezvous.JoinRequest{NodeID: node, Addr: "127.0.0.21", Nproc: 1, Session: "s"})
		return append(b, bytes.Repeat([]byte(" "), n-len(b))...)
	}
	registerOfSize := func(n int) []byte {
		b := []byte(`{"address":"127.0.0.21","agent_version":""}`)
		return []byte(`{"address":"127.0.0.21","agent_version":"` + strings.Repeat("v", n-len(b)) + `"}`)
	}
	const apiMax, rdzvMax = api.MaxBodyBytes, rendezvous.MaxBodyBytes
	cases := []struct {
		name, path, authz string
		body              []byte
		chunked           bool
		want              int
	}{
		{"plan at limit", "/v1/plan", adminTok, specOfSize(apiMax), false, 200},
		{"plan over limit", "/v1/plan", adminTok, specOfSize(apiMax + 1), false, 413},
		{"apply over limit", "/v1/fleets", adminTok, specOfSize(apiMax + 1), false, 413},
		{"apply over limit, chunked", "/v1/fleets", adminTok, specOfSize(4 * apiMax), true, 413},
		{"offerings over limit", "/v1/offerings", adminTok, specOfSize(apiMax + 1), false, 413},
		{"register at limit", "/v1/agent/train/" + node + "/register", nodeTok, registerOfSize(apiMax), false, 200},
		{"register over limit", "/v1/agent/train/" + node + "/register", nodeTok, registerOfSize(apiMax + 1), false, 413},
		{"logs over limit, chunked", "/v1/agent/train/" + node + "/logs", nodeTok,
			[]byte(`{"lines":["` + strings.Repeat("y", 2*apiMax) + `"]}`), true, 413},
		{"join at limit", "/v1/rendezvous/train/join", nodeTok, joinOfSize(rdzvMax), false, 200},
		{"join over limit", "/v1/rendezvous/train/join", nodeTok, joinOfSize(rdzvMax + 1), false, 413},
		{"heartbeat over limit, chunked", "/v1/rendezvous/train/heartbeat", nodeTok,
			[]byte(`{"node_id":"` + node + `","workers":"` + strings.Repeat("w", 2*rdzvMax) + `"}`), true, 413},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var rd io.Reader = bytes.NewReader(c.body)
			if c.chunked {
				rd = io.MultiReader(rd) // hides the length: chunked transfer encoding
			}
			req, err := http.NewRequest("POST", sd.URL()+c.path, rd)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", c.authz)
			resp, err := sd.httpc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			if resp.StatusCode != c.want {
				t.Fatalf("%d-byte body: HTTP %d, want %d: %s", len(c.body), resp.StatusCode, c.want, b)
			}
		})
	}
	// Nothing over the limit reached the state: the fleet is still at generation 1.
	f, err := sd.client.Fleet(context.Background(), "train")
	if err != nil {
		t.Fatal(err)
	}
	if f.Generation != 1 {
		t.Errorf("generation %d after rejected applies, want 1", f.Generation)
	}
}

// TestSecurityTokensNeverLeak runs a scenario touching every code path that
// handles tokens — launches, registration, rendezvous, log shipping, a spot
// notice and its replacement, failed authentications — then greps the
// debug log, the event log, the API's answers and every file the daemon
// wrote for the admin token, the node secret, every node token and the
// wrong tokens that were presented.
func TestSecurityTokensNeverLeak(t *testing.T) {
	dataDir := t.TempDir()
	sd := startSecDaemon(t, dataDir, false)
	sd.applyMem(t)
	ctx := context.Background()
	joined := map[string]bool{}
	sd.joinAll(t, "train", joined)
	waitFor(t, "3 running nodes", 15*time.Second, func() bool { return countState(sd.nodes(t, "train"), state.NodeRunning) == 3 })
	ns := sd.nodes(t, "train")
	a, b := ns[0].ID, ns[1].ID
	adminTok := sd.Token()
	typo := adminTok[:len(adminTok)-1] + "0"
	if strings.HasSuffix(adminTok, "0") {
		typo = adminTok[:len(adminTok)-1] + "1"
	}
	presented := []string{typo, foreignNodeToken("train", a), "fleetd_node_" + strings.Repeat("ab", 32)}

	// Scoped tokens: created through the API, used, refused where their
	// role does not reach, one revoked and then presented again, and
	// tampered ones presented.
	scoped := map[string]string{} // what → token
	for _, role := range []string{"read", "operate"} {
		code, body, _ := sd.call(t, "POST", "/v1/tokens", "Bearer "+adminTok, []byte(`{"role":"`+role+`","name":"leak-test"}`))
		var tc api.TokenCreated
		if code != http.StatusCreated || json.Unmarshal(body, &tc) != nil || tc.Token == "" {
			t.Fatalf("create %s token: HTTP %d %s", role, code, body)
		}
		scoped[role+" token"] = tc.Token
	}
	readTok, operateTok := scoped["read token"], scoped["operate token"]
	for _, c := range []struct {
		method, path, tok string
		body              []byte
		want              int
	}{
		{"GET", "/v1/status", readTok, nil, 200},
		{"GET", "/metrics", readTok, nil, 200},
		{"POST", "/v1/plan", readTok, mustJSON(api.ApplyRequest{Filename: "train.hcl", Source: memSpec}), 403},
		{"POST", "/v1/plan", operateTok, mustJSON(api.ApplyRequest{Filename: "train.hcl", Source: memSpec}), 200},
		{"POST", "/v1/tokens", operateTok, []byte(`{"role":"operate"}`), 403},
		{"POST", "/v1/rendezvous/train/join", readTok, mustJSON(rendezvous.JoinRequest{NodeID: a, Addr: "127.0.0.9", Nproc: 1}), 403},
	} {
		if code, body, _ := sd.call(t, c.method, c.path, "Bearer "+c.tok, c.body); code != c.want {
			t.Fatalf("%s %s: HTTP %d, want %d: %s", c.method, c.path, code, c.want, body)
		}
	}
	_, operateID, _ := parseScopedToken(operateTok)
	if code, body, _ := sd.call(t, "DELETE", "/v1/tokens/"+operateID, "Bearer "+adminTok, nil); code != 200 {
		t.Fatalf("revoke: HTTP %d %s", code, body)
	}
	presented = append(presented, operateTok, readTok[:len(readTok)-1]+"x", strings.Replace(readTok, "_read_", "_operate_", 1))

	for _, n := range ns {
		if code := sd.agentCall(t, "train", n.ID, "logs", api.LogsRequest{Round: 1, Lines: []string{"step 1 loss 0.5"}}); code != http.StatusNoContent {
			t.Fatalf("logs: HTTP %d", code)
		}
	}
	// Failed authentications, each with a token that must not be logged.
	for _, tok := range append(presented, sd.NodeToken("train", b)) {
		sd.call(t, "POST", "/v1/agent/train/"+a+"/register", "Bearer "+tok, []byte(`{"address":"127.0.0.9"}`))
		sd.call(t, "GET", "/v1/status", "Bearer "+tok, nil)
		sd.call(t, "POST", "/v1/rendezvous/train/join", "Bearer "+tok, mustJSON(rendezvous.JoinRequest{NodeID: a, Addr: "127.0.0.9", Nproc: 1}))
	}
	// A spot notice: drain, rendezvous exclusion, replacement launch.
	creates := sd.mem.Calls(providertest.OpCreate)
	if code := sd.agentCall(t, "train", a, "notice", api.NoticeRequest{Kind: "spot-interruption", Deadline: time.Now().Add(time.Minute), Source: "imds"}); code != http.StatusAccepted {
		t.Fatalf("notice: HTTP %d", code)
	}
	waitFor(t, "replacement launch", 10*time.Second, func() bool { return sd.mem.Calls(providertest.OpCreate) > creates })
	waitFor(t, "replacement booting", 10*time.Second, func() bool { return countState(sd.nodes(t, "train"), state.NodeBooting) >= 1 })
	sd.joinAll(t, "train", joined)

	// Everything an operator can read.
	var answers bytes.Buffer
	for _, p := range []string{"/v1/status", "/v1/fleets", "/v1/fleets/train", "/v1/events?limit=10000", "/v1/fleets/train/logs?tail=10000", "/v1/tokens"} {
		code, body, _ := sd.call(t, "GET", p, "Bearer "+adminTok, nil)
		if code != 200 {
			t.Fatalf("GET %s: HTTP %d", p, code)
		}
		answers.Write(body)
	}
	evs, err := sd.client.Events(ctx, 0, 10000, 0)
	if err != nil || len(evs.Events) < 10 {
		t.Fatalf("events: %v (%d)", err, len(evs.Events))
	}
	var nodeIDs []string
	for id := range sd.prov.allUserData() {
		nodeIDs = append(nodeIDs, id)
	}
	for _, n := range sd.nodes(t, "train") {
		if !slices.Contains(nodeIDs, n.ID) {
			nodeIDs = append(nodeIDs, n.ID)
		}
	}
	tokens := map[string]string{} // node id → token, read while the store is open
	for _, id := range nodeIDs {
		tokens[id] = sd.NodeToken("train", id)
	}
	sd.stop() // flush: the state file is complete and closed

	secretB, err := os.ReadFile(filepath.Join(dataDir, "node-secret"))
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{"admin token": adminTok, "node secret": strings.TrimSpace(string(secretB))}
	for i, p := range presented {
		secrets[fmt.Sprintf("presented wrong token %d", i)] = p
	}
	for id, tok := range tokens {
		secrets["node token of "+id] = tok
	}
	secrets["read token"] = readTok
	// The secret part alone must not be anywhere either.
	secrets["read token's secret"] = readTok[strings.LastIndex(readTok, "_")+1:]
	haystacks := map[string][]byte{"daemon log": []byte(sd.logs.String()), "event log": mustJSON(evs), "API answers": answers.Bytes()}
	err = filepath.WalkDir(dataDir, func(path string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		switch de.Name() {
		case "token", "node-secret": // where they belong, 0600
			return nil
		}
		b, err := os.ReadFile(path)
		haystacks["file "+path] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(haystacks["daemon log"]), "fleetd daemon serving") {
		t.Fatalf("the daemon log was not captured: %q", haystacks["daemon log"])
	}
	stateDB, ok := haystacks["file "+filepath.Join(dataDir, "state.db")]
	if !ok {
		t.Fatal("state.db not found in the data dir")
	}
	// Scoped tokens are stored, as their hash: the live one is in the file.
	if !bytes.Contains(stateDB, []byte(hashToken(readTok))) {
		t.Error("state.db does not hold the read token's hash: where is it stored?")
	}
	for hn, h := range haystacks {
		for sn, s := range secrets {
			if bytes.Contains(h, []byte(s)) {
				t.Errorf("%s contains the %s", hn, sn)
			}
		}
	}

	// User-data carries exactly its own node's token, never the admin
	// token, the node secret or another node's token.
	uds := sd.prov.allUserData()
	if len(uds) < 4 {
		t.Fatalf("captured %d user-data documents, want ≥ 4 (3 nodes and a replacement)", len(uds))
	}
	for id, ud := range uds {
		cfg, err := bootstrap.AgentConfigFrom(ud)
		if err != nil {
			t.Fatalf("user-data of %s: %v", id, err)
		}
		if cfg.Token != tokens[id] || cfg.NodeID != id {
			t.Errorf("user-data of %s carries the token of %s", id, cfg.NodeID)
		}
		for sn, s := range secrets {
			if sn != "node token of "+id && strings.Contains(ud, s) {
				t.Errorf("user-data of %s contains the %s", id, sn)
			}
		}
	}
}

// TestSecurityFileModes: the secrets the daemon writes are 0600 in a 0700
// data dir, on first start and after a restart.
func TestSecurityFileModes(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	for range 2 { // create, then reopen
		cfg := DefaultConfig()
		cfg.Listen, cfg.DataDir, cfg.TokenFile, cfg.TLS = "127.0.0.1:0", dataDir, "", &TLSConfig{}
		if err := cfg.Finish(); err != nil {
			t.Fatal(err)
		}
		d, err := New(context.Background(), Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Schema: memSchema,
			Providers: staticProviders{}})
		if err != nil {
			t.Fatal(err)
		}
		d.Close()
		testutil.CheckModes(t, dataDir, 0o700, 0o600, "state.db", "token", "node-secret", "ca.pem", "ca-key.pem")
	}
	// No temp files of the atomic writes are left behind.
	ents, _ := os.ReadDir(dataDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("leftover temp file %s", e.Name())
		}
	}
}

// TestSecurityTLSPinning: a daemon with `tls {}` generates a CA on first
// start and keeps it across restarts; clients pinning its fingerprint get
// through (in the forms people paste), a wrong pin or no pin is refused
// before any request is sent, and plain HTTP never reaches the API.
func TestSecurityTLSPinning(t *testing.T) {
	dataDir := t.TempDir()
	sd := startSecDaemon(t, dataDir, true)
	ca := sd.CA()
	if ca == nil || !strings.HasPrefix(sd.URL(), "https://") {
		t.Fatalf("TLS daemon: CA %v, URL %s", ca, sd.URL())
	}
	ctx := context.Background()
	fp := ca.Fingerprint
	var colons []string
	for i := 0; i < len(fp); i += 2 {
		colons = append(colons, strings.ToUpper(fp[i:i+2]))
	}
	wrong := []byte(fp)
	wrong[10] = "01"[boolInt(wrong[10] == '0')]
	other := sha256.Sum256([]byte("some other CA"))
	for _, c := range []struct {
		name, pin string
		caPEM     []byte
		ok        bool
	}{
		{"pinned hex", fp, nil, true},
		{"pinned sha256:HEX:WITH:COLONS as in user-data", "sha256:" + strings.Join(colons, ":"), nil, true},
		{"trusted CA PEM", "", ca.CertPEM, true},
		{"wrong pin", string(wrong), nil, false},
		{"another CA's pin", hex.EncodeToString(other[:]), nil, false},
		{"no pin: system roots", "", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl, err := api.NewClient(sd.URL(), api.ClientOptions{Token: sd.Token(), CAFingerprint: c.pin, CACertPEM: c.caPEM, Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			_, err = cl.Status(ctx)
			if c.ok && err != nil {
				t.Fatalf("status: %v", err)
			}
			if !c.ok {
				var he *api.HTTPError
				if err == nil || errors.As(err, &he) {
					t.Fatalf("status through an unpinned connection: err = %v, want a TLS failure", err)
				}
			}
		})
	}

	// Plain HTTP to the TLS port, with the admin token: never an API answer.
	req, _ := http.NewRequest("GET", "http://"+strings.TrimPrefix(sd.URL(), "https://")+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+sd.Token())
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || bytes.Contains(b, []byte("fleets")) {
			t.Fatalf("plain HTTP to the TLS port: HTTP %d %s", resp.StatusCode, b)
		}
	}

	// The user-data of a launched node pins the same CA and carries its
	// certificate, never its key.
	sd.applyMem(t)
	keyPEM, err := os.ReadFile(filepath.Join(dataDir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	for id, ud := range sd.prov.allUserData() {
		cfg, err := bootstrap.AgentConfigFrom(ud)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.CAFingerprint != "sha256:"+fp || !strings.HasPrefix(cfg.DaemonURL, "https://") {
			t.Errorf("user-data of %s: fingerprint %q, URL %q", id, cfg.CAFingerprint, cfg.DaemonURL)
		}
		if strings.Contains(ud, "PRIVATE KEY") || strings.Contains(ud, strings.TrimSpace(string(keyPEM))) {
			t.Errorf("user-data of %s contains the CA key", id)
		}
		if !strings.Contains(ud, "BEGIN CERTIFICATE") {
			t.Errorf("user-data of %s lacks the CA certificate", id)
		}
	}

	// A restart keeps the CA: pinned agents keep working.
	sd.stop()
	sd2 := startSecDaemon(t, dataDir, true)
	if sd2.CA().Fingerprint != fp {
		t.Fatalf("CA fingerprint changed across restart: %s → %s", fp, sd2.CA().Fingerprint)
	}
	cl, err := api.NewClient(sd2.URL(), api.ClientOptions{Token: sd2.Token(), CAFingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Status(ctx); err != nil {
		t.Fatalf("status after restart with the old pin: %v", err)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestSecurityTokenEqual: the comparison is exact and refuses an empty
// expected token (a daemon without a token must not accept "").
func TestSecurityTokenEqual(t *testing.T) {
	for _, c := range []struct {
		got, want string
		ok        bool
	}{
		{"fleetd_abc", "fleetd_abc", true},
		{"fleetd_abd", "fleetd_abc", false},
		{"fleetd_ab", "fleetd_abc", false},
		{"fleetd_abcd", "fleetd_abc", false},
		{"FLEETD_ABC", "fleetd_abc", false},
		{"", "", false},
		{"x", "", false},
	} {
		if got := api.TokenEqual(c.got, []byte(c.want)); got != c.ok {
			t.Errorf("TokenEqual(%q, %q) = %v, want %v", c.got, c.want, got, c.ok)
		}
	}
}

// TestSecurityTokenComparisonsAreConstantTime reviews the auth code
// mechanically: TokenEqual is subtle.ConstantTimeCompare, every auth
// function goes through it, and no token is compared with ==, !=,
// bytes.Equal or strings.EqualFold anywhere in the daemon.
func TestSecurityTokenComparisonsAreConstantTime(t *testing.T) {
	type fn struct{ file, name, must string }
	for _, f := range []fn{
		{filepath.Join("api", "server.go"), "TokenEqual", "ConstantTimeCompare"},
		{filepath.Join("api", "server.go"), "Authorize", "TokenEqual"},
		{filepath.Join("agentapi", "nodeauth.go"), "AuthorizeNode", "TokenEqual"},
		{"tokens.go", "verifyScopedToken", "TokenEqual"},
	} {
		file, err := parser.ParseFile(token.NewFileSet(), f.file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		var decl *ast.FuncDecl
		for _, d := range file.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == f.name {
				decl = fd
			}
		}
		if decl == nil {
			t.Errorf("%s: func %s not found", f.file, f.name)
			continue
		}
		if !callsName(decl, f.must) {
			t.Errorf("%s: %s does not call %s", f.file, f.name, f.must)
		}
	}

	tokenish := func(e ast.Expr) bool {
		var name string
		switch x := e.(type) {
		case *ast.Ident:
			name = x.Name
		case *ast.SelectorExpr:
			name = x.Sel.Name
		case *ast.CallExpr: // d.Token(), d.NodeToken(...)
			if s, ok := x.Fun.(*ast.SelectorExpr); ok {
				name = s.Sel.Name
			}
		}
		l := strings.ToLower(name)
		return l == "tok" || strings.Contains(l, "token") || strings.Contains(l, "secret")
	}
	isLit := func(e ast.Expr) bool { _, ok := e.(*ast.BasicLit); return ok }
	var files []string
	for _, pat := range []string{"*.go", filepath.Join("api", "*.go"), filepath.Join("agentapi", "*.go"), filepath.Join("..", "rendezvous", "*.go")} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	checked := 0
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(file, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.BinaryExpr:
				if (x.Op == token.EQL || x.Op == token.NEQ) && (tokenish(x.X) || tokenish(x.Y)) && !isLit(x.X) && !isLit(x.Y) {
					t.Errorf("%s: token compared with %s; use api.TokenEqual", fset.Position(x.Pos()), x.Op)
				}
			case *ast.CallExpr:
				s, ok := x.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				pkg, _ := s.X.(*ast.Ident)
				if pkg == nil || !(pkg.Name == "bytes" && s.Sel.Name == "Equal" || pkg.Name == "strings" && (s.Sel.Name == "EqualFold" || s.Sel.Name == "Compare")) {
					return true
				}
				if slices.ContainsFunc(x.Args, tokenish) && !slices.ContainsFunc(x.Args, isLit) {
					t.Errorf("%s: token compared with %s.%s; use api.TokenEqual", fset.Position(x.Pos()), pkg.Name, s.Sel.Name)
				}
			}
			return true
		})
	}
	if checked < 10 {
		t.Fatalf("reviewed only %d files", checked)
	}
}

func callsName(n ast.Node, name string) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.SelectorExpr:
			if x.Sel.Name == name {
				found = true
			}
		case *ast.Ident:
			if x.Name == name {
				found = true
			}
		}
		return !found
	})
	return found
}

// TestSecuritySpecCannotReadDaemonFiles: file(), fileexists() and env() in
// a spec sent over the API see only what the CLI sent, never the daemon's
// filesystem or environment (its token file, its CA key, its env).
func TestSecuritySpecCannotReadDaemonFiles(t *testing.T) {
	dataDir := t.TempDir()
	sd := startSecDaemon(t, dataDir, false)
	t.Setenv("FLEETD_SECURITY_TEST_SECRET", "daemon-env-secret-value")
	tokenPath := filepath.Join(dataDir, "token")
	for _, expr := range []string{
		fmt.Sprintf("file(%q)", tokenPath),
		fmt.Sprintf("file(%q)", filepath.Join(dataDir, "node-secret")),
		`file("../../../../../../../../etc/hostname")`,
		fmt.Sprintf("fileexists(%q) ? file(%q) : \"absent\"", tokenPath, tokenPath),
		`env("FLEETD_SECURITY_TEST_SECRET")`,
	} {
		t.Run(expr, func(t *testing.T) {
			src := strings.Replace(memSpec, `command = ["python3", "train.py"]`, `command = ["echo", `+expr+`]`, 1)
			code, body, _ := sd.call(t, "POST", "/v1/plan", "Bearer "+sd.Token(), mustJSON(api.ApplyRequest{Filename: "x.hcl", Source: src, BaseDir: dataDir}))
			if bytes.Contains(body, []byte(sd.Token())) || bytes.Contains(body, []byte("daemon-env-secret-value")) {
				t.Fatalf("the daemon's secret reached the answer: %s", body)
			}
			if strings.HasPrefix(expr, "fileexists") {
				// 200 only if fileexists said false: file() would fail.
				if code != 200 {
					t.Fatalf("HTTP %d: %s", code, body)
				}
				return
			}
			if code != http.StatusUnprocessableEntity {
				t.Fatalf("HTTP %d, want 422: %s", code, body)
			}
		})
	}
}

// TestSecurityParseScopedToken: only "fleetd_<read|operate>_<id>_<secret>"
// is a scoped token; the admin token, node tokens and look-alikes are not.
func TestSecurityParseScopedToken(t *testing.T) {
	for _, c := range []struct {
		tok  string
		role api.Role
		id   string
		ok   bool
	}{
		{"fleetd_read_0a1b2c_" + strings.Repeat("f", 64), api.RoleRead, "0a1b2c", true},
		{"fleetd_operate_0a1b2c_secret_with_underscores", api.RoleOperate, "0a1b2c", true},
		{"fleetd_admin_0a1b2c_secret", api.RoleNone, "", false},
		{"fleetd_node_" + strings.Repeat("ab", 32), api.RoleNone, "", false},
		{"fleetd_" + strings.Repeat("0", 48), api.RoleNone, "", false},
		{"fleetd_read__secret", api.RoleNone, "", false},
		{"fleetd_read_id_", api.RoleNone, "", false},
		{"fleetd_read_id", api.RoleNone, "", false},
		{"FLEETD_read_id_secret", api.RoleNone, "", false},
		{"", api.RoleNone, "", false},
	} {
		role, id, ok := parseScopedToken(c.tok)
		if role != c.role || id != c.id || ok != c.ok {
			t.Errorf("parseScopedToken(%q) = %v, %q, %v; want %v, %q, %v", c.tok, role, id, ok, c.role, c.id, c.ok)
		}
	}
}

// TestSecurityScopedTokenLifecycle: creation refuses what it must, the list
// never shows a secret or hash, a revocation bites at once on this server
// and within tokenCacheTTL when another server (the shared store) revokes,
// and tokens survive a restart.
func TestSecurityScopedTokenLifecycle(t *testing.T) {
	dataDir := t.TempDir()
	sd := startSecDaemon(t, dataDir, false)
	adminTok := "Bearer " + sd.Token()
	create := func(body string) (int, api.TokenCreated) {
		t.Helper()
		code, resp, _ := sd.call(t, "POST", "/v1/tokens", adminTok, []byte(body))
		var tc api.TokenCreated
		if code == http.StatusCreated {
			if err := json.Unmarshal(resp, &tc); err != nil {
				t.Fatal(err)
			}
		}
		return code, tc
	}
	for _, c := range []struct {
		name, body string
		want       int
	}{
		{"no role", `{}`, 400},
		{"admin role is not grantable", `{"role":"admin"}`, 400},
		{"unknown role", `{"role":"write"}`, 400},
		{"name too long", `{"role":"read","name":"` + strings.Repeat("n", maxTokenName+1) + `"}`, 400},
		{"control character in name", `{"role":"read","name":"a\nb"}`, 400},
		{"unknown field", `{"role":"read","expires":"1h"}`, 400},
		{"read", `{"role":"read","name":"prometheus"}`, 201},
		{"operate", `{"role":"operate"}`, 201},
	} {
		t.Run(c.name, func(t *testing.T) {
			if code, _ := create(c.body); code != c.want {
				t.Fatalf("HTTP %d, want %d", code, c.want)
			}
		})
	}
	_, keep := create(`{"role":"read","name":"kept"}`)
	_, local := create(`{"role":"read","name":"revoked here"}`)
	_, remote := create(`{"role":"operate","name":"revoked elsewhere"}`)
	if !strings.HasPrefix(keep.Token, "fleetd_read_"+keep.ID+"_") || keep.Role != "read" || keep.Name != "kept" {
		t.Fatalf("created %+v", keep)
	}
	status := func(tok string) int {
		code, _, _ := sd.call(t, "GET", "/v1/status", "Bearer "+tok, nil)
		return code
	}
	for _, tok := range []string{keep.Token, local.Token, remote.Token} {
		if code := status(tok); code != 200 {
			t.Fatalf("fresh token: HTTP %d", code)
		}
	}

	// The list: ids, names, roles; no secret, no hash.
	code, body, _ := sd.call(t, "GET", "/v1/tokens", adminTok, nil)
	var list []api.TokenInfo
	if code != 200 || json.Unmarshal(body, &list) != nil || len(list) != 5 {
		t.Fatalf("list: HTTP %d %s", code, body)
	}
	for _, leak := range []string{keep.Token[strings.LastIndex(keep.Token, "_")+1:], hashToken(keep.Token), "sha256", `"token"`} {
		if bytes.Contains(body, []byte(leak)) {
			t.Errorf("the token list shows %q", leak)
		}
	}

	// Revoked here: refused on the next request (the cache is dropped).
	if code, body, _ := sd.call(t, "DELETE", "/v1/tokens/"+local.ID, adminTok, nil); code != 200 {
		t.Fatalf("revoke: HTTP %d %s", code, body)
	}
	if code := status(local.Token); code != http.StatusUnauthorized {
		t.Errorf("revoked token right after revocation: HTTP %d, want 401", code)
	}
	if code, _, _ := sd.call(t, "DELETE", "/v1/tokens/"+local.ID, adminTok, nil); code != http.StatusNotFound {
		t.Errorf("second revoke: HTTP %d, want 404", code)
	}

	// Revoked by another server of a cluster: this one only sees the store
	// change, and must stop accepting the token within the cache's TTL.
	err := sd.store.Update(context.Background(), func(tx state.Tx) error {
		doc, err := readTokens(tx)
		if err != nil {
			return err
		}
		doc.Tokens = slices.DeleteFunc(doc.Tokens, func(r tokenRecord) bool { return r.ID == remote.ID })
		return writeTokens(tx, doc)
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, "remote revocation", tokenCacheTTL+3*time.Second, func() bool { return status(remote.Token) == http.StatusUnauthorized })
	if took := time.Since(start); took > tokenCacheTTL+time.Second {
		t.Errorf("remote revocation took %v, the cache TTL is %v", took, tokenCacheTTL)
	}

	// A restart keeps the live tokens and the revocations.
	sd.stop()
	sd = startSecDaemon(t, dataDir, false)
	if code := status(keep.Token); code != 200 {
		t.Errorf("kept token after restart: HTTP %d", code)
	}
	if code := status(local.Token); code != http.StatusUnauthorized {
		t.Errorf("revoked token after restart: HTTP %d", code)
	}
}
