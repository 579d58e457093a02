package projects

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/fleetd/fleetd/fleet/budget"
)

// daemonConfig stands for fleet.Config: its own attributes, and the rest
// of the body left to Decode, as the daemon wires it.
type daemonConfig struct {
	Listen string   `hcl:"listen,optional"`
	Rest   hcl.Body `hcl:",remain"`
}

func parse(t *testing.T, src string) (Config, hcl.Diagnostics) {
	t.Helper()
	f, diags := hclsyntax.ParseConfig([]byte(src), "daemon.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("syntax: %s", diags)
	}
	var dc daemonConfig
	if d := gohcl.DecodeBody(f.Body, nil, &dc); d.HasErrors() {
		t.Fatalf("daemon config: %s", d)
	}
	return Decode(dc.Rest)
}

func render(diags hcl.Diagnostics) []string {
	var out []string
	for _, d := range diags {
		s := d.Summary + ": " + d.Detail
		if d.Subject != nil {
			s = fmt.Sprintf("%d:%d %s", d.Subject.Start.Line, d.Subject.Start.Column, s)
		}
		if d.Severity == hcl.DiagWarning {
			s = "warning " + s
		}
		out = append(out, s)
	}
	return out
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want Config
		// diags: each a "line:col" prefix and a substring, in order.
		diags []string
	}{
		{
			name: "issue example",
			src: `listen = "127.0.0.1:1"
project "vision" {
  quota_gpus = 16
  max_gpus   = 32
  priority   = 10
  budget {
    per_hour = 60
    total = 5000
    warn_at = 0.8
    on_exhausted = "pause"
  }
}
project "nlp" { quota_gpus = 8 }
`,
			want: Config{Projects: []Project{
				{Name: "vision", QuotaGPUs: 16, MaxGPUs: 32, Priority: 10, Budget: &budget.Limits{PerHour: 60, Total: 5000, WarnAt: 0.8, OnExhausted: budget.Pause}},
				{Name: "nlp", QuotaGPUs: 8, MaxGPUs: 8},
			}},
		},
		{
			name: "pool",
			src:  "max_gpus = 4\nproject \"a\" {\n quota_gpus = 2\n max_gpus = 4\n}\nproject \"b\" {\n quota_gpus = 2\n}\n",
			want: Config{MaxGPUs: 4, Projects: []Project{{Name: "a", QuotaGPUs: 2, MaxGPUs: 4}, {Name: "b", QuotaGPUs: 2, MaxGPUs: 2}}},
		},
		{
			name:  "quota above max",
			src:   "project \"a\" {\n  quota_gpus = 8\n  max_gpus = 4\n}\n",
			diags: []string{"2:16 quota_gpus (8) must not exceed the project's max_gpus (4, line 3)"},
		},
		{
			name:  "negative quota and budget",
			src:   "project \"a\" {\n  quota_gpus = -1\n  budget {\n    total = -5\n    on_exhausted = \"halt\"\n  }\n}\n",
			diags: []string{"2:16 quota_gpus is the project's guaranteed GPUs and must be 0 or more", "4:13 total is in dollars and must be greater than 0", `5:20 on_exhausted must be "pause"`},
		},
		{
			name:  "bad names and duplicates",
			src:   "project \"Vision\" { quota_gpus = 1 }\nproject \"b\" { quota_gpus = 1 }\nproject \"b\" { quota_gpus = 2 }\n",
			diags: []string{"1:9 Invalid project name", `3:9 Project "b" was already declared at line 2`},
		},
		{
			name:  "missing quota and unknown argument",
			src:   "max_gpus = 0\nproject \"a\" {\n  quota = 3\n}\nlisten_addr = \"x\"\n",
			diags: []string{"1:12 max_gpus is the GPUs all projects share", `2:13 The argument "quota_gpus" is required`, `3:3 An argument named "quota" is not expected here`, `5:1 An argument named "listen_addr" is not expected here`},
		},
		{
			name:  "warnings: ceiling and quotas above the pool",
			src:   "max_gpus = 4\nproject \"a\" {\n quota_gpus = 4\n max_gpus = 8\n}\nproject \"b\" {\n quota_gpus = 2\n}\n",
			want:  Config{MaxGPUs: 4, Projects: []Project{{Name: "a", QuotaGPUs: 4, MaxGPUs: 8}, {Name: "b", QuotaGPUs: 2, MaxGPUs: 2}}},
			diags: []string{"1:12 warning", "2:1 warning"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, diags := parse(t, tc.src)
			r := render(diags)
			if len(r) != len(tc.diags) {
				t.Fatalf("diagnostics %q, want %d: %q", r, len(tc.diags), tc.diags)
			}
			for i, w := range tc.diags {
				pos, text, _ := strings.Cut(w, " ")
				if !strings.Contains(r[i], pos+" ") && !strings.HasPrefix(r[i], "warning "+pos) || !strings.Contains(r[i], text) {
					t.Errorf("diagnostic %d: %q, want %q at %s", i, r[i], text, pos)
				}
			}
			if diags.HasErrors() {
				return
			}
			for i := range got.Projects {
				got.Projects[i].DeclRange = hcl.Range{}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestPoolAndLookup(t *testing.T) {
	c := Config{Projects: []Project{{Name: "a", QuotaGPUs: 2, MaxGPUs: 4}, {Name: "b", QuotaGPUs: 3, MaxGPUs: 3}}}
	if c.Pool() != 5 {
		t.Errorf("pool %d, want the sum of the quotas 5", c.Pool())
	}
	c.MaxGPUs = 8
	if c.Pool() != 8 {
		t.Errorf("pool %d, want max_gpus 8", c.Pool())
	}
	for _, tc := range []struct {
		name     string
		q, m     int
		ok, unlt bool
	}{{"a", 2, 4, true, false}, {"", 0, 0, true, true}, {"default", 0, 0, true, true}, {"zz", 0, 0, false, false}} {
		q, m, ok := c.Lookup(tc.name)
		p, _ := c.Get(tc.name)
		if q != tc.q || m != tc.m || ok != tc.ok || p.Unlimited != tc.unlt {
			t.Errorf("%q: %d %d %v unlimited=%v", tc.name, q, m, ok, p.Unlimited)
		}
	}
	if got := c.Names(); !reflect.DeepEqual(got, []string{"a", "b", "default"}) {
		t.Errorf("names %v", got)
	}
	var none *Config
	if _, _, ok := none.Lookup("a"); ok || len(none.Names()) != 1 {
		t.Error("a nil config knows projects")
	}
	if (&Config{}).Enabled() || !c.Enabled() {
		t.Error("Enabled")
	}
}

// TestWith: stored changes replace daemon.hcl's projects by name, add new
// ones after them, and delete; the base is not modified.
func TestWith(t *testing.T) {
	base := &Config{MaxGPUs: 8, Projects: []Project{{Name: "a", QuotaGPUs: 2, MaxGPUs: 4}, {Name: "b", QuotaGPUs: 3, MaxGPUs: 3}}}
	for _, tc := range []struct {
		name    string
		changes []Change
		want    []Project
	}{
		{"none", nil, base.Projects},
		{"replace", []Change{{Project: Project{Name: "a", QuotaGPUs: 1, MaxGPUs: 1, Priority: 3}}},
			[]Project{{Name: "a", QuotaGPUs: 1, MaxGPUs: 1, Priority: 3}, {Name: "b", QuotaGPUs: 3, MaxGPUs: 3}}},
		{"add", []Change{{Project: Project{Name: "c", QuotaGPUs: 1, MaxGPUs: 2}}},
			[]Project{{Name: "a", QuotaGPUs: 2, MaxGPUs: 4}, {Name: "b", QuotaGPUs: 3, MaxGPUs: 3}, {Name: "c", QuotaGPUs: 1, MaxGPUs: 2}}},
		{"delete", []Change{{Project: Project{Name: "a"}, Deleted: true}}, []Project{{Name: "b", QuotaGPUs: 3, MaxGPUs: 3}}},
		{"delete unknown", []Change{{Project: Project{Name: "zz"}, Deleted: true}}, base.Projects},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := base.With(tc.changes)
			if !reflect.DeepEqual(got.Projects, tc.want) || got.MaxGPUs != 8 {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if len(base.Projects) != 2 || base.Projects[0].QuotaGPUs != 2 {
				t.Fatalf("the base changed: %+v", base)
			}
		})
	}
	var nilCfg *Config
	if got := nilCfg.With([]Change{{Project: Project{Name: "a", QuotaGPUs: 1, MaxGPUs: 1}}}); len(got.Projects) != 1 || got.Pool() != 1 {
		t.Errorf("nil base: %+v", got)
	}
}

// TestValidate: the API's checks say what is wrong, all of it.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Project
		want []string // substrings; none: valid
	}{
		{"valid", Project{Name: "vision", QuotaGPUs: 16, MaxGPUs: 32, Budget: &budget.Limits{PerHour: 60, Total: 5000, WarnAt: 0.8, OnExhausted: budget.Pause}}, nil},
		{"quota 0", Project{Name: "spare", QuotaGPUs: 0, MaxGPUs: 4}, nil},
		{"quota above max", Project{Name: "a", QuotaGPUs: 8, MaxGPUs: 4}, []string{"quota_gpus (8) must not exceed max_gpus (4)"}},
		{"max 0", Project{Name: "a", QuotaGPUs: 0, MaxGPUs: 0}, []string{"max_gpus must be at least 1"}},
		{"negative quota", Project{Name: "a", QuotaGPUs: -1, MaxGPUs: 2}, []string{"quota_gpus must be 0 or more"}},
		{"bad name and negative budget", Project{Name: "Bad_Name", QuotaGPUs: 1, MaxGPUs: 1, Budget: &budget.Limits{PerHour: -1}},
			[]string{"not a valid project name", "per_hour must not be negative"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.p)
			if (err == nil) != (len(tc.want) == 0) {
				t.Fatalf("Validate = %v, want errors %q", err, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v does not say %q", err, w)
				}
			}
		})
	}
}
