package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestReleaseTarget: `make release` cross-builds static, trimmed binaries
// for linux/amd64 and linux/arm64 with the version and commit linked in
// and VCS stamping left on, then writes SHA256SUMS.
func TestReleaseTarget(t *testing.T) {
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make not installed")
	}
	cmd := exec.Command(mk, "-n", "release", "VERSION=v9.9.9", "COMMIT=0123456789abcdef0123456789abcdef01234567")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n release: %v\n%s", err, out)
	}
	script := string(out)
	for _, want := range []string{"linux/amd64", "linux/arm64", "CGO_ENABLED=0", "-trimpath", "-buildvcs=true",
		"-s -w -X main.version=v9.9.9 -X main.commit=0123456789abcdef0123456789abcdef01234567", "sha256sum fleetd-* > SHA256SUMS",
		"-o dist/fleetd-linux-arm64 ./cmd/fleetd ", "-o dist/fleetd-agent-linux-arm64 ./cmd/fleetd-agent ",
		"-tags nodestore -ldflags", "-o dist/fleetd-agent-node-linux-amd64 ./cmd/fleetd-agent "} {
		if !strings.Contains(script, want) {
			t.Errorf("make release does not run %q:\n%s", want, script)
		}
	}
	if strings.Contains(script, "-buildvcs=false") {
		t.Errorf("make release turns VCS stamping off:\n%s", script)
	}
}

// TestReleaseBinary runs `make release` for this machine's architecture
// only: the binary reports the linked commit, `go version -m` shows the
// VCS revision, and SHA256SUMS checks.
func TestReleaseBinary(t *testing.T) {
	// A cross-build from an empty cache takes minutes on two cores: run it
	// when the release path changes (FLEETD_RELEASE_TEST=1), not on every
	// `make test`; TestReleaseTarget checks the commands every time.
	if testing.Short() || os.Getenv("FLEETD_RELEASE_TEST") != "1" {
		t.Skip("builds release binaries: set FLEETD_RELEASE_TEST=1")
	}
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make not installed")
	}
	if runtime.GOOS != "linux" {
		t.Skip("release binaries are for linux")
	}
	root := filepath.Join("..", "..")
	if out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output(); err != nil || len(out) < 40 {
		t.Skip("not a git checkout: release builds need the VCS revision")
	}
	dist := t.TempDir()
	const commit = "0123456789abcdef0123456789abcdef01234567"
	cmd := exec.Command(mk, "release", "RELEASE_PLATFORMS=linux/"+runtime.GOARCH, "DIST="+dist, "VERSION=v9.9.9", "COMMIT="+commit)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	bin := filepath.Join(dist, "fleetd-linux-"+runtime.GOARCH)
	out, err := exec.Command(bin, "version", "-json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var info map[string]string
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	if info["version"] != "v9.9.9" || info["commit"] != commit {
		t.Errorf("version -json of the release binary: %v", info)
	}
	out, err = exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"vcs.revision=", "-trimpath=true", "CGO_ENABLED=0"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("go version -m %s lacks %s:\n%s", bin, want, out)
		}
	}
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	for _, name := range []string{"fleetd", "fleetd-agent", "fleetd-agent-node"} {
		if err != nil || !strings.Contains(string(sums), "  "+name+"-linux-"+runtime.GOARCH+"\n") {
			t.Fatalf("SHA256SUMS lacks %s: %q %v", name, sums, err)
		}
	}
	// The slim agent is the release's point: it runs, says its version,
	// and a second build from the same commit is byte for byte the same.
	agentBin := filepath.Join(dist, "fleetd-agent-linux-"+runtime.GOARCH)
	if out, err := exec.Command(agentBin, "version").Output(); err != nil || !strings.HasPrefix(string(out), "fleetd-agent v9.9.9 (") {
		t.Errorf("fleetd-agent version: %q %v", out, err)
	}
	again := filepath.Join(t.TempDir(), "fleetd-agent")
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=true", "-ldflags", "-s -w -X main.version=v9.9.9 -X main.commit="+commit, "-o", again, "./cmd/fleetd-agent")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("rebuild: %v\n%s", err, out)
	}
	if a, b := mustRead(t, agentBin), mustRead(t, again); !bytes.Equal(a, b) {
		t.Errorf("two builds of fleetd-agent from one commit differ (%d and %d bytes): not reproducible", len(a), len(b))
	}
	check := exec.Command("sha256sum", "-c", "SHA256SUMS")
	check.Dir = dist
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c: %v\n%s", err, out)
	}
}
