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

// TestAutoscaleConfig: the autoscale block sets the autoscaler's timings
// and threshold; bad values are errors.
func TestAutoscaleConfig(t *testing.T) {
	cfg, _, diags := ParseConfig("a.hcl", []byte("autoscale {\n  measure_for = \"3s\"\n  min_interval = \"2s\"\n  marginal_efficiency = 0.7\n}\n"))
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	p := cfg.Autoscale.Params()
	if p.MeasureFor.Seconds() != 3 || p.MinInterval.Seconds() != 2 || p.MarginalEfficiency != 0.7 {
		t.Errorf("params %+v", p)
	}
	if p := (&Config{}).Autoscale.Params(); p.MeasureFor != 0 || p.MarginalEfficiency != 0 {
		t.Errorf("no block: %+v, want zero (the defaults)", p)
	}
	for _, bad := range []string{`measure_for = "soon"`, `min_interval = "-1s"`, `marginal_efficiency = 1.5`, `marginal_efficiency = 0`} {
		if _, _, diags := ParseConfig("b.hcl", []byte("autoscale {\n  "+bad+"\n}\n")); !diags.HasErrors() || !strings.Contains(diags.Error(), "autoscale") {
			t.Errorf("%s: %v, want an autoscale error", bad, diags)
		}
	}
}
