package bootstrap

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func putFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestIndexAgents covers the lookup order (agent dirs, then the daemon's
// own executable) and the ELF check that refuses a file built for the
// wrong machine.
func TestIndexAgents(t *testing.T) {
	self, err := os.Executable() // this test binary: a real ELF for the host
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inspectAgent(self); runtime.GOOS != "linux" || err != nil {
		t.Skipf("the test binary is not a linux agent candidate (%s/%s): %v", runtime.GOOS, runtime.GOARCH, err)
	}
	host := runtime.GOARCH
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[host]
	amd, arm := StubELF("amd64"), StubELF("arm64")

	tests := []struct {
		name    string
		files   map[string][]byte // in the first dir
		second  map[string][]byte // in the second dir
		self    string
		want    map[string]string // arch → sha256, or "self"
		skipped []string          // substrings of Skipped
	}{
		{name: "nothing, no self", want: map[string]string{}},
		{name: "self only", self: self, want: map[string]string{host: "self"}},
		{name: "both files", files: map[string][]byte{"fleetd-linux-amd64": amd, "fleetd-linux-arm64": arm}, self: self,
			want: map[string]string{"amd64": sum(amd), "arm64": sum(arm)}},
		{name: "other arch file plus self", files: map[string][]byte{AgentFileName(other): StubELF(other)}, self: self,
			want: map[string]string{host: "self", other: sum(StubELF(other))}},
		{name: "first dir wins", files: map[string][]byte{"fleetd-linux-arm64": arm}, second: map[string][]byte{"fleetd-linux-arm64": append(StubELF("arm64"), 0)},
			want: map[string]string{"arm64": sum(arm)}},
		{name: "second dir fills in", second: map[string][]byte{"fleetd-linux-arm64": arm}, want: map[string]string{"arm64": sum(arm)}},
		{name: "wrong machine", files: map[string][]byte{"fleetd-linux-arm64": amd}, want: map[string]string{},
			skipped: []string{"fleetd-linux-arm64: built for linux/amd64, not linux/arm64"}},
		{name: "not ELF", files: map[string][]byte{"fleetd-linux-amd64": []byte("#!/bin/sh\necho hi\n")}, second: map[string][]byte{"fleetd-linux-amd64": amd},
			want: map[string]string{"amd64": sum(amd)}, skipped: []string{"not an ELF executable"}},
		{name: "a real binary under the other name", files: map[string][]byte{AgentFileName(other): mustRead(t, self)}, want: map[string]string{},
			skipped: []string{"built for linux/" + host}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d1, d2 := t.TempDir(), t.TempDir()
			for n, b := range tt.files {
				putFile(t, d1, n, b)
			}
			for n, b := range tt.second {
				putFile(t, d2, n, b)
			}
			x := IndexAgents([]string{d1, filepath.Join(d1, "missing"), d2}, tt.self)
			if got := len(x.Binaries()); got != len(tt.want) {
				t.Errorf("%d binaries %+v, want %v", got, x.Binaries(), tt.want)
			}
			for arch, want := range tt.want {
				b, ok := x.Lookup(arch)
				switch {
				case !ok:
					t.Errorf("no %s binary", arch)
				case want == "self":
					if !b.Self || b.Path != self || b.Arch != arch || len(b.SHA256) != 64 || b.Size == 0 {
						t.Errorf("%s = %+v, want the daemon's own executable", arch, b)
					}
				case b.SHA256 != want || b.Self || b.Arch != arch || !strings.HasPrefix(b.Path, d1) && !strings.HasPrefix(b.Path, d2):
					t.Errorf("%s = %+v, want sha256 %s from a dir", arch, b, want)
				}
			}
			if len(x.Skipped) != len(tt.skipped) {
				t.Errorf("skipped %q, want %q", x.Skipped, tt.skipped)
			}
			for i, s := range tt.skipped {
				if i < len(x.Skipped) && !strings.Contains(x.Skipped[i], s) {
					t.Errorf("skipped[%d] = %q, want it to say %q", i, x.Skipped[i], s)
				}
			}
		})
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestUserDataPinsAgentPerArch: each node's user-data downloads the agent
// for its architecture and pins that binary's sha256; an architecture
// without one is an error naming it and where the daemon looked.
func TestUserDataPinsAgentPerArch(t *testing.T) {
	dir := t.TempDir()
	amd, arm := StubELF("amd64"), StubELF("arm64")
	putFile(t, dir, "fleetd-linux-amd64", amd)
	putFile(t, dir, "fleetd-linux-arm64", arm)
	x := IndexAgents([]string{dir}, "")
	for _, tt := range []struct{ arch, want, sha string }{{"", "amd64", sum(amd)}, {"amd64", "amd64", sum(amd)}, {"arm64", "arm64", sum(arm)}} {
		in := sample()
		u, sha, err := x.AgentDownload("https://10.0.0.2:7777", "bert", "bert-1-0001", tt.arch, false)
		if err != nil {
			t.Fatal(err)
		}
		pu, err := url.Parse(u)
		if err != nil || pu.Path != "/v1/agent/binary" || pu.Query().Get("arch") != tt.want || pu.Query().Get("node") != "bert-1-0001" || pu.Query().Get("fleet") != "bert" {
			t.Errorf("arch %q: URL %s", tt.arch, u)
		}
		in.AgentURL, in.AgentSHA256 = u, sha
		doc, err := Render(in)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(doc, "echo '"+tt.sha+"  "+AgentBinaryPath+".download' | sha256sum -c -") || !strings.Contains(doc, u) {
			t.Errorf("arch %q: user-data does not download %s pinned to %s:\n%s", tt.arch, u, tt.sha, doc)
		}
	}

	only := IndexAgents([]string{dir + "/none"}, "")
	_, _, err := only.AgentDownload("https://10.0.0.2:7777", "bert", "n", "arm64", false)
	var ne *NoAgentError
	if !errors.As(err, &ne) || ne.Arch != "arm64" || !strings.Contains(err.Error(), "fleetd-linux-arm64") || !strings.Contains(err.Error(), dir+"/none") {
		t.Fatalf("err = %v, want a NoAgentError for arm64 naming the directory", err)
	}
}

// TestLookupFlavors: a fleet gets the smallest build that can do its job
// (slim by default; the node-store build for access = "node"), falling
// back to bigger builds, the daemon itself last; the download URL asks for
// the same flavor the user-data pins.
func TestLookupFlavors(t *testing.T) {
	slim, node, full := StubELF("arm64"), append(StubELF("arm64"), 1), append(StubELF("arm64"), 2)
	names := map[Flavor]string{FlavorSlim: "fleetd-agent-linux-arm64", FlavorNode: "fleetd-agent-node-linux-arm64", FlavorFull: "fleetd-linux-arm64"}
	bytesOf := map[Flavor][]byte{FlavorSlim: slim, FlavorNode: node, FlavorFull: full}
	tests := []struct {
		name       string
		have       []Flavor
		nodeStores bool
		want       Flavor // "" for none
	}{
		{"all, default", []Flavor{FlavorSlim, FlavorNode, FlavorFull}, false, FlavorSlim},
		{"all, node stores", []Flavor{FlavorSlim, FlavorNode, FlavorFull}, true, FlavorNode},
		{"no slim, default", []Flavor{FlavorNode, FlavorFull}, false, FlavorNode},
		{"full only, default", []Flavor{FlavorFull}, false, FlavorFull},
		{"full only, node stores", []Flavor{FlavorFull}, true, FlavorFull},
		{"slim only, node stores", []Flavor{FlavorSlim}, true, ""},
		{"slim only, default", []Flavor{FlavorSlim}, false, FlavorSlim},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tt.have {
				putFile(t, dir, names[f], bytesOf[f])
			}
			x := IndexAgents([]string{dir}, "")
			b, ok := x.LookupFor("arm64", tt.nodeStores)
			if tt.want == "" {
				if ok {
					t.Fatalf("LookupFor = %+v, want none", b)
				}
				if _, _, err := x.AgentDownload("https://d", "f", "n", "arm64", tt.nodeStores); err == nil {
					t.Error("AgentDownload found an agent")
				}
				return
			}
			if !ok || b.Flavor != tt.want || b.SHA256 != sum(bytesOf[tt.want]) || b.Path != filepath.Join(dir, names[tt.want]) {
				t.Fatalf("LookupFor = %+v %v, want the %s build", b, ok, tt.want)
			}
			u, sha, err := x.AgentDownload("https://d", "f", "n", "arm64", tt.nodeStores)
			if err != nil || sha != b.SHA256 {
				t.Fatalf("AgentDownload = %s %s %v", u, sha, err)
			}
			pu, _ := url.Parse(u)
			if got := pu.Query().Get("flavor"); (got == string(FlavorNode)) != tt.nodeStores {
				t.Errorf("URL %s: flavor %q for nodeStores=%v", u, got, tt.nodeStores)
			}
		})
	}
}
