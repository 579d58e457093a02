package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const module = "github.com/fleetd/fleetd/"

// forbidden are import path prefixes the agent must never link: the
// daemon, its state and HA stores, the plugin machinery and providers (and
// with them the cloud control-plane SDKs), the browser test driver.
var forbidden = []string{
	module + "fleet", // the daemon, its API types and the dashboard
	module + "providers",
	module + "plugins",
	"go.etcd.io/etcd/", // server and client
	"go.etcd.io/bbolt",
	"github.com/hashicorp/go-plugin",
	"github.com/aws/aws-sdk-go-v2/service/ec2",
	"github.com/aws/aws-sdk-go-v2/service/sqs",
	"github.com/aws/aws-sdk-go-v2/service/pricing",
	"github.com/aws/aws-sdk-go-v2/service/servicequotas",
	"cloud.google.com/go/compute/apiv1",
	"github.com/chromedp/",
}

// forbiddenSlim are what only the node-store build may link: the object
// store SDKs and their gocloud drivers.
var forbiddenSlim = []string{
	"github.com/aws/aws-sdk-go-v2/", // every AWS SDK package, s3 included
	"cloud.google.com/go/",          // storage, compute metadata, auth…
	"gocloud.dev/blob/s3blob",
	"gocloud.dev/blob/gcsblob",
	"gocloud.dev/blob/azureblob",
}

func deps(t *testing.T, tags string) []string {
	t.Helper()
	args := []string{"list", "-deps"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command("go", append(args, ".")...).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	return strings.Fields(string(out))
}

// TestAgentImportGraph keeps the agent slim: neither build imports the
// daemon or a cloud control-plane SDK, and the default build links no
// object-store SDK. It also checks the test can fail: fleetd's own graph
// breaks the same rules.
func TestAgentImportGraph(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool")
	}
	tests := []struct {
		name, tags string
		rules      []string
		mustHave   []string // proves the graph is the one we think
	}{
		{"slim", "", append(append([]string{}, forbidden...), forbiddenSlim...), []string{module + "agent", module + "agent/ckpt", module + "rendezvous", module + "interruption"}},
		{"nodestore", "nodestore", forbidden, []string{module + "agent/ckpt/nodestores", "gocloud.dev/blob/s3blob", "gocloud.dev/blob/gcsblob"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := deps(t, tt.tags)
			have := map[string]bool{}
			for _, p := range got {
				have[p] = true
				for _, f := range tt.rules {
					if p == f || strings.HasPrefix(p, f) && (strings.HasSuffix(f, "/") || strings.HasPrefix(p[len(f):], "/")) {
						t.Errorf("the %s agent imports %s (forbidden: %s)", tt.name, p, f)
					}
				}
			}
			for _, p := range tt.mustHave {
				if !have[p] {
					t.Errorf("the %s agent does not import %s: is this the agent's graph?", tt.name, p)
				}
			}
		})
	}
	// The rules catch what they are meant to: the daemon's graph breaks them.
	cmd := exec.Command("go", "list", "-deps", "../fleetd")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ../fleetd: %v", err)
	}
	for _, f := range []string{module + "fleet", "go.etcd.io/etcd/", "github.com/aws/aws-sdk-go-v2/service/ec2", "cloud.google.com/go/compute/apiv1"} {
		if !bytes.Contains(out, []byte("\n"+f)) {
			t.Errorf("fleetd's graph has no %s: the rule would not catch it", f)
		}
	}
}

// maxAgentBytes is the slim agent's budget per architecture (issue 30).
const maxAgentBytes = 20 << 20

// TestAgentBinary builds the slim agent the way `make release` does
// (stripped, trimmed, static) for both architectures, checks its size, and
// runs the host's one as a real process.
func TestAgentBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent")
	}
	dir := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		out := filepath.Join(dir, "fleetd-agent-linux-"+arch)
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=v1.2.3", "-o", out, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build linux/%s: %v\n%s", arch, err, b)
		}
		st, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("fleetd-agent linux/%s: %.1f MB", arch, float64(st.Size())/(1<<20))
		if st.Size() > maxAgentBytes {
			t.Errorf("fleetd-agent linux/%s is %d bytes, over the %d budget", arch, st.Size(), maxAgentBytes)
		}
	}
	if runtime.GOOS != "linux" {
		return
	}
	bin := filepath.Join(dir, "fleetd-agent-linux-"+runtime.GOARCH)
	cfg := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(cfg, []byte(`{"fleet": "f"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"version", []string{"version"}, 0, "fleetd-agent v1.2.3 ("},
		{"missing config", []string{"agent", "-config", filepath.Join(dir, "none.json")}, 1, "no such file"},
		{"bad config", []string{"-config", cfg}, 2, "Error:"},
		{"stray argument", []string{"agent", "extra"}, 2, "agent takes no arguments"},
		{"unknown flag", []string{"-nope"}, 2, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := exec.Command(bin, tt.args...).CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.code || !strings.Contains(string(out), tt.contains) {
				t.Errorf("fleetd-agent %q: exit %d, output %q; want exit %d containing %q", tt.args, code, out, tt.code, tt.contains)
			}
		})
	}
}
