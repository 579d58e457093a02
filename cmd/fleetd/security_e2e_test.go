package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/internal/testutil"
)

// TestSecurityTLSDaemonE2E runs the real binary as an operator would:
// `fleetd serve -config daemon.hcl` with `tls {}`. The daemon creates its
// secrets 0600 in a 0700 data dir, serves only TLS, and the CLI reaches it
// only with the CA pinned (by fingerprint in any pasted form, or by the CA
// file); a wrong pin, no pin and plain HTTP are refused, and the admin
// token never appears in the daemon's log.
func TestSecurityTLSDaemonE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := fleetdBinary(t)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	addr := freeAddr(t)
	cfgPath := filepath.Join(dir, "daemon.hcl")
	cfg := fmt.Sprintf("listen = %q\ndata_dir = %q\nlog_level = \"debug\"\ntls {}\n", addr, dataDir)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "-config", cfgPath)
	var logs testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-done
		}
	})

	// The CA and token appear on first start.
	var caPEM, token []byte
	deadline := time.Now().Add(30 * time.Second)
	for {
		caPEM, _ = os.ReadFile(filepath.Join(dataDir, "ca.pem"))
		token, _ = os.ReadFile(filepath.Join(dataDir, "token"))
		if len(caPEM) > 0 && len(token) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no CA or token after 30s\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	tok := strings.TrimSpace(string(token))
	blk, _ := pem.Decode(caPEM)
	if blk == nil {
		t.Fatalf("ca.pem is not PEM: %q", caPEM)
	}
	sum := sha256.Sum256(blk.Bytes)
	fp := hex.EncodeToString(sum[:])

	// Healthy over TLS with the pin.
	tc, err := api.ClientTLSConfig(nil, fp)
	if err != nil {
		t.Fatal(err)
	}
	pinned := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 5 * time.Second}
	for i := 0; ; i++ {
		resp, err := pinned.Get("https://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if i > 200 {
			t.Fatalf("daemon not healthy over TLS: %v\n%s", err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	testutil.CheckModes(t, dataDir, 0o700, 0o600, "state.db", "token", "node-secret", "ca.pem", "ca-key.pem")

	var colons []string
	for i := 0; i < len(fp); i += 2 {
		colons = append(colons, strings.ToUpper(fp[i:i+2]))
	}
	wrong := []byte(fp)
	if wrong[0] == 'a' {
		wrong[0] = 'b'
	} else {
		wrong[0] = 'a'
	}
	for _, c := range []struct {
		name   string
		env    []string
		code   int
		stderr string
	}{
		{"pinned", []string{"FLEETD_CA_FINGERPRINT=" + fp}, 0, ""},
		{"pinned as sha256:AA:BB", []string{"FLEETD_CA_FINGERPRINT=sha256:" + strings.Join(colons, ":")}, 0, ""},
		{"CA file", []string{"FLEETD_CACERT=" + filepath.Join(dataDir, "ca.pem")}, 0, ""},
		{"wrong pin", []string{"FLEETD_CA_FINGERPRINT=" + string(wrong)}, 1, "fingerprint"},
		{"no pin", nil, 1, "certificate"},
		{"pinned, wrong token", []string{"FLEETD_CA_FINGERPRINT=" + fp, "FLEETD_TOKEN=fleetd_wrong_wrong_wrong"}, 1, "401"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := exec.Command(bin, "status", "-json")
			cl.Env = append(os.Environ(), "FLEETD_ADDR=https://"+addr, "FLEETD_TOKEN="+tok, "FLEETD_CA_FINGERPRINT=", "FLEETD_CACERT=")
			cl.Env = append(cl.Env, c.env...)
			out, errOut, code := runCLI(t, cl)
			if code != c.code || !strings.Contains(errOut, c.stderr) {
				t.Fatalf("exit %d (want %d), stderr %q (want it to mention %q)", code, c.code, errOut, c.stderr)
			}
			if code == 0 && !strings.Contains(out, `"daemon_id"`) {
				t.Fatalf("status output: %s", out)
			}
		})
	}

	// Plain HTTP to the TLS port, token attached: never an API answer.
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || bytes.Contains(b, []byte("daemon_id")) {
			t.Fatalf("plain HTTP to the TLS port: HTTP %d %s", resp.StatusCode, b)
		}
	}

	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("daemon exit: %v\n%s", err, logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("daemon did not stop on SIGTERM")
	}
	out := logs.String()
	if !strings.Contains(out, "fleetd daemon serving") {
		t.Fatalf("daemon log not captured:\n%s", out)
	}
	if strings.Contains(out, tok) {
		t.Fatalf("the admin token is in the daemon's log:\n%s", out)
	}
	if strings.Contains(out, "PRIVATE KEY") {
		t.Fatalf("a private key is in the daemon's log")
	}
}
