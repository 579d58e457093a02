package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// installBlock is the README's offline install commands: the first sh
// block after an <!-- install-test: run --> marker.
func installBlock(t *testing.T, readme string) string {
	t.Helper()
	_, after, ok := strings.Cut(readme, "<!-- install-test: run -->")
	if !ok {
		t.Fatal("README.md has no <!-- install-test: run --> block")
	}
	_, body, ok := strings.Cut(after, "```sh\n")
	if !ok {
		t.Fatal("no sh block after the install-test marker")
	}
	body, _, ok = strings.Cut(body, "```")
	if !ok {
		t.Fatal("unterminated sh block after the install-test marker")
	}
	return body
}

// TestInstallDocsHonest: no page tells a reader to paste a download from
// a release that does not exist, and the README's install block is
// offline (no URL, no clone: those are described, not commanded).
func TestInstallDocsHonest(t *testing.T) {
	root := filepath.Join("..", "..")
	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	pages = append(pages, filepath.Join(root, "README.md"))
	fence := regexp.MustCompile("(?s)```(?:sh|bash|console)\n(.*?)```")
	tests := []struct {
		name string
		bad  *regexp.Regexp
	}{
		{"release downloads", regexp.MustCompile(`releases/download`)},
		{"raw files of a tag", regexp.MustCompile(`raw\.githubusercontent\.com`)},
	}
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fence.FindAllStringSubmatch(string(b), -1) {
			for _, tt := range tests {
				if loc := tt.bad.FindString(m[1]); loc != "" {
					t.Errorf("%s: a command block pastes %s (%q), which do not exist yet:\n%s", p, tt.name, loc, m[1])
				}
			}
		}
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := installBlock(t, string(readme))
	for _, bad := range []string{"http://", "https://", "git clone", "curl ", "wget "} {
		if strings.Contains(block, bad) {
			t.Errorf("the README's offline install block uses %q:\n%s", bad, block)
		}
	}
	if !strings.Contains(block, "make release") {
		t.Errorf("the install block does not build with make release:\n%s", block)
	}
}

// TestReadmeInstall runs the README's install block, as written, in a
// fresh clone of this checkout: make release, the checksum check,
// installing the daemon, the agents and the unit, fleetd version.
// /usr/local/bin and /etc/systemd/system become temporary directories and
// sudo runs the command as the test's user. It builds the release for
// this machine's architecture only (RELEASE_PLATFORMS from the
// environment), minutes on two cores: set FLEETD_INSTALL_TEST=1.
func TestReadmeInstall(t *testing.T) {
	if testing.Short() || os.Getenv("FLEETD_INSTALL_TEST") != "1" {
		t.Skip("builds a release in a fresh clone: set FLEETD_INSTALL_TEST=1")
	}
	for _, tool := range []string{"make", "git", "sha256sum", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := installBlock(t, string(readme))
	tmp := t.TempDir()
	clone := filepath.Join(tmp, "fleetd")
	// A clean clone of what is committed: the release must not depend on
	// anything the working tree has that the repository does not.
	if out, err := exec.Command("git", "clone", "-q", root, clone).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	bin, unitDir := filepath.Join(tmp, "usr-local-bin"), filepath.Join(tmp, "systemd")
	for _, d := range []string{bin, unitDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script := "set -euo pipefail\nsudo() { \"$@\"; }\n" +
		strings.NewReplacer("/usr/local/bin", bin, "/etc/systemd/system", unitDir).Replace(block)
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = clone
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "RELEASE_PLATFORMS=linux/"+runtime.GOARCH)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's install block failed: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^fleetd \S+ \(go1\.`).Match(out) {
		t.Errorf("no `fleetd version` line in the output:\n%s", out)
	}
	for _, name := range []string{"fleetd", "fleetd-agent-linux-" + runtime.GOARCH, "fleetd-agent-node-linux-" + runtime.GOARCH} {
		st, err := os.Stat(filepath.Join(bin, name))
		if err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("%s not installed executable: %v", name, err)
		}
	}
	if v, err := exec.Command(filepath.Join(bin, "fleetd-agent-linux-"+runtime.GOARCH), "version").Output(); err != nil || !strings.HasPrefix(string(v), "fleetd-agent ") {
		t.Errorf("the installed agent: %q %v", v, err)
	}
	if _, err := os.Stat(filepath.Join(unitDir, "fleetd.service")); err != nil {
		t.Errorf("unit not installed: %v", err)
	}
}
