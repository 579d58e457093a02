package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/internal/testutil"
)

func runServeInProcess(t *testing.T, args ...string) (stdout, stderr *testutil.SyncBuffer, stop func() int) {
	t.Helper()
	stdout, stderr = &testutil.SyncBuffer{}, &testutil.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- serve(ctx, args, stdout, stderr) }()
	stopped := false
	var code int
	stop = func() int {
		if !stopped {
			cancel()
			select {
			case code = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("serve did not return 30s after its context was cancelled")
			}
			stopped = true
		}
		return code
	}
	t.Cleanup(func() { stop() })
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stdout.String(), "dashboard: ") {
		select {
		case code := <-done:
			t.Fatalf("serve exited %d before its startup lines:\n%s\n%s", code, stdout, stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no startup lines after 30s:\n%s\n%s", stdout, stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return stdout, stderr, stop
}

// exported returns the value of an "export NAME=value" startup line.
func exported(t *testing.T, out, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*export ` + name + `=(\S+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no export %s line in:\n%s", name, out)
	}
	return m[1]
}

// TestServeDevDataDir: -dev without -data-dir makes a temporary data dir
// and deletes it at exit, and says so; with -data-dir, the directory is
// the user's: the startup line says it is kept, and it is.
func TestServeDevDataDir(t *testing.T) {
	t.Run("temporary", func(t *testing.T) {
		stdout, _, stop := runServeInProcess(t, "-dev", "-listen", "127.0.0.1:0")
		m := regexp.MustCompile(`data in (\S+) \(deleted on exit\)`).FindStringSubmatch(stdout.String())
		if m == nil {
			t.Fatalf("startup line does not say the temporary data dir is deleted on exit:\n%s", stdout)
		}
		if _, err := os.Stat(filepath.Join(m[1], "state.db")); err != nil {
			t.Fatalf("running dev daemon: %v", err)
		}
		if code := stop(); code != exitOK {
			t.Errorf("serve exit %d", code)
		}
		if _, err := os.Stat(m[1]); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("temporary data dir %s after exit: %v, want it deleted", m[1], err)
		}
	})
	t.Run("given", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "mine")
		stdout, _, stop := runServeInProcess(t, "-dev", "-listen", "127.0.0.1:0", "-data-dir", dir)
		if !strings.Contains(stdout.String(), "data in "+dir+" (kept at exit") || strings.Contains(stdout.String(), "deleted") {
			t.Errorf("startup line with -data-dir does not say the data is kept:\n%s", stdout)
		}
		if code := stop(); code != exitOK {
			t.Errorf("serve exit %d", code)
		}
		for _, f := range []string{"state.db", "token"} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Errorf("-dev -data-dir %s after exit: %v, want the user's directory kept", dir, err)
			}
		}
	})
}

// TestServeDevStartupLinesAndLoopbackRefusal: the dev daemon's startup
// lines give the exports, the token file and the dashboard URL with the
// token in its fragment (the dashboard reads #token=); it warns that only
// local nodes reach its loopback URL, and refuses an aws fleet with a
// message that names advertise_url.
func TestServeDevStartupLinesAndLoopbackRefusal(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL", "")
	t.Setenv("AWS_ENDPOINT_URL_EC2", "")
	dir := t.TempDir()
	stdout, stderr, _ := runServeInProcess(t, "-dev", "-listen", "127.0.0.1:0", "-data-dir", dir)
	out := stdout.String()
	addr, token := exported(t, out, "FLEETD_ADDR"), exported(t, out, "FLEETD_TOKEN")
	for _, want := range []string{"admin token file: " + filepath.Join(dir, "token"), "dashboard: " + addr + "/#token=" + token} {
		if !strings.Contains(out, want) {
			t.Errorf("startup lines lack %q:\n%s", want, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "token")); err != nil || strings.TrimSpace(string(b)) != token {
		t.Errorf("token file: %q %v, want the printed token", b, err)
	}
	if logs := stderr.String(); !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "loopback") || !strings.Contains(logs, "advertise_url") {
		t.Errorf("no loud warning about the loopback URL:\n%s", logs)
	}

	src, err := os.ReadFile(filepath.Join("..", "..", "configs", "examples", "aws.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := api.NewClient(addr, api.ClientOptions{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Apply(context.Background(), api.ApplyRequest{Filename: "aws.hcl", Source: string(src)})
	var he *api.HTTPError
	if !errors.As(err, &he) || he.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("apply of configs/examples/aws.hcl to a loopback dev daemon: %v, want HTTP 422", err)
	}
	for _, want := range []string{"aws", addr, "loopback", "advertise_url"} {
		if !strings.Contains(he.Body.Error, want) {
			t.Errorf("refusal %q does not mention %q", he.Body.Error, want)
		}
	}
}

// TestServeStartupLinesTLS: a configured (non-dev) daemon names its token
// file instead of printing the token (its stdout goes to the journal),
// and gives the CA fingerprint and the dashboard URL.
func TestServeStartupLinesTLS(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "daemon.hcl")
	if err := os.WriteFile(cfg, []byte(`listen = "127.0.0.1:0"
data_dir = "data"
advertise_url = "https://fleetd.internal:7777"
tls {}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, _ := runServeInProcess(t, "-config", cfg)
	out := stdout.String()
	tokenFile := filepath.Join(dir, "data", "token")
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	fp := regexp.MustCompile(`CA fingerprint: ([0-9a-f]{64}) `).FindStringSubmatch(out)
	if fp == nil {
		t.Errorf("no CA fingerprint line:\n%s", out)
	}
	for _, want := range []string{"serving at https://fleetd.internal:7777", "admin token file: " + tokenFile, "dashboard: https://fleetd.internal:7777/#token=<the token in " + tokenFile + ">"} {
		if !strings.Contains(out, want) {
			t.Errorf("startup lines lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, strings.TrimSpace(string(tok))) || strings.Contains(stderr.String(), strings.TrimSpace(string(tok))) {
		t.Errorf("a configured daemon printed its admin token:\n%s", out)
	}
	if strings.Contains(stderr.String(), "advertise_url") {
		t.Errorf("warning about an unreachable URL with a routable advertise_url:\n%s", stderr)
	}
}
