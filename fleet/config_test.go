package fleet

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestExampleDaemonConfigs: every daemon config under configs/ parses;
// the HA one yields a three-member embedded cluster.
func TestExampleDaemonConfigs(t *testing.T) {
	for _, name := range []string{"daemon.hcl", "daemon-ha.hcl"} {
		cfg, _, diags := LoadConfig(filepath.Join("..", "configs", name))
		if diags.HasErrors() {
			t.Fatalf("configs/%s: %s", name, diags.Error())
		}
		if name == "daemon-ha.hcl" {
			c := cfg.Cluster
			if c == nil || c.Embedded == nil || c.Name != "a" || len(c.Embedded.InitialCluster) != 3 || len(c.Endpoints()) != 3 || c.TTL().Seconds() != 3 {
				t.Errorf("daemon-ha.hcl cluster: %+v", c)
			}
		}
	}
	_, _, diags := ParseConfig("bad.hcl", []byte("cluster {\n}\n"))
	if !diags.HasErrors() || !strings.Contains(diags.Error(), "exactly one of") {
		t.Errorf("an empty cluster block: %v, want an error naming the choice", diags)
	}
}
