package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/fleettest"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/internal/testutil"
)

// TestSlimAgentAgainstDaemon boots nodes the way a VM does, with the slim
// agent as a real process against a real daemon v1.4.0: an agent in the
// version window registers (the node joins); one two minors behind is
// refused, exits 1 saying why, and the node stays booting.
func TestSlimAgentAgainstDaemon(t *testing.T) {
	if testing.Short() || runtime.GOOS != "linux" {
		t.Skip("builds the agent and runs it against a daemon (linux)")
	}
	ctx := context.Background()
	d, stop, err := fleettest.Start(ctx, fleettest.Options{DataDir: t.TempDir(), AgentDir: t.TempDir(), Version: "v1.4.0"})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	client, err := api.NewClient(d.URL(), api.ClientOptions{Token: d.Token()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Apply(ctx, api.ApplyRequest{Filename: "e2e.hcl", Source: fleettest.Spec("e2e", 2, "sleep", "600")}); err != nil {
		t.Fatal(err)
	}
	var nodes []string
	waitUntil(t, "2 booting nodes", 30*time.Second, func() bool {
		nodes = nodesIn(t, d, state.NodeBooting)
		return len(nodes) == 2
	})
	tests := []struct {
		name, version string
		refused       bool
	}{
		{"in the window", "v1.3.2", false},
		{"two minors behind", "v1.2.0", true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(dir, "fleetd-agent")
			build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+tt.version, "-o", bin, ".")
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("build: %v\n%s", err, out)
			}
			node := nodes[i]
			cfg, _ := json.Marshal(bootstrap.AgentConfig{Fleet: "e2e", NodeID: node, DaemonURL: d.URL(), Token: d.NodeToken("e2e", node),
				Metadata: bootstrap.MetadataConfig{Kind: "none"}})
			cfgPath := filepath.Join(dir, "agent.json")
			if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "agent", "-config", cfgPath, "-root", dir)
			cmd.Env = append(os.Environ(), "FLEETD_NODE_ADDR=127.0.0.1")
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			defer func() { _ = cmd.Process.Kill(); <-exited }()
			if tt.refused {
				select {
				case err := <-exited:
					exited <- err
					if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(out.String(), "too-old") {
						t.Errorf("refused agent: %v, output:\n%s", err, out.String())
					}
				case <-time.After(60 * time.Second):
					t.Fatalf("the refused agent still runs after 60 s:\n%s", out.String())
				}
				if st := nodeState(t, d, node); st != state.NodeBooting {
					t.Errorf("refused node is %s, want booting", st)
				}
				return
			}
			waitUntil(t, node+" joined", 60*time.Second, func() bool { return nodeState(t, d, node) != state.NodeBooting })
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("agent exited: %v\n%s", err, out.String())
			default:
			}
		})
	}
}

func nodeState(t *testing.T, d *fleet.Daemon, id string) state.NodeState {
	t.Helper()
	var st state.NodeState
	if err := d.Store().View(context.Background(), func(tx state.Tx) error {
		n, err := tx.Node("e2e", id)
		st = n.State
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return st
}

func nodesIn(t *testing.T, d *fleet.Daemon, st state.NodeState) []string {
	t.Helper()
	var ids []string
	if err := d.Store().View(context.Background(), func(tx state.Tx) error {
		nodes, err := tx.Nodes("e2e")
		for _, n := range nodes {
			if n.State == st {
				ids = append(ids, n.ID)
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ids
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, timeout, 20*time.Millisecond, what, cond)
}
