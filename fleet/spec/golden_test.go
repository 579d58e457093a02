package spec

import (
	"bytes"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/local"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

var testSchemas = map[string]providers.ConfigSchema{
	aws.Name:   aws.Schema,
	gcp.Name:   gcp.Schema,
	local.Name: local.Schema,
}

// testOptions knows the built-in providers and has an empty environment,
// so results do not depend on the machine.
func testOptions() Options {
	return Options{
		Schema: func(name string) (providers.ConfigSchema, bool) {
			s, ok := testSchemas[name]
			return s, ok
		},
		KnownProviders: []string{aws.Name, gcp.Name, local.Name},
		Env:            []string{},
		Projects:       testProjects{"vision": {16, 32}, "nlp": {8, 16}, "default": {0, 0}},
	}
}

// testProjects is a daemon's project set: name → quota, max_gpus.
type testProjects map[string][2]int

func (t testProjects) Lookup(name string) (int, int, bool) {
	p, ok := t[name]
	return p[0], p[1], ok
}

func (t testProjects) Names() []string { return slices.Sorted(maps.Keys(t)) }

// brokenWant lists, per broken spec, the problems its rendering must show,
// so regenerating the golden files cannot silently accept a lost error.
var brokenWant = map[string][]string{
	"syntax_error": {"syntax_error.hcl:7:25", "Missing item separator", "1 error"},
	"unknown_provider_attribute": {
		`unknown_provider_attribute.hcl:10:5, in fleet "bert", provider "aws"`,
		`An argument named "regionz" is not expected here. Did you mean "regions"?`,
		`The argument "regions" is required`,
	},
	"min_greater_than_max": {"min_greater_than_max.hcl:2:19", "min_nodes (6) must not exceed max_nodes (4, line 3)", "min_greater_than_max.hcl:20:19", "desired_nodes (9) must be within [min_nodes, max_nodes] = [2, 4]", "2 errors"},
	"bad_duration":         {`"two days" is not a duration`, `"90 seconds" is not a duration`, `"2" has no unit; write a duration such as "2s"`, `dead_after must be greater than zero`, "4 errors"},
	"duplicate_fleet":      {"duplicate_fleet.hcl:13:7", `A fleet named "bert" was already declared at line 1`, "1 error"},
	"missing_provider":     {"Missing provider block", "missing_provider.hcl:1:1", "1 error"},
	"unknown_provider":     {"unknown_provider.hcl:9:12", `fleetd has no provider named "awz". Did you mean "aws"?`, `"azure". Available providers: aws, gcp, local.`, "2 errors"},
	"bad_network":          {"bad_network.hcl:11:16", `placement.colocate is "region"`, `network must be "standard", "auto" or "fast", got "efa"`, "Invalid gradient_mb", "3 errors"},
	"bad_strategy":         {`Did you mean "lowest-price"?`, `Did you mean "zone"?`, `"10 minutes" is not a duration`, "3 errors"},
	"undefined_variable": {
		"undefined_variable.hcl:7:15", `No variable named "min_nodes" is declared`,
		"undefined_variable.hcl:15:23", `Did you mean "region"?`,
		"undefined_variable.hcl:21:51", `There is no variable named "region"`, "3 errors",
	},
	"many_errors": {
		"Invalid fleet name", "min_nodes must be at least 1", "Invalid deadline", "gpus must be 0", "max_price_per_gpu_hour must be greater than 0",
		"bool required", `got "cheapest"`, `Did you mean "image"?`, "Duplicate provider block",
		"Empty command", "nproc_per_node must be at least 1", "master_port must be a TCP port", "Reserved environment variable",
		"Invalid environment variable name", "dead_after (10s) must be longer than heartbeat (20s)", `Blocks of type "monitoring" are not expected here`,
		`Variable "nodes" has no default`, "18 errors",
	},
	"deadline_without_work":  {"Deadline without a work estimate", "GPU types on CPU-only nodes", "Invalid checkpoint_uri", "Deadline fallback without a deadline", "Warning: on_demand_fallback has no effect", "4 errors, 1 warning"},
	"missing_variable_value": {`Variable "project" has no default`, "The default does not match the variable's type number", "no-such-file.txt", "3 errors"},
	"bad_checkpoint": {
		"bad_checkpoint.hcl:15:15", "dir is a directory on the node, not a URL", `unknown parameter "endpont" for s3://; did you mean "endpoint"?`,
		"keep must be at least 1", "bad_checkpoint.hcl:35:5", "Missing checkpoint dir", "Signed URLs for a file store", "5 errors",
	},
	"bad_data": {
		"bad_data.hcl:19:20", `unknown scheme "s4"; did you mean "s3"?`, "bad_data.hcl:24:5", "Missing data size",
		"bad_data.hcl:27:20", `s3:// is a bucket: mode "stream"`, "bad_data.hcl:33:27", `checkpoint dir "/mnt/ckpt" overlap`,
		"size_gb must be greater than 0, got -2", "read_per_epoch_gb must be 0 or more", "zone_policy is for file systems",
		"bad_data.hcl:47:5", "Missing file system region", "bad_data.hcl:51:21", "Required zone not given",
		"bad_data.hcl:59:20", "network is for file systems", "bad_data.hcl:67:20", `network is its VPC id, e.g. "vpc-0123456789abcdef0", got "default"`, "11 errors",
	},
	"bad_project": {
		"bad_project.hcl:4:15", `The daemon has no project named "visoin". Did you mean "vision"?`,
		"bad_project.hcl:11:20", "per_hour is in dollars and must be greater than 0, got -3", "bad_project.hcl:13:20", "warn_at", `on_exhausted must be "pause"`,
		"bad_project.hcl:27:15", `project "nlp" may hold at most 16 (its max_gpus): the fleet could never start`,
		"bad_project.hcl:43:15", `"robotics". Its projects: default, nlp, vision.`, "bad_project.hcl:52:3", "Duplicate budget block", "7 errors",
	},
	"missing_blocks": {`The argument "max_nodes" is required`, "Missing node block", "Missing provider block", "Missing training block", "Invalid fleet name", "Duplicate node block", "6 errors"},
}

func TestBrokenSpecsGolden(t *testing.T) {
	paths, err := filepath.Glob("testdata/broken/*.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 8 {
		t.Fatalf("found %d broken specs, want at least 8", len(paths))
	}
	for _, path := range paths {
		name := strings.TrimSuffix(filepath.Base(path), ".hcl")
		t.Run(name, func(t *testing.T) {
			f, diags := ParseFile(path, testOptions())
			if !diags.HasErrors() {
				t.Fatalf("no errors for a broken spec")
			}
			var buf bytes.Buffer
			if err := WriteDiagnostics(&buf, f.Files, diags, 0, false); err != nil {
				t.Fatal(err)
			}
			got := buf.String()
			golden := strings.TrimSuffix(path, ".hcl") + ".golden"
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("rendering differs from %s (go test -update rewrites it):\n%s", golden, got)
			}
			wants, ok := brokenWant[name]
			if !ok {
				t.Fatalf("add the expected problems of %s to brokenWant", name)
			}
			for _, w := range wants {
				if !strings.Contains(got, w) {
					t.Errorf("rendering lacks %q:\n%s", w, got)
				}
			}
		})
	}
}
