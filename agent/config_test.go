package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	const fp = "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	cases := []struct {
		name    string
		doc     string
		wantErr string // substring; "" means valid
	}{
		{"minimal", `{"fleet":"bert","node_id":"n-1"}`, ""},
		{"full", `{"fleet":"bert","node_id":"n-1","daemon_url":"https://10.0.0.1:7946","token":"t0k","ca_fingerprint":"` + fp + `",
			"metadata":{"kind":"aws-imds","url":"http://127.0.10.3:4000"},"work_dir":"/var/lib/fleetd","log_dir":"/var/log/fleetd"}`, ""},
		{"colon fingerprint", `{"fleet":"f","node_id":"n","ca_fingerprint":"` + strings.Repeat("AB:", 31) + `AB"}`, ""},
		{"gce", `{"fleet":"f","node_id":"n","metadata":{"kind":"gce"}}`, ""},
		{"missing fleet", `{"node_id":"n"}`, "fleet is required"},
		{"missing node", `{"fleet":"f"}`, "node_id is required"},
		{"slash in node", `{"fleet":"f","node_id":"../n"}`, "node_id"},
		{"unknown field", `{"fleet":"f","node_id":"n","daemon":"x"}`, "unknown field"},
		{"daemon without token", `{"fleet":"f","node_id":"n","daemon_url":"https://d:1"}`, "token is required"},
		{"daemon not a URL", `{"fleet":"f","node_id":"n","daemon_url":"d:1","token":"t"}`, "daemon_url"},
		{"short fingerprint", `{"fleet":"f","node_id":"n","ca_fingerprint":"sha256:abcd"}`, "32-byte"},
		{"bad metadata kind", `{"fleet":"f","node_id":"n","metadata":{"kind":"azure"}}`, "metadata.kind"},
		{"url with none", `{"fleet":"f","node_id":"n","metadata":{"kind":"none","url":"http://x"}}`, "metadata.url"},
		{"relative work dir", `{"fleet":"f","node_id":"n","work_dir":"var/lib"}`, "work_dir"},
		{"trailing data", `{"fleet":"f","node_id":"n"} {}`, "trailing"},
		{"not json", `fleet = "f"`, "decoding"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(c.doc))
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if cfg.WorkDir == "" || cfg.LogDir == "" || cfg.Metadata.Kind == "" {
					t.Fatalf("defaults not applied: %+v", cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, c.wantErr)
			}
		})
	}
}

func TestValidateReportsAllProblems(t *testing.T) {
	err := Config{Metadata: MetadataConfig{Kind: "x"}, WorkDir: "rel"}.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"fleet", "node_id", "metadata.kind", "work_dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(p, []byte(`{"fleet":"f","node_id":"n","metadata":{"kind":"aws-imds"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(p)
	if err != nil || cfg.NodeID != "n" || cfg.Metadata.Kind != MetadataAWSIMDS {
		t.Fatalf("LoadConfig = %+v, %v", cfg, err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.json")); err == nil {
		t.Fatal("missing file: no error")
	}
}
