package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/plugins"
	"github.com/hashicorp/go-hclog"
)

func TestPluginCommandUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"plugin"}, "Usage: fleetd plugin provider NAME"},
		{[]string{"plugin", "provisioner", "local"}, "Usage: fleetd plugin provider NAME"},
		{[]string{"plugin", "provider", "no-such-provider"}, `unknown built-in provider "no-such-provider"`},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", tc.args, code, exitUsage)
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: stderr %q, want %q", tc.args, stderr.String(), tc.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("%v: wrote %q to stdout, which belongs to the plugin handshake", tc.args, stdout.String())
		}
	}
}

func TestPluginCommandIsHidden(t *testing.T) {
	var out bytes.Buffer
	usage(&out)
	if strings.Contains(out.String(), "plugin") {
		t.Errorf("usage lists the internal plugin command:\n%s", out.String())
	}
}

// TestBuiltinProvidersReexec starts every built-in provider the way the
// daemon does: the real fleetd binary re-executed as `fleetd plugin
// provider NAME` under a plugins.Manager.
func TestBuiltinProvidersReexec(t *testing.T) {
	// The exact set: a provider whose registration breaks must fail here,
	// not shrink the loop below (DESIGN.md: aws, gcp, local, sim).
	names := builtinProviderNames()
	if want := []string{"aws", "gcp", "local", "sim"}; !slices.Equal(names, want) {
		t.Fatalf("built-in providers %v, want %v", names, want)
	}
	bin := fleetdBinary(t)
	m := plugins.NewManager(plugins.ManagerOptions{
		SelfExe:  bin,
		Builtins: names,
		Env:      func(string) []string { return []string{envLocalStateDir + "=" + t.TempDir()} },
		Logger:   hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: t.Output()}),
	})
	defer m.Close()
	for _, name := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		p, err := m.Get(ctx, name)
		if err != nil {
			cancel()
			t.Errorf("start built-in %s: %v", name, err)
			continue
		}
		info, err := p.Info(ctx)
		cancel()
		if err != nil || info.Name != name {
			t.Errorf("built-in %s: Info = %+v, %v", name, info, err)
		}
	}
	if got := len(m.PIDs()); got != len(names) {
		t.Errorf("%d plugin processes for %d built-ins", got, len(names))
	}

	// Run by hand, the plugin refuses (no magic cookie) instead of
	// printing a protocol line.
	cmd := exec.Command(bin, "plugin", "provider", names[0])
	cmd.Env = []string{}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "This binary is a plugin") || stdout.Len() != 0 {
		t.Errorf("plugin run by hand: %v, stdout %q, stderr %q", err, stdout.String(), stderr.String())
	}
}
