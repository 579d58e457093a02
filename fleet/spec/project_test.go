package spec

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/fleetd/fleetd/fleet/budget"
)

func TestProjectAndBudget(t *testing.T) {
	tests := []struct {
		name     string
		top      string
		node     string
		projects ProjectSet // nil: testOptions' set
		noSet    bool
		project  string
		budget   *budget.Limits
		warn     string
		err      string
	}{
		{name: "unset: the default project", project: "default"},
		{name: "named", top: `project = "vision"`, project: "vision"},
		{name: "with a budget", top: "project = \"nlp\"\nbudget {\n total = 100\n per_hour = 5\n}", project: "nlp",
			budget: &budget.Limits{Total: 100, PerHour: 5, WarnAt: 0.8, OnExhausted: budget.Pause}},
		{name: "budget from a variable-free expression", top: "budget {\n total = 50 * 2\n on_exhausted = \"stop\"\n}", project: "default",
			budget: &budget.Limits{Total: 100, WarnAt: 0.8, OnExhausted: budget.Stop}},
		{name: "unknown", top: `project = "nlpp"`, err: `no project named "nlpp". Did you mean "nlp"?`},
		{name: "empty", top: `project = ""`, err: "omit it for the \"default\" project"},
		{name: "min above quota warns", top: `project = "nlp"`, node: "gpus = 9", project: "nlp", warn: `min_nodes × node.gpus = 9 GPUs`},
		{name: "min above max_gpus", top: "project = \"nlp\"", node: "gpus = 17", err: "could never start"},
		{name: "no project set: any name", top: `project = "anything"`, noSet: true, project: "anything"},
		{name: "negative budget", top: "budget {\n total = -1\n}", err: "total is in dollars and must be greater than 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions()
			if tc.noSet {
				opts.Projects = nil
			}
			src := parts{top: tc.top, node: tc.node, minMax: "min_nodes = 1\nmax_nodes = 2"}.src()
			f, diags := parseString(t, src, opts)
			var errs, warns []string
			for _, d := range diags {
				if d.Severity == hcl.DiagError {
					errs = append(errs, d.Detail)
				} else {
					warns = append(warns, d.Detail)
				}
			}
			if tc.err != "" {
				if len(errs) != 1 || !strings.Contains(errs[0], tc.err) {
					t.Fatalf("errors %q, want one with %q", errs, tc.err)
				}
				return
			}
			if len(errs) > 0 {
				t.Fatalf("errors: %q", errs)
			}
			if (tc.warn == "") != (len(warns) == 0) || (tc.warn != "" && !strings.Contains(warns[0], tc.warn)) {
				t.Errorf("warnings %q, want %q", warns, tc.warn)
			}
			fl := f.Fleets[0]
			if fl.ProjectName() != tc.project {
				t.Errorf("project %q, want %q", fl.ProjectName(), tc.project)
			}
			if !reflect.DeepEqual(fl.Budget, tc.budget) {
				t.Errorf("budget %+v, want %+v", fl.Budget, tc.budget)
			}
		})
	}
}
