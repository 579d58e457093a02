package spec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
)

// parts builds a one-fleet spec; empty fields get a minimal valid body.
type parts struct {
	name       string
	top        string // attributes of the fleet block besides min/max
	minMax     string
	node       string
	placement  string
	providers  string
	training   string
	rendezvous string
	extra      string // top-level text before the fleet
}

func (p parts) src() string {
	or := func(s, def string) string {
		if s == "" {
			return def
		}
		return s
	}
	var b strings.Builder
	b.WriteString(p.extra + "\n")
	fmt.Fprintf(&b, "fleet %q {\n", or(p.name, "f"))
	b.WriteString(or(p.minMax, "min_nodes = 1\nmax_nodes = 2") + "\n")
	b.WriteString(p.top + "\n")
	fmt.Fprintf(&b, "node {\n%s\n}\n", or(p.node, "gpus = 1"))
	if p.placement != "" {
		fmt.Fprintf(&b, "placement {\n%s\n}\n", p.placement)
	}
	b.WriteString(or(p.providers, `provider "local" {}`) + "\n")
	fmt.Fprintf(&b, "training {\n%s\n}\n", or(p.training, `command = ["python3", "train.py"]`))
	if p.rendezvous != "" {
		fmt.Fprintf(&b, "rendezvous {\n%s\n}\n", p.rendezvous)
	}
	b.WriteString("}\n")
	return b.String()
}

func parseString(t *testing.T, src string, opts Options) (*File, hcl.Diagnostics) {
	t.Helper()
	f, diags := Parse("test.hcl", []byte(src), opts)
	if f == nil || f.Files["test.hcl"] == nil {
		t.Fatalf("Parse returned no sources")
	}
	return f, diags
}

func mustParse(t *testing.T, src string, opts Options) *File {
	t.Helper()
	f, diags := parseString(t, src, opts)
	if diags.HasErrors() {
		var buf bytes.Buffer
		_ = WriteDiagnostics(&buf, f.Files, diags, 0, false)
		t.Fatalf("unexpected errors:\n%s\nsource:\n%s", buf.String(), src)
	}
	return f
}

func subjectText(src string, d *hcl.Diagnostic) string {
	if d.Subject == nil {
		return ""
	}
	end := d.Subject.End.Byte
	if end == d.Subject.Start.Byte && end < len(src) {
		end++ // an empty range marks the character it starts at
	}
	return src[d.Subject.Start.Byte:end]
}

func TestDefaults(t *testing.T) {
	f := mustParse(t, parts{}.src(), testOptions())
	if len(f.Fleets) != 1 {
		t.Fatalf("got %d fleets", len(f.Fleets))
	}
	got := *f.Fleets[0]
	got.DeclRange = hcl.Range{}
	want := Fleet{
		Name: "f", MinNodes: 1, MaxNodes: 2,
		Node:       Node{GPUs: 1, Spot: true},
		Placement:  Placement{Strategy: StrategyPriceCapacity, Colocate: ColocateZone, Fallback: FallbackAfter, FallbackAfter: 10 * time.Minute},
		Providers:  []Provider{{Name: "local", Config: json.RawMessage(`{}`)}},
		Training:   Training{Command: []string{"python3", "train.py"}, NprocPerNode: 1, MaxRestarts: 3, MasterPort: 29500, DrainGrace: 90 * time.Second},
		Rendezvous: Rendezvous{LastCall: 5 * time.Second, Heartbeat: 2 * time.Second, DeadAfter: 10 * time.Second},
	}
	got.Providers[0].DeclRange = hcl.Range{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", got, want)
	}
	if n := got.TargetNodes(); n != 2 {
		t.Errorf("TargetNodes = %d, want max_nodes 2", n)
	}
	if s := got.Placement.FallbackString(); s != "after 10m0s below min_nodes" {
		t.Errorf("FallbackString = %q", s)
	}
}

func TestDesignExample(t *testing.T) {
	f, diags := ParseFile("testdata/valid/design.hcl", testOptions())
	if diags.HasErrors() {
		var buf bytes.Buffer
		_ = WriteDiagnostics(&buf, f.Files, diags, 0, false)
		t.Fatal(buf.String())
	}
	if len(diags) != 0 {
		t.Errorf("unexpected warnings: %v", diags)
	}
	fl := f.Fleet("bert-large")
	if fl == nil {
		t.Fatal("fleet bert-large not found")
	}
	if fl.MinNodes != 2 || fl.MaxNodes != 8 || fl.DesiredNodes != 0 || fl.TargetNodes() != 8 {
		t.Errorf("nodes: %+v", fl)
	}
	wantNode := Node{GPUs: 8, GPUTypes: []string{"A100", "H100"}, MinVCPUs: 32, MinMemoryGiB: 200, Spot: true, MaxPricePerGPUHour: 3}
	if !reflect.DeepEqual(fl.Node, wantNode) {
		t.Errorf("node = %+v", fl.Node)
	}
	if fl.Training.MaxRestarts != 100 || fl.Training.NprocPerNode != 8 || fl.Training.CheckpointURI != "s3://bucket/bert-large/" || fl.Training.Env["NCCL_DEBUG"] != "WARN" {
		t.Errorf("training = %+v", fl.Training)
	}
	if len(fl.Providers) != 2 || fl.Providers[0].Name != "aws" || fl.Providers[1].Name != "gcp" {
		t.Fatalf("providers = %+v", fl.Providers)
	}
	var aws struct {
		Regions []string          `json:"regions"`
		Subnets map[string]string `json:"subnets"`
		Queue   string            `json:"interruption_queue"`
		KeyName *string           `json:"key_name"`
	}
	if err := json.Unmarshal(fl.Providers[0].Config, &aws); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(aws.Regions, []string{"us-east-1", "us-west-2"}) || aws.Subnets["us-east-1a"] != "subnet-aaa" || aws.Queue != "fleetd-interruptions" || aws.KeyName != nil {
		t.Errorf("aws config = %s", fl.Providers[0].Config)
	}
	if p, ok := fl.Provider("gcp"); !ok || !strings.Contains(string(p.Config), `"project":"my-project"`) {
		t.Errorf("gcp config = %s", p.Config)
	}
	if fl.DeclRange.Start.Line != 2 {
		t.Errorf("DeclRange = %v", fl.DeclRange)
	}
}

func TestValidationRules(t *testing.T) {
	long := strings.Repeat("a", MaxFleetNameLen)
	tests := []struct {
		name    string
		spec    parts
		summary string // "" means the spec is valid
		subject string // source text the diagnostic must point at
	}{
		{"min zero", parts{minMax: "min_nodes = 0\nmax_nodes = 2"}, "Invalid min_nodes", "0"},
		{"min fraction", parts{minMax: "min_nodes = 1.5\nmax_nodes = 2"}, "Invalid value", "1.5"},
		{"min string", parts{minMax: `min_nodes = "two"` + "\nmax_nodes = 2"}, "Incorrect attribute value type", `"two"`},
		{"min null", parts{minMax: "min_nodes = null\nmax_nodes = 2"}, "Missing value", "null"},
		{"optional null", parts{top: "desired_nodes = null\nwork = null"}, "", ""},
		{"command null", parts{training: "command = null"}, "Missing value", "null"},
		{"max zero", parts{minMax: "min_nodes = 1\nmax_nodes = 0"}, "Invalid max_nodes", "0"},
		{"min above max", parts{minMax: "min_nodes = 3\nmax_nodes = 2"}, "min_nodes is greater than max_nodes", "3"},
		{"min equals max", parts{minMax: "min_nodes = 2\nmax_nodes = 2"}, "", ""},
		{"missing max", parts{minMax: "min_nodes = 1"}, "Missing required argument", "{"},
		{"desired below min", parts{minMax: "min_nodes = 2\nmax_nodes = 4", top: "desired_nodes = 1"}, "desired_nodes is below min_nodes", "1"},
		{"desired above max", parts{top: "desired_nodes = 3"}, "desired_nodes is above max_nodes", "3"},
		{"desired zero", parts{top: "desired_nodes = 0"}, "Invalid desired_nodes", "0"},
		{"desired ok", parts{top: "desired_nodes = 2"}, "", ""},
		{"gpus negative", parts{node: "gpus = -2"}, "Invalid gpus", "-2"},
		{"gpus missing", parts{node: "spot = true"}, "Missing required argument", "{"},
		{"cpu only", parts{node: "gpus = 0"}, "", ""},
		{"gpu types without gpus", parts{node: "gpus = 0\ngpu_types = [\"A100\"]"}, "GPU types on CPU-only nodes", `["A100"]`},
		{"empty gpu type", parts{node: "gpus = 1\ngpu_types = [\"\"]"}, "Invalid gpu_types", `[""]`},
		{"price zero", parts{node: "gpus = 1\nmax_price_per_gpu_hour = 0"}, "Invalid max_price_per_gpu_hour", "0"},
		{"price negative", parts{node: "gpus = 1\nmax_price_per_gpu_hour = -1.5"}, "Invalid max_price_per_gpu_hour", "-1.5"},
		{"price on cpu nodes", parts{node: "gpus = 0\nmax_price_per_gpu_hour = 1"}, "GPU price cap on CPU-only nodes", "1"},
		{"vcpus negative", parts{node: "gpus = 1\nmin_vcpus = -1"}, "Invalid min_vcpus", "-1"},
		{"memory negative", parts{node: "gpus = 1\nmin_memory_gib = -0.5"}, "Invalid min_memory_gib", "-0.5"},
		{"spot not bool", parts{node: "gpus = 1\nspot = \"yes\""}, "Incorrect attribute value type", `"yes"`},
		{"unknown node attribute", parts{node: "gpus = 1\ngpu = 2"}, "Unsupported argument", "gpu"},
		{"unknown fleet attribute", parts{top: "nodes = 3"}, "Unsupported argument", "nodes"},
		{"unknown top-level attribute", parts{extra: "region = \"x\""}, "Unsupported argument", "region"},
		{"unknown top-level block", parts{extra: "fleets \"x\" {}"}, "Unsupported block type", "fleets"},
		{"work zero", parts{top: `work = "0s"`}, "Invalid duration", `"0s"`},
		{"work ok", parts{top: `work = "48h"`}, "", ""},
		{"work number", parts{top: `work = 3600`}, "Invalid duration", "3600"},
		{"deadline not rfc3339", parts{top: `deadline = "2026-12-01"` + "\nwork = \"1h\""}, "Invalid deadline", `"2026-12-01"`},
		{"deadline without work", parts{top: `deadline = "2026-12-01T00:00:00Z"`}, "Deadline without a work estimate", `"2026-12-01T00:00:00Z"`},
		{"deadline with work", parts{top: `deadline = "2026-12-01T00:00:00Z"` + "\nwork = \"10h\""}, "", ""},
		{"deadline fallback without deadline", parts{placement: `on_demand_fallback = "deadline"`}, "Deadline fallback without a deadline", `"deadline"`},
		{"bad strategy", parts{placement: `strategy = "capacity-optimized"`}, "Unsupported strategy", `"capacity-optimized"`},
		{"bad scale", parts{placement: `scale = "goodputt"`}, "Unsupported scale", `"goodputt"`},
		{"bad colocate", parts{placement: `colocate = "rack"`}, "Unsupported colocate", `"rack"`},
		{"all placement values", parts{placement: "strategy = \"capacity\"\ncolocate = \"none\"\non_demand_fallback = \"never\""}, "", ""},
		{"bad fallback", parts{placement: `on_demand_fallback = "always"`}, "Invalid on_demand_fallback", `"always"`},
		{"fallback zero delay", parts{placement: `on_demand_fallback = "after 0s below min_nodes"`}, "Invalid on_demand_fallback", `"after 0s below min_nodes"`},
		{"fallback wrong form", parts{placement: `on_demand_fallback = "after 5m"`}, "Invalid on_demand_fallback", `"after 5m"`},
		{"duplicate placement", parts{placement: "strategy = \"capacity\"\n}\nplacement {\nstrategy = \"capacity\""}, "Duplicate placement block", "placement"},
		{"no provider", parts{providers: "# none"}, "Missing provider block", `fleet "f"`},
		{"duplicate provider", parts{providers: "provider \"local\" {}\nprovider \"local\" {}"}, "Duplicate provider block", `"local"`},
		{"unknown provider", parts{providers: `provider "lokal" {}`}, "Unknown provider", `"lokal"`},
		{"provider attribute type", parts{providers: `provider "local" { zones = "local-a" }`}, "Incorrect attribute value type", `"local-a"`},
		{"provider unknown attribute", parts{providers: `provider "local" { zone = ["a"] }`}, "Unsupported argument", "zone"},
		{"provider nested block", parts{providers: "provider \"local\" {\n  capacity {}\n}"}, "Unsupported block type", "capacity"},
		{"empty command", parts{training: "command = []"}, "Empty command", "[]"},
		{"empty program", parts{training: `command = ["", "x"]`}, "Empty command", `["", "x"]`},
		{"command missing", parts{training: "nproc_per_node = 1"}, "Missing required argument", "{"},
		{"command not a list", parts{training: `command = "python train.py"`}, "Incorrect attribute value type", `"python train.py"`},
		{"nproc zero", parts{training: "command = [\"x\"]\nnproc_per_node = 0"}, "Invalid nproc_per_node", "0"},
		{"restarts negative", parts{training: "command = [\"x\"]\nmax_restarts = -1"}, "Invalid max_restarts", "-1"},
		{"restarts zero", parts{training: "command = [\"x\"]\nmax_restarts = 0"}, "", ""},
		{"port zero", parts{training: "command = [\"x\"]\nmaster_port = 0"}, "Invalid master_port", "0"},
		{"port too big", parts{training: "command = [\"x\"]\nmaster_port = 65536"}, "Invalid master_port", "65536"},
		{"port max", parts{training: "command = [\"x\"]\nmaster_port = 65535"}, "", ""},
		{"peer port zero", parts{training: "command = [\"x\"]\npeer_port = 0"}, "Invalid peer_port", "0"},
		{"peer port too big", parts{training: "command = [\"x\"]\npeer_port = 70000"}, "Invalid peer_port", "70000"},
		{"peer port is the master port", parts{training: "command = [\"x\"]\npeer_port = 29500"}, "peer_port collides with master_port", "29500"},
		{"peer port", parts{training: "command = [\"x\"]\npeer_port = 7790"}, "", ""},
		{"drain grace bad", parts{training: "command = [\"x\"]\ndrain_grace = \"soon\""}, "Invalid duration", `"soon"`},
		{"checkpoint relative", parts{training: "command = [\"x\"]\ncheckpoint_uri = \"ckpt\""}, "Invalid checkpoint_uri", `"ckpt"`},
		{"checkpoint s3", parts{training: "command = [\"x\"]\ncheckpoint_uri = \"s3://b/p/\""}, "", ""},
		{"checkpoint absolute", parts{training: "command = [\"x\"]\ncheckpoint_uri = \"/mnt/ckpt\""}, "", ""},
		{"env reserved", parts{training: "command = [\"x\"]\nenv = { WORLD_SIZE = \"8\" }"}, "Reserved environment variable", "WORLD_SIZE"},
		{"env reserved prefix", parts{training: "command = [\"x\"]\nenv = { TORCHELASTIC_RUN_ID = \"x\" }"}, "Reserved environment variable", "TORCHELASTIC_RUN_ID"},
		{"env fleetd prefix", parts{training: "command = [\"x\"]\nenv = { FLEETD_FLEET = \"x\" }"}, "Reserved environment variable", "FLEETD_FLEET"},
		{"env bad name", parts{training: "command = [\"x\"]\nenv = { \"A-B\" = \"x\" }"}, "Invalid environment variable name", `"A-B"`},
		{"env ok", parts{training: "command = [\"x\"]\nenv = { OMP_NUM_THREADS = 4, NCCL_DEBUG = \"INFO\" }"}, "", ""},
		{"setup and workdir", parts{training: "command = [\"x\"]\nsetup = [\"apt-get update\"]\nworkdir = \"/srv/job\""}, "", ""},
		{"empty setup command", parts{training: "command = [\"x\"]\nsetup = [\" \"]"}, "Empty setup command", `[" "]`},
		{"empty workdir", parts{training: "command = [\"x\"]\nworkdir = \"\""}, "Empty workdir", `""`},
		{"warm start off", parts{training: "command = [\"x\"]\nwarm_start = false"}, "", ""},
		{"warm start not a bool", parts{training: "command = [\"x\"]\nwarm_start = \"sometimes\""}, "Incorrect attribute value type", `"sometimes"`},
		{"dead_after not above heartbeat", parts{rendezvous: "heartbeat = \"10s\""}, "dead_after must exceed heartbeat", `"10s"`},
		{"dead_after below heartbeat", parts{rendezvous: "heartbeat = \"3s\"\ndead_after = \"2s\""}, "dead_after must exceed heartbeat", `"2s"`},
		{"heartbeat zero", parts{rendezvous: "heartbeat = \"0s\""}, "Invalid duration", `"0s"`},
		{"last_call zero", parts{rendezvous: "last_call = \"0s\""}, "", ""},
		{"last_call negative", parts{rendezvous: "last_call = \"-1s\""}, "Invalid duration", `"-1s"`},
		{"name uppercase", parts{name: "Bert"}, "Invalid fleet name", `"Bert"`},
		{"name leading dash", parts{name: "-bert"}, "Invalid fleet name", `"-bert"`},
		{"name trailing dash", parts{name: "bert-"}, "Invalid fleet name", `"bert-"`},
		{"name leading digit", parts{name: "1bert"}, "Invalid fleet name", `"1bert"`},
		{"name too long", parts{name: long + "b"}, "Invalid fleet name", `"` + long + `b"`},
		{"name longest", parts{name: long}, "", ""},
		{"name one letter", parts{name: "b"}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.spec.src()
			_, diags := parseString(t, src, testOptions())
			var errs hcl.Diagnostics
			for _, d := range diags {
				if d.Severity == hcl.DiagError {
					errs = append(errs, d)
				}
			}
			if tt.summary == "" {
				if len(errs) != 0 {
					t.Fatalf("want no errors, got %v\n%s", errs, src)
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("want exactly one error %q, got %d: %v\n%s", tt.summary, len(errs), errs, src)
			}
			if errs[0].Summary != tt.summary {
				t.Errorf("summary = %q, want %q (detail %q)", errs[0].Summary, tt.summary, errs[0].Detail)
			}
			if got := subjectText(src, errs[0]); got != tt.subject {
				t.Errorf("diagnostic points at %q, want %q", got, tt.subject)
			}
		})
	}
}

func TestDeadlineImpliesDeadlineFallback(t *testing.T) {
	f := mustParse(t, parts{top: "deadline = \"2026-12-01T00:00:00Z\"\nwork = \"48h\""}.src(), testOptions())
	fl := f.Fleets[0]
	if fl.Placement.Fallback != FallbackDeadline || fl.Placement.FallbackAfter != 0 {
		t.Errorf("placement = %+v, want the deadline fallback", fl.Placement)
	}
	if fl.Deadline == nil || !fl.Deadline.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) || fl.Work != 48*time.Hour {
		t.Errorf("deadline %v work %v", fl.Deadline, fl.Work)
	}
	// An explicit policy wins over the implied one.
	f = mustParse(t, parts{top: "deadline = \"2026-12-01T00:00:00Z\"\nwork = \"48h\"", placement: `on_demand_fallback = "after 1h30m below min_nodes"`}.src(), testOptions())
	if p := f.Fleets[0].Placement; p.Fallback != FallbackAfter || p.FallbackAfter != 90*time.Minute {
		t.Errorf("placement = %+v", p)
	}
}

func TestWarnings(t *testing.T) {
	tests := []struct {
		name    string
		spec    parts
		summary string
	}{
		{"more workers than gpus", parts{node: "gpus = 2", training: "command = [\"x\"]\nnproc_per_node = 4"}, "More workers than GPUs"},
		{"fallback with on-demand nodes", parts{node: "gpus = 1\nspot = false", placement: `on_demand_fallback = "never"`}, "on_demand_fallback has no effect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, diags := parseString(t, tt.spec.src(), testOptions())
			if diags.HasErrors() || len(diags) != 1 || diags[0].Severity != hcl.DiagWarning || diags[0].Summary != tt.summary {
				t.Fatalf("want one warning %q, got %v", tt.summary, diags)
			}
			if len(f.Fleets) != 1 {
				t.Fatalf("a warning must not drop the fleet")
			}
		})
	}
}

func TestSeveralFleets(t *testing.T) {
	src := parts{name: "a"}.src() + parts{name: "b", minMax: "min_nodes = 3\nmax_nodes = 6", top: "desired_nodes = 4", node: "gpus = 8"}.src()
	f := mustParse(t, src, testOptions())
	if len(f.Fleets) != 2 || f.Fleets[0].Name != "a" || f.Fleets[1].Name != "b" {
		t.Fatalf("fleets = %+v", f.Fleets)
	}
	b := f.Fleet("b")
	if b.MinNodes != 3 || b.MaxNodes != 6 || b.TargetNodes() != 4 || b.Node.GPUs != 8 {
		t.Errorf("fleet b = %+v", b)
	}
	if f.Fleet("c") != nil {
		t.Errorf("Fleet(c) should be nil")
	}
	// Errors in one fleet do not hide the other's.
	src = parts{name: "a", node: "gpus = -1"}.src() + parts{name: "b", training: "command = []"}.src()
	_, diags := parseString(t, src, testOptions())
	if len(diags) != 2 || diags[0].Summary != "Invalid gpus" || diags[1].Summary != "Empty command" {
		t.Errorf("diags = %v", diags)
	}
}

func TestNoFleet(t *testing.T) {
	for _, src := range []string{"", "# only a comment\n", "variable \"x\" {\n  default = 1\n}\n"} {
		_, diags := parseString(t, src, testOptions())
		if len(diags) != 1 || diags[0].Summary != "No fleet declared" {
			t.Errorf("%q: diags = %v", src, diags)
		}
	}
}

func TestNilSchemaKnowsNoProvider(t *testing.T) {
	_, diags := parseString(t, parts{}.src(), Options{})
	if len(diags) != 1 || diags[0].Summary != "Unknown provider" {
		t.Errorf("diags = %v", diags)
	}
}

const varSpec = `
variable "nodes" {
  type    = number
  default = 2
}
variable "zones" {
  type    = list(string)
  default = ["local-a"]
}
variable "spot" {
  type    = bool
  default = true
}
variable "note" {
  description = "untyped: values stay strings"
  default     = "none"
}
fleet "f" {
  min_nodes = 1
  max_nodes = var.nodes
  node {
    gpus = 1
    spot = var.spot
  }
  provider "local" {
    zones = var.zones
  }
  training {
    command = ["echo", var.note]
  }
}
`

func TestVariablePrecedence(t *testing.T) {
	tests := []struct {
		name      string
		vars      map[string]string
		env       []string
		wantNodes int
		wantZones string
		wantSpot  bool
		wantNote  string
	}{
		{"defaults", nil, nil, 2, `["local-a"]`, true, "none"},
		{"env", nil, []string{"FLEETD_VAR_nodes=3", `FLEETD_VAR_zones=["x", "y"]`}, 3, `["x","y"]`, true, "none"},
		{"env upper case", nil, []string{"FLEETD_VAR_NODES=4", "FLEETD_VAR_SPOT=false"}, 4, `["local-a"]`, false, "none"},
		{"exact env name wins over upper case", nil, []string{"FLEETD_VAR_NODES=4", "FLEETD_VAR_nodes=5"}, 5, `["local-a"]`, true, "none"},
		{"flag over env", map[string]string{"nodes": "6", "note": "hi there"}, []string{"FLEETD_VAR_nodes=3"}, 6, `["local-a"]`, true, "hi there"},
		{"unrelated env ignored", nil, []string{"FLEETD_VAR_other=1", "nodes=9"}, 2, `["local-a"]`, true, "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := testOptions()
			opts.Vars, opts.Env = tt.vars, tt.env
			fl := mustParse(t, varSpec, opts).Fleets[0]
			if fl.MaxNodes != tt.wantNodes || fl.Node.Spot != tt.wantSpot || fl.Training.Command[1] != tt.wantNote {
				t.Errorf("max_nodes %d spot %v note %q", fl.MaxNodes, fl.Node.Spot, fl.Training.Command[1])
			}
			if got := string(fl.Providers[0].Config); got != `{"zones":`+tt.wantZones+`}` {
				t.Errorf("local config = %s", got)
			}
			// Inputs replayed as -var values, without the environment,
			// must give the same fleet (this is how the daemon re-parses).
			f := mustParse(t, varSpec, opts)
			replay := testOptions()
			replay.Vars = f.Inputs
			again := mustParse(t, varSpec, replay).Fleets[0]
			again.DeclRange, fl.DeclRange = hcl.Range{}, hcl.Range{}
			if !reflect.DeepEqual(again, fl) {
				t.Errorf("replaying Inputs %v gives %+v, want %+v", f.Inputs, again, fl)
			}
		})
	}
}

func TestVariableErrors(t *testing.T) {
	tests := []struct {
		name    string
		src     string
		vars    map[string]string
		env     []string
		summary string
		detail  string
	}{
		{"flag not a number", varSpec, map[string]string{"nodes": "many"}, nil, "Invalid value for variable", `"many" is not a valid number`},
		{"env not a bool", varSpec, nil, []string{"FLEETD_VAR_spot=maybe"}, "Invalid value for variable", "environment variable FLEETD_VAR_spot"},
		{"flag list syntax", varSpec, map[string]string{"zones": "[a"}, nil, "Invalid value for variable", "cannot parse"},
		{"flag list not literal", varSpec, map[string]string{"zones": "[var.x]"}, nil, "Invalid value for variable", "must be a literal"},
		{"undeclared flag", varSpec, map[string]string{"node": "3"}, nil, "Value for undeclared variable", `Did you mean "nodes"?`},
		{"required", "variable \"x\" {}\n" + parts{top: "desired_nodes = var.x"}.src(), nil, nil, "No value for required variable", "FLEETD_VAR_x"},
		{"duplicate", "variable \"x\" {\ndefault = 1\n}\nvariable \"x\" {\ndefault = 1\n}\n" + parts{}.src(), nil, nil, "Duplicate variable", "line 1"},
		{"default refers to variable", "variable \"x\" {\ndefault = 1\n}\nvariable \"y\" {\ndefault = var.x\n}\n" + parts{}.src(), nil, nil, "Variables not allowed", ""},
		{"bad type", "variable \"x\" {\ntype = strin\n}\n" + parts{}.src(), nil, nil, "Invalid type specification", ""},
		{"unknown variable attribute", "variable \"x\" {\ndefault = 1\nsensitive = true\n}\n" + parts{}.src(), nil, nil, "Unsupported argument", ""},
		{"invalid name", "variable \"1x\" {\ndefault = 1\n}\n" + parts{}.src(), nil, nil, "Invalid variable name", ""},
		{"undeclared in provider", parts{providers: "provider \"local\" {\nzones = var.zones\n}"}.src(), nil, nil, "Reference to undeclared variable", `"zones"`},
		{"indexed undeclared", parts{top: "desired_nodes = var[\"count\"]"}.src(), nil, nil, "Reference to undeclared variable", `"count"`},
		{"unknown root", parts{top: "desired_nodes = local.count"}.src(), nil, nil, "Unknown variable", `"local"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := testOptions()
			opts.Vars, opts.Env = tt.vars, tt.env
			_, diags := parseString(t, tt.src, opts)
			// One mistake, one diagnostic: values that depend on it must
			// not produce follow-up errors.
			if len(diags) != 1 {
				t.Fatalf("want one diagnostic, got %d: %v", len(diags), diags)
			}
			if diags[0].Summary != tt.summary || !strings.Contains(diags[0].Detail, tt.detail) {
				t.Errorf("got %q: %q; want %q containing %q", diags[0].Summary, diags[0].Detail, tt.summary, tt.detail)
			}
		})
	}
}

func TestFunctions(t *testing.T) {
	src := `
variable "zones" {
  type    = list(string)
  default = ["local-b", "local-a"]
}
fleet "f" {
  min_nodes = min(2, 3)
  max_nodes = max(length(var.zones), 4)
  desired_nodes = length(concat(var.zones, ["c"]))
  node {
    gpus      = parseint("8", 10)
    gpu_types = [for t in split(",", "a100,h100") : upper(t)]
  }
  provider "local" {
    zones          = sort(var.zones)
    instance_types = jsondecode(jsonencode({ small = { gpus = 8, spot_price = 1.5 } }))
    capacity       = merge({ "local-a" = 1 }, { "local-b" = 2 })
    state_dir      = abspath("state")
  }
  training {
    command = ["sh", "-c", format("echo %s-%d", lower("HI"), 3), join(" ", ["a", "b"])]
    setup   = [trimspace(file("setup.sh"))]
    workdir = coalesce(null, "/srv")
    env = {
      HOME_DIR = env("HOME", "/root")
      USER     = env("USER", "nobody")
      SAFE     = try(env("MISSING"), "fallback")
      HAS_FILE = tostring(fileexists("setup.sh"))
    }
  }
}
`
	opts := testOptions()
	opts.Env = []string{"HOME=/home/me", "USER="}
	opts.BaseDir = "testdata/valid"
	fl := mustParse(t, src, opts).Fleets[0]
	if fl.MinNodes != 2 || fl.MaxNodes != 4 || fl.DesiredNodes != 3 || fl.Node.GPUs != 8 {
		t.Errorf("numbers: %+v", fl)
	}
	if !reflect.DeepEqual(fl.Node.GPUTypes, []string{"A100", "H100"}) {
		t.Errorf("gpu_types = %v", fl.Node.GPUTypes)
	}
	if !reflect.DeepEqual(fl.Training.Command, []string{"sh", "-c", "echo hi-3", "a b"}) {
		t.Errorf("command = %q", fl.Training.Command)
	}
	if want := "echo \"setting up\"\npip install -r requirements.txt"; len(fl.Training.Setup) != 1 || fl.Training.Setup[0] != want {
		t.Errorf("setup = %q", fl.Training.Setup)
	}
	wantEnv := map[string]string{"HOME_DIR": "/home/me", "USER": "nobody", "SAFE": "fallback", "HAS_FILE": "true"}
	if !reflect.DeepEqual(fl.Training.Env, wantEnv) || fl.Training.Workdir != "/srv" {
		t.Errorf("env = %v workdir = %q", fl.Training.Env, fl.Training.Workdir)
	}
	var cfg struct {
		Zones         []string                  `json:"zones"`
		InstanceTypes map[string]map[string]any `json:"instance_types"`
		Capacity      map[string]int            `json:"capacity"`
		StateDir      string                    `json:"state_dir"`
	}
	if err := json.Unmarshal(fl.Providers[0].Config, &cfg); err != nil {
		t.Fatal(err)
	}
	absState, _ := filepath.Abs("testdata/valid/state")
	if !reflect.DeepEqual(cfg.Zones, []string{"local-a", "local-b"}) || cfg.InstanceTypes["small"]["spot_price"] != 1.5 || cfg.Capacity["local-b"] != 2 || cfg.StateDir != absState {
		t.Errorf("local config = %s", fl.Providers[0].Config)
	}
}

func TestFunctionErrors(t *testing.T) {
	tests := []struct {
		name, expr, detail string
	}{
		{"env unset", `env("NOPE")`, "environment variable NOPE is not set"},
		{"file missing", `file("nope.txt")`, "no such file"},
		{"file is dir", `file(".")`, "is a directory"},
		{"unknown function", `nosuch("x")`, "There is no function named"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := parts{training: "command = [\"x\", " + tt.expr + "]"}.src()
			opts := testOptions()
			opts.BaseDir = t.TempDir()
			_, diags := parseString(t, src, opts)
			if len(diags) != 1 || !strings.Contains(diags[0].Detail, tt.detail) {
				t.Fatalf("want one diagnostic containing %q, got %v", tt.detail, diags)
			}
			if got := subjectText(src, diags[0]); !strings.Contains(tt.expr, got) || got == "" {
				t.Errorf("diagnostic points at %q, not into %s", got, tt.expr)
			}
		})
	}
}

func TestFunctionNames(t *testing.T) {
	names := strings.Join(FunctionNames(), " ")
	for _, want := range []string{"file", "env", "jsonencode", "jsondecode", "upper", "lower", "format", "join", "concat", "merge", "length", "min", "max", "try", "coalesce", "abspath"} {
		if !strings.Contains(" "+names+" ", " "+want+" ") {
			t.Errorf("function %s missing from %s", want, names)
		}
	}
}

func TestParseFileMissing(t *testing.T) {
	f, diags := ParseFile(filepath.Join(t.TempDir(), "none.hcl"), testOptions())
	if f == nil || f.Files == nil || len(diags) != 1 || diags[0].Summary != "Failed to read spec" {
		t.Fatalf("diags = %v", diags)
	}
	var buf bytes.Buffer
	if err := WriteDiagnostics(&buf, f.Files, diags, 0, false); err != nil || !strings.Contains(buf.String(), "1 error") {
		t.Errorf("render: %v %q", err, buf.String())
	}
}

func TestParseFileBaseDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cmd.txt"), []byte("train.py"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "fleet.hcl")
	if err := os.WriteFile(path, []byte(parts{training: `command = ["python3", file("cmd.txt")]`}.src()), 0o644); err != nil {
		t.Fatal(err)
	}
	f, diags := ParseFile(path, testOptions())
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if got := f.Fleets[0].Training.Command[1]; got != "train.py" {
		t.Errorf("file() read %q", got)
	}
}

func TestFleetJSONRoundTrip(t *testing.T) {
	f := mustParse(t, parts{top: "deadline = \"2026-12-01T00:00:00Z\"\nwork = \"2h\""}.src(), testOptions())
	b, err := json.Marshal(f.Fleets[0])
	if err != nil {
		t.Fatal(err)
	}
	var back Fleet
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	back.DeclRange = f.Fleets[0].DeclRange
	back.Providers[0].DeclRange = f.Fleets[0].Providers[0].DeclRange
	if !reflect.DeepEqual(&back, f.Fleets[0]) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, *f.Fleets[0])
	}
}

func TestSyntaxErrorStopsDecoding(t *testing.T) {
	f, diags := parseString(t, "fleet \"f\" {\n  min_nodes = \n}\n", testOptions())
	if !diags.HasErrors() || len(f.Fleets) != 0 {
		t.Fatalf("diags %v fleets %v", diags, f.Fleets)
	}
	for _, d := range diags {
		if d.Summary == "Missing provider block" {
			t.Errorf("semantic errors reported after a syntax error: %v", diags)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(parts{}.src()))
	f.Add([]byte(varSpec))
	for _, dir := range []string{"testdata/broken", "testdata/valid"} {
		paths, _ := filepath.Glob(filepath.Join(dir, "*.hcl"))
		for _, p := range paths {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		opts := testOptions()
		opts.BaseDir = t.TempDir()
		file, diags := Parse("fuzz.hcl", src, opts)
		if file == nil {
			t.Fatal("nil file")
		}
		if err := WriteDiagnostics(&bytes.Buffer{}, file.Files, diags, 60, true); err != nil {
			t.Fatal(err)
		}
		_ = DiagnosticsJSON(file.Files, diags)
		if !diags.HasErrors() && len(file.Fleets) == 0 {
			t.Fatal("a valid spec must have a fleet")
		}
		_ = Format(src)
	})
}

func TestWarmStartSetting(t *testing.T) {
	off, on := false, true
	for _, tt := range []struct {
		training string
		want     *bool
	}{
		{training: `command = ["x"]`},
		{training: "command = [\"x\"]\nwarm_start = false", want: &off},
		{training: "command = [\"x\"]\nwarm_start = true", want: &on},
	} {
		f, diags := parseString(t, parts{training: tt.training}.src(), testOptions())
		if diags.HasErrors() {
			t.Fatalf("%q: %v", tt.training, diags)
		}
		got := f.Fleets[0].Training.WarmStart
		if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
			t.Errorf("%q: warm_start %v, want %v", tt.training, got, tt.want)
		}
	}
}

func TestScaleSetting(t *testing.T) {
	for _, c := range []struct {
		placement string
		want      Scale
	}{
		{"", ScaleGoodput},
		{`scale = "goodput"`, ScaleGoodput},
		{`scale = "max"`, ScaleMax},
	} {
		f := mustParse(t, parts{placement: c.placement}.src(), testOptions())
		if got := f.Fleets[0].Placement.ScalePolicy(); got != c.want {
			t.Errorf("%q: scale %q, want %q", c.placement, got, c.want)
		}
	}
}

func TestNetworkSetting(t *testing.T) {
	for _, c := range []struct {
		node, placement string
		want            Network
		err             string
	}{
		{node: "gpus = 8", want: NetworkStandard},
		{node: "gpus = 8\nnetwork = \"standard\"", want: NetworkStandard},
		{node: "gpus = 8\nnetwork = \"auto\"", placement: `colocate = "region"`, want: NetworkAuto},
		{node: "gpus = 8\nnetwork = \"fast\"", want: NetworkFast},
		{node: "gpus = 8\nnetwork = \"fast\"", placement: `colocate = "zone"`, want: NetworkFast},
		{node: "gpus = 8\nnetwork = \"fast\"", placement: `colocate = "none"`, err: "Fast network needs zone colocation"},
		{node: "gpus = 8\nnetwork = \"efa\"", err: `network must be "standard", "auto" or "fast", got "efa"`},
	} {
		f, diags := parseString(t, parts{node: c.node, placement: c.placement}.src(), testOptions())
		if c.err != "" {
			if !diags.HasErrors() || !strings.Contains(diags.Error(), c.err) {
				t.Errorf("%q/%q: diagnostics %v, want %q", c.node, c.placement, diags, c.err)
			}
			continue
		}
		if diags.HasErrors() {
			t.Errorf("%q/%q: %v", c.node, c.placement, diags)
			continue
		}
		if got := f.Fleets[0].Node.NetworkMode(); got != c.want {
			t.Errorf("%q/%q: network %q, want %q", c.node, c.placement, got, c.want)
		}
	}
}
