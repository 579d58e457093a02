package fleet

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/providers/providertest"
)

const projectsConfig = `
max_gpus = 4
project "a" {
  quota_gpus = 2
  max_gpus   = 4
}
project "b" {
  quota_gpus = 2
}
`

// TestProjectsConfig: daemon.hcl's project blocks and max_gpus reach
// Config.Projects; a bad project is a positioned error.
func TestProjectsConfig(t *testing.T) {
	cfg, _, diags := ParseConfig("daemon.hcl", []byte("listen = \"127.0.0.1:0\"\n"+projectsConfig))
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	if cfg.Projects.Pool() != 4 || len(cfg.Projects.Projects) != 2 || cfg.Projects.Projects[0].MaxGPUs != 4 || cfg.Projects.Projects[1].MaxGPUs != 2 {
		t.Errorf("projects %+v", cfg.Projects)
	}
	_, _, diags = ParseConfig("daemon.hcl", []byte("project \"a\" {\n  quota_gpus = 8\n  max_gpus = 4\n}\n"))
	if !diags.HasErrors() || diags[0].Subject == nil || diags[0].Subject.Start.Line < 2 {
		t.Errorf("quota above max: %v, want a positioned error", diags)
	}
}

// projectsDaemon is a test daemon with projectsConfig's projects.
func projectsDaemon(t *testing.T) *testDaemon {
	t.Helper()
	cfg, _, diags := ParseConfig("daemon.hcl", []byte(projectsConfig))
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	mem := providertest.NewMemProvider()
	return launchTestDaemon(t, t.TempDir(), staticProviders{providertest.MemName: mem}, mem, Options{Config: cfg})
}

// TestApplyUnknownProject: plan and apply refuse a spec naming a project
// the daemon does not have, with the position of the project attribute.
func TestApplyUnknownProject(t *testing.T) {
	td := projectsDaemon(t)
	src := strings.Replace(memSpec, "min_nodes = 2", "project   = \"vison\"\n  min_nodes = 2", 1)
	for _, op := range []string{"plan", "apply"} {
		var err error
		if op == "plan" {
			_, err = td.client.Plan(context.Background(), api.ApplyRequest{Filename: "train.hcl", Source: src})
		} else {
			_, err = td.client.Apply(context.Background(), api.ApplyRequest{Filename: "train.hcl", Source: src})
		}
		var ae *api.HTTPError
		if !errors.As(err, &ae) || len(ae.Body.Diagnostics) == 0 {
			t.Fatalf("%s: %v, want diagnostics", op, err)
		}
		dg := ae.Body.Diagnostics[0]
		if dg.Filename != "train.hcl" || dg.Line != 3 || !strings.Contains(dg.Summary+dg.Detail, "vison") {
			t.Errorf("%s: diagnostic %+v, want train.hcl:3 naming the project", op, dg)
		}
	}
	ok := strings.Replace(memSpec, "min_nodes = 2", "project   = \"a\"\n  min_nodes = 2", 1)
	if _, err := td.client.Plan(context.Background(), api.ApplyRequest{Filename: "train.hcl", Source: ok}); err != nil {
		t.Errorf("plan naming project a: %v", err)
	}
}
