package fleet

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	awsprov "github.com/fleetd/fleetd/providers/aws"
)

// otherArch is the architecture this test binary, serving its own as a
// daemon does, has no agent for, an EC2 type of it and one of its own.
func otherArch(t *testing.T) (other, otherType, hostType string) {
	t.Helper()
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		t.Skip("the daemon's own executable serves its platform only on linux/amd64 and linux/arm64")
	}
	if runtime.GOARCH == "arm64" {
		return "amd64", "g4dn.xlarge", "g5g.xlarge"
	}
	return "arm64", "g5g.xlarge", "g4dn.xlarge"
}

// TestAgentBinaryPerArch: a fleet whose only instance type is of an
// architecture the daemon has no agent for is refused at plan and apply,
// with the architecture, where the daemon looked and the fix; a fleet
// with other offerings too passes, the unservable ones excluded from its
// market view; once the binary is in agent_dir the fleet plans, its
// nodes' user-data pins that binary, and the daemon serves it.
func TestAgentBinaryPerArch(t *testing.T) {
	// The daemon (this test binary) serves its own architecture; the
	// fleet asks for the other one.
	other, otherType, hostType := otherArch(t)
	_, ec2srv := fakeEC2(t, "us-east-1a")
	spec := func(types string) api.ApplyRequest {
		return api.ApplyRequest{Filename: "t4.hcl", Source: awsFleetSpec("t4", 1, 1, 1, types, ec2srv.URL)}
	}
	only, mixed := spec(fmt.Sprintf("%q", otherType)), spec(fmt.Sprintf("%q, %q", otherType, hostType))
	ctx := context.Background()

	agentDir := t.TempDir()
	td := launchTestDaemon(t, t.TempDir(), staticProviders{awsprov.Name: awsprov.New(awsprov.Options{RetryMaxAttempts: 1})}, nil,
		Options{Config: Config{AgentDir: agentDir}})
	_, err := td.client.Plan(ctx, only)
	var he *api.HTTPError
	if err == nil {
		t.Fatalf("plan of a linux/%s-only fleet without its agent succeeded", other)
	}
	t.Logf("plan refused: %v", err)
	for _, want := range []string{"linux/" + other, otherType, agentDir, "make release", "fleetd-linux-" + other, "nothing was applied"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("plan error does not say %q:\n%v", want, err)
		}
	}
	if errors.As(err, &he) && he.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("status %d, want 422", he.StatusCode)
	}
	if _, err := td.client.Apply(ctx, only); err == nil || !strings.Contains(err.Error(), "no agent binary") {
		t.Fatalf("apply: %v, want the same refusal", err)
	}

	// Some offerings can be served: the fleet passes, the others are
	// excluded with the reason.
	if _, err := td.client.Plan(ctx, mixed); err != nil {
		t.Fatalf("plan with a servable offering: %v", err)
	}
	var views []OfferingsView
	if err := td.client.Do(ctx, http.MethodPost, "/v1/offerings", nil, mixed, &views); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, r := range views[0].Offerings {
		if r.Offering.CapacityType == "spot" {
			seen[r.Offering.InstanceType] = r.Excluded
		}
	}
	if seen[otherType] != "no agent binary for "+other || seen[hostType] != "" {
		t.Errorf("offerings view exclusions %q, want %s excluded for its agent and %s launchable", seen, otherType, hostType)
	}
	td.stop()

	// With the binary in agent_dir, the same daemon config serves the fleet.
	stub := bootstrap.StubELF(other)
	if err := os.WriteFile(filepath.Join(agentDir, bootstrap.AgentFileName(other)), stub, 0o755); err != nil {
		t.Fatal(err)
	}
	td = launchTestDaemon(t, t.TempDir(), staticProviders{awsprov.Name: awsprov.New(awsprov.Options{RetryMaxAttempts: 1})}, nil,
		Options{Config: Config{AgentDir: agentDir}})
	if _, err := td.client.Plan(ctx, only); err != nil {
		t.Fatalf("plan with the %s agent in agent_dir: %v", other, err)
	}
	want, _ := td.agents.Lookup(other)
	if want.Self || want.Path != filepath.Join(agentDir, bootstrap.AgentFileName(other)) {
		t.Fatalf("index has %+v for %s", want, other)
	}
	file, err := td.parseRequest(only)
	if err != nil {
		t.Fatal(err)
	}
	fl := file.Fleets[0]
	for _, arch := range []string{other, runtime.GOARCH} {
		n := state.Node{ID: "t4-1-0001", Offering: providers.Offering{Provider: awsprov.Name, InstanceType: otherType, Arch: arch}}
		ud, err := nodeBoot{td.Daemon}.UserData("t4", fl, n)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := td.agents.Lookup(arch)
		u := td.URL() + "/v1/agent/binary?" + url.Values{"arch": {arch}, "fleet": {"t4"}, "node": {n.ID}}.Encode()
		if !strings.Contains(ud, "echo '"+b.SHA256+"  ") || !strings.Contains(ud, u) {
			t.Errorf("%s node's user-data does not download %s pinned to %s:\n%s", arch, u, b.SHA256, ud)
		}
	}

	// The route serves the binary of the asked architecture.
	code, body, hdr := td.call(t, http.MethodGet, "/v1/agent/binary?arch="+other, "Bearer "+td.Token(), nil)
	if code != http.StatusOK || string(body) != string(stub) || hdr.Get("X-Fleetd-Sha256") != want.SHA256 {
		t.Errorf("GET ?arch=%s: %d, %d bytes, sha %s; want the stub", other, code, len(body), hdr.Get("X-Fleetd-Sha256"))
	}
	code, body, _ = td.call(t, http.MethodGet, "/v1/agent/binary?arch=riscv64", "Bearer "+td.Token(), nil)
	if code != http.StatusNotFound || !strings.Contains(string(body), "no agent binary for linux/riscv64") {
		t.Errorf("GET ?arch=riscv64: %d %s, want 404 naming it", code, body)
	}
}

// TestCheckAgentBinaryRows: `fleetd check` (POST /v1/check) has an "agent
// binary" row per architecture of the offerings that fit the fleet: ok
// when the daemon has the binary (naming it), failed when no offering of
// the block can be served, unavailable when others can; the quick
// preflight apply runs has none.
func TestCheckAgentBinaryRows(t *testing.T) {
	other, otherType, hostType := otherArch(t)
	_, ec2srv := fakeEC2(t, "us-east-1a")
	req := func(types string, quick bool) api.CheckRequest {
		return api.CheckRequest{Quick: quick, ApplyRequest: api.ApplyRequest{Filename: "t4.hcl", Source: awsFleetSpec("t4", 1, 1, 1, types, ec2srv.URL)}}
	}
	agentDir := t.TempDir()
	start := func() *testDaemon {
		return launchTestDaemon(t, t.TempDir(), staticProviders{awsprov.Name: awsprov.New(awsprov.Options{RetryMaxAttempts: 1})}, nil,
			Options{Config: Config{AgentDir: agentDir}})
	}
	rows := func(td *testDaemon, r api.CheckRequest) map[string]providers.CheckResult {
		t.Helper()
		var rep api.CheckReport
		if err := td.client.Do(context.Background(), http.MethodPost, "/v1/check", nil, r, &rep); err != nil {
			t.Fatal(err)
		}
		out := map[string]providers.CheckResult{}
		for _, pc := range rep.Providers {
			for _, r := range pc.Results {
				if r.Check == "agent binary" {
					out[r.Scope] = r
				}
			}
		}
		return out
	}
	only, mixed := fmt.Sprintf("%q", otherType), fmt.Sprintf("%q, %q", otherType, hostType)
	td := start()
	type want struct {
		status      providers.CheckStatus
		detail, fix string
	}
	steps := []struct {
		name  string
		req   api.CheckRequest
		rows  map[string]want
		setup func()
	}{
		{name: "only the missing architecture", req: req(only, false), rows: map[string]want{
			"linux/" + other: {providers.CheckFailed, "no fleetd-linux-" + other + " in " + agentDir + ", and " + otherType + " need it", "make release"}}},
		{name: "both", req: req(mixed, false), rows: map[string]want{
			"linux/" + runtime.GOARCH: {providers.CheckOK, "the daemon's own executable, for " + hostType, ""},
			"linux/" + other:          {providers.CheckUnavailable, "offerings of " + otherType + " are left out of placement", "fleetd-linux-" + other}}},
		{name: "quick", req: req(only, true), rows: map[string]want{}},
		{name: "binary added", req: req(mixed, false), setup: func() {
			td.stop()
			if err := os.WriteFile(filepath.Join(agentDir, bootstrap.AgentFileName(other)), bootstrap.StubELF(other), 0o755); err != nil {
				t.Fatal(err)
			}
			td = start()
		}, rows: map[string]want{
			"linux/" + runtime.GOARCH: {providers.CheckOK, hostType, ""},
			"linux/" + other:          {providers.CheckOK, filepath.Join(agentDir, bootstrap.AgentFileName(other)) + ", for " + otherType, ""}}},
	}
	for _, st := range steps {
		if st.setup != nil {
			st.setup()
		}
		got := rows(td, st.req)
		if len(got) != len(st.rows) {
			t.Errorf("%s: agent rows %+v, want %d", st.name, got, len(st.rows))
		}
		for scope, w := range st.rows {
			r, ok := got[scope]
			if !ok || r.Status != w.status || !strings.Contains(r.Detail, w.detail) || !strings.Contains(r.Fix, w.fix) {
				t.Errorf("%s: %s row %+v; want %s with %q, fix with %q", st.name, scope, r, w.status, w.detail, w.fix)
			}
		}
	}
}

// TestAgentBinaryServing: the download route answers conditional, partial
// and gzip requests over a real socket, and serves the node-store build
// to fleets that ask for it.
func TestAgentBinaryServing(t *testing.T) {
	agentDir := t.TempDir()
	arch := runtime.GOARCH
	// A compressible body behind a real ELF header, like a Go binary.
	slim := append(bootstrap.StubELF(arch), bytes.Repeat([]byte("fleetd agent text segment "), 40_000)...)
	node := append(bytes.Clone(slim), []byte("node-store drivers")...)
	for name, b := range map[string][]byte{bootstrap.AgentFlavorFileName(bootstrap.FlavorSlim, arch): slim, bootstrap.AgentFlavorFileName(bootstrap.FlavorNode, arch): node} {
		if err := os.WriteFile(filepath.Join(agentDir, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	td := launchTestDaemon(t, t.TempDir(), staticProviders{}, nil, Options{Config: Config{AgentDir: agentDir}})
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	// The daemon precompresses the agent builds at start; wait for it.
	waitFor(t, "gzip copies", 30*time.Second, func() bool {
		_, e1 := os.Stat(filepath.Join(td.cfg.DataDir, "cache", "agents", sum(slim)+".gz"))
		_, e2 := os.Stat(filepath.Join(td.cfg.DataDir, "cache", "agents", sum(node)+".gz"))
		return e1 == nil && e2 == nil
	})
	plain := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	tests := []struct {
		name     string
		query    string
		hdr      map[string]string
		code     int
		encoding string
		want     []byte // the body, after decompression
	}{
		{"plain", "", nil, 200, "", slim},
		{"revalidate", "", map[string]string{"If-None-Match": `"` + sum(slim) + `"`}, 304, "", nil},
		{"revalidate gzip etag", "", map[string]string{"If-None-Match": `"` + sum(slim) + `+gzip"`}, 304, "", nil},
		{"stale etag", "", map[string]string{"If-None-Match": `"` + sum(node) + `"`}, 200, "", slim},
		{"range", "", map[string]string{"Range": "bytes=100-199"}, 206, "", slim[100:200]},
		{"resume", "", map[string]string{"Range": "bytes=1000000-"}, 206, "", slim[1000000:]},
		{"gzip", "", map[string]string{"Accept-Encoding": "gzip"}, 200, "gzip", slim},
		{"range is never gzip", "", map[string]string{"Accept-Encoding": "gzip", "Range": "bytes=0-9"}, 206, "", slim[:10]},
		{"node-store flavor", "&flavor=node", map[string]string{"Accept-Encoding": "gzip"}, 200, "gzip", node},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, td.URL()+"/v1/agent/binary?arch="+arch+tt.query, nil)
			req.Header.Set("Authorization", "Bearer "+td.Token())
			for k, v := range tt.hdr {
				req.Header.Set(k, v)
			}
			resp, err := plain.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.code || resp.Header.Get("Content-Encoding") != tt.encoding {
				t.Fatalf("HTTP %d, Content-Encoding %q; want %d %q", resp.StatusCode, resp.Header.Get("Content-Encoding"), tt.code, tt.encoding)
			}
			body := raw
			if tt.encoding == "gzip" {
				zr, err := gzip.NewReader(bytes.NewReader(raw))
				if err != nil {
					t.Fatal(err)
				}
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
				if len(raw)*4 > len(body) {
					t.Errorf("gzip body is %d bytes for %d: not the compressed copy", len(raw), len(body))
				}
			}
			if !bytes.Equal(body, tt.want) {
				t.Errorf("body: %d bytes, want %d", len(body), len(tt.want))
			}
			if tt.code != 304 && resp.Header.Get("ETag") == "" {
				t.Error("no ETag")
			}
		})
	}
}
