package bootstrap

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func sample() Input {
	tok, _ := NewToken()
	return Input{
		Agent: AgentConfig{Fleet: "bert", NodeID: "bert-1-0001", DaemonURL: "https://10.0.0.2:7777", DaemonURLs: []string{"https://10.0.1.2:7777", "https://10.0.2.2:7777"}, Token: tok,
			CAFingerprint: "sha256:" + strings.Repeat("ab", 32), Metadata: MetadataConfig{Kind: "aws-imds"},
			WorkDir: "/var/lib/fleetd", LogDir: "/var/log/fleetd"},
		CACertPEM:   []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
		AgentURL:    "https://10.0.0.2:7777/v1/agent/binary/v0.1.0/linux-amd64",
		AgentSHA256: strings.Repeat("0f", 32),
		Setup:       []string{"apt-get install -y python3-torch", "echo 'quoted: \"yes\"' > /tmp/x"},
		Env:         map[string]string{"NCCL_DEBUG": "WARN"},
	}
}

func TestRenderRoundTrip(t *testing.T) {
	in := sample()
	doc, err := Render(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc, "#cloud-config\n") {
		t.Fatalf("missing header:\n%s", doc)
	}
	got, err := AgentConfigFrom(doc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, in.Agent) {
		t.Fatalf("agent config round trip:\n got %+v\nwant %+v", got, in.Agent)
	}
	for _, want := range []string{in.AgentSHA256, "sha256sum -c", "--cacert", "systemctl", "python3-torch", "NCCL_DEBUG=WARN"} {
		if !strings.Contains(doc, want) {
			t.Errorf("document lacks %q", want)
		}
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Input)
	}{
		{"no node", func(i *Input) { i.Agent.NodeID = "" }},
		{"daemon without token", func(i *Input) { i.Agent.Token = "" }},
		{"download without checksum", func(i *Input) { i.AgentSHA256 = "" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := sample()
			tt.mod(&in)
			if _, err := Render(in); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

func TestTokenHash(t *testing.T) {
	a, ha := NewToken()
	b, hb := NewToken()
	if a == b || ha == hb || HashToken(a) != ha || strings.Contains(ha, a) {
		t.Fatal("tokens must be unique and stored only as hashes")
	}
}

// TestCloudInitSchema validates rendered documents with the real cloud-init
// schema validator (Debian package cloud-init; CI installs it).
func TestCloudInitSchema(t *testing.T) {
	ci, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Skip("cloud-init not installed (apt-get install cloud-init); .ci/run installs it")
	}
	variants := map[string]func(*Input){
		"full":        func(*Input) {},
		"no-download": func(i *Input) { i.AgentURL, i.AgentSHA256, i.CACertPEM = "", "", nil },
		"standalone":  func(i *Input) { i.Agent.DaemonURL, i.Agent.Token, i.Setup = "", "", nil },
		"mounts": func(i *Input) {
			var err error
			if i.Mounts, err = MountsFor(mountData); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, mod := range variants {
		t.Run(name, func(t *testing.T) {
			in := sample()
			mod(&in)
			doc, err := Render(in)
			if err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(t.TempDir(), "user-data")
			if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(ci, "schema", "--config-file", f).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "Valid") {
				t.Fatalf("cloud-init schema: %v\n%s\ndocument:\n%s", err, out, doc)
			}
		})
	}
	// The validator must catch a broken document, or this test proves nothing.
	f := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(f, []byte("#cloud-config\nwrite_files: 3\nruncmd: {a: b}\n"), 0o600)
	if out, err := exec.Command(ci, "schema", "--config-file", f).CombinedOutput(); err == nil {
		t.Fatalf("cloud-init accepted a broken document:\n%s", out)
	}
}
