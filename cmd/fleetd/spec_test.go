package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/spec"
)

// runCmd runs one fleetd command in-process.
func runCmd(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return out.String(), errb.String(), code
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestExamplesValidate checks every example spec with the built-in provider
// schemas, and that each is canonically formatted.
func TestExamplesValidate(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("..", "..", "configs", "examples", "*.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 4 {
		t.Fatalf("found %d example specs, want at least 4", len(paths))
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			f, files, diags := loadSpec(p, nil)
			if len(diags) > 0 {
				var buf bytes.Buffer
				_ = spec.WriteDiagnostics(&buf, files, diags, 0, false)
				t.Fatalf("example has diagnostics:\n%s", buf.String())
			}
			if len(f.Fleets) == 0 {
				t.Fatal("example declares no fleet")
			}
			out, errOut, code := runCmd("validate", p)
			if code != exitOK || errOut != "" || strings.Count(out, "\n") != len(f.Fleets) || !strings.Contains(out, ": valid; nodes ") {
				t.Errorf("validate exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			if out, _, code := runCmd("fmt", "-check", p); code != exitOK {
				t.Errorf("example is not formatted (fleetd fmt %s): %s", p, out)
			}
		})
	}
}

func TestBuiltinSchema(t *testing.T) {
	for _, name := range []string{"aws", "gcp", "local"} {
		if s, ok := builtinSchema(name); !ok || len(s.Attributes) == 0 {
			t.Errorf("builtinSchema(%q) = %v, %v", name, s, ok)
		}
	}
	if _, ok := builtinSchema("azure"); ok {
		t.Error("builtinSchema knows azure")
	}
	names := builtinSchemaNames()
	for i := 1; i < len(names); i++ {
		if names[i-1] >= names[i] {
			t.Errorf("names not sorted: %v", names)
		}
	}
}

const validSpec = `variable "nodes" {
  type    = number
  default = 2
}

fleet "small" {
  min_nodes = 1
  max_nodes = var.nodes
  node {
    gpus = 1
  }
  provider "local" {}
  training {
    command = ["python3", "train.py"]
  }
}
`

func TestValidateVarsAndEnv(t *testing.T) {
	path := writeTemp(t, "fleet.hcl", validSpec)
	tests := []struct {
		name string
		env  string
		args []string
		want string
		code int
	}{
		{"default", "", []string{path}, "nodes 1..2,", exitOK},
		{"env", "3", []string{path}, "nodes 1..3,", exitOK},
		{"flag wins over env", "3", []string{"-var", "nodes=5", path}, "nodes 1..5,", exitOK},
		{"flag after file", "", []string{path, "-var", "nodes=6"}, "nodes 1..6,", exitOK},
		{"bad value", "", []string{path, "-var", "nodes=lots"}, `"lots" is not a valid number`, exitUsage},
		{"undeclared", "", []string{"-var", "gpus=2", path}, "Value for undeclared variable", exitUsage},
		{"flag without =", "", []string{"-var", "nodes", path}, "want NAME=VALUE", exitUsage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != "" {
				t.Setenv("FLEETD_VAR_nodes", tt.env)
			}
			out, errOut, code := runCmd(append([]string{"validate"}, tt.args...)...)
			if code != tt.code || !strings.Contains(out+errOut, tt.want) {
				t.Errorf("exit %d, want %d; want %q in\nstdout:\n%s\nstderr:\n%s", code, tt.code, tt.want, out, errOut)
			}
		})
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	src := strings.Replace(validSpec, "min_nodes = 1", "min_nodes = 0", 1)
	src = strings.Replace(src, `provider "local" {}`, "provider \"aws\" {\n    regionz = [\"x\"]\n  }", 1)
	path := writeTemp(t, "broken.hcl", src)
	out, errOut, code := runCmd("validate", path)
	if code != exitUsage || out != "" {
		t.Fatalf("exit %d stdout %q", code, out)
	}
	for _, want := range []string{
		path + ":7:15", "min_nodes must be at least 1",
		path + ":13:5", `Did you mean "regions"?`,
		`The argument "instance_types" is required`,
		"   13 |     regionz = [\"x\"]\n      |     ^^^^^^^\n",
		"\n5 errors\n",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(errOut, "\x1b[") {
		t.Errorf("colour escapes written to a non-terminal")
	}
}

func TestValidateJSON(t *testing.T) {
	good := writeTemp(t, "good.hcl", validSpec)
	out, _, code := runCmd("validate", "-json", good)
	var res validateOutput
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != exitOK {
		t.Fatalf("exit %d, %v:\n%s", code, err, out)
	}
	if !res.Valid || res.ErrorCount != 0 || len(res.Fleets) != 1 || res.Fleets[0].Name != "small" || res.Fleets[0].MaxNodes != 2 {
		t.Errorf("result = %+v", res)
	}

	bad := writeTemp(t, "bad.hcl", strings.Replace(validSpec, "gpus = 1", "gpus = -1\n    spot = 3", 1))
	out, errOut, code := runCmd("validate", "-json", bad)
	res = validateOutput{}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != exitUsage || errOut != "" {
		t.Fatalf("exit %d, %v, stderr %q:\n%s", code, err, errOut, out)
	}
	if res.Valid || res.ErrorCount != 2 || len(res.Diagnostics) != 2 || res.Fleets != nil {
		t.Fatalf("result = %+v", res)
	}
	d := res.Diagnostics[0]
	if d.Range == nil || d.Range.Start.Line != 10 || d.Snippet == nil || d.Snippet.Code[d.Snippet.HighlightStartOffset:d.Snippet.HighlightEndOffset] != "-1" {
		t.Errorf("diagnostic = %+v %+v", d.Range, d.Snippet)
	}
}

func TestValidateUsage(t *testing.T) {
	for _, args := range [][]string{{"validate"}, {"validate", "a.hcl", "b.hcl"}, {"validate", "-nope", "a.hcl"}} {
		if _, _, code := runCmd(args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
	_, errOut, code := runCmd("validate", filepath.Join(t.TempDir(), "missing.hcl"))
	if code != exitUsage || !strings.Contains(errOut, "Failed to read spec") {
		t.Errorf("missing file: exit %d: %s", code, errOut)
	}
}

func TestParseInterleaved(t *testing.T) {
	tests := []struct {
		args     []string
		wantPos  []string
		wantVars []string
	}{
		{[]string{"-var", "a=1", "f.hcl"}, []string{"f.hcl"}, []string{"a=1"}},
		{[]string{"f.hcl", "-var", "a=1", "g.hcl", "-var=b=2"}, []string{"f.hcl", "g.hcl"}, []string{"a=1", "b=2"}},
		{[]string{"f.hcl", "--", "-var", "x"}, []string{"f.hcl", "-var", "x"}, nil},
		{[]string{"-"}, []string{"-"}, nil},
		{nil, nil, nil},
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var vars varFlag
		fs.Var(&vars, "var", "")
		pos, err := parseInterleaved(fs, tt.args)
		if err != nil || !reflect.DeepEqual(pos, tt.wantPos) || !reflect.DeepEqual([]string(vars), tt.wantVars) {
			t.Errorf("%q: pos %q vars %q err %v", tt.args, pos, vars, err)
		}
	}
}

const unformatted = "fleet \"f\" {\nmin_nodes=1\n    max_nodes = 2\n  node {\n  gpus=1\n  }\n  provider \"local\" {}\n  training {\n    command = [\"x\"]\n  }\n}\n"

const formatted = "fleet \"f\" {\n  min_nodes = 1\n  max_nodes = 2\n  node {\n    gpus = 1\n  }\n  provider \"local\" {}\n  training {\n    command = [\"x\"]\n  }\n}\n"

func TestFmt(t *testing.T) {
	path := writeTemp(t, "fleet.hcl", unformatted)

	out, _, code := runCmd("fmt", "-check", path)
	if code != exitError || out != path+"\n" {
		t.Errorf("-check: exit %d, stdout %q", code, out)
	}
	if b, _ := os.ReadFile(path); string(b) != unformatted {
		t.Fatal("-check changed the file")
	}

	out, _, code = runCmd("fmt", "-check", "-diff", path)
	wantDiff := "--- a/" + path + "\n+++ b/" + path + "\n@@ -1,8 +1,8 @@\n fleet \"f\" {\n-min_nodes=1\n-    max_nodes = 2\n+  min_nodes = 1\n+  max_nodes = 2\n   node {\n-  gpus=1\n+    gpus = 1\n   }\n   provider \"local\" {}\n   training {\n"
	if code != exitError || out != path+"\n"+wantDiff {
		t.Errorf("-check -diff: exit %d, stdout:\n%s\nwant:\n%s", code, out, path+"\n"+wantDiff)
	}

	out, _, code = runCmd("fmt", path)
	if code != exitOK || out != path+"\n" {
		t.Errorf("fmt: exit %d, stdout %q", code, out)
	}
	b, _ := os.ReadFile(path)
	if string(b) != formatted {
		t.Errorf("rewritten file:\n%s\nwant:\n%s", b, formatted)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode changed to %v", fi.Mode().Perm())
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}

	out, _, code = runCmd("fmt", "-check", path)
	if code != exitOK || out != "" {
		t.Errorf("-check after fmt: exit %d, stdout %q", code, out)
	}
}

func TestFmtRefusesSyntaxErrors(t *testing.T) {
	src := "fleet \"f\" {\nmin_nodes = = 1\n}\n"
	path := writeTemp(t, "bad.hcl", src)
	_, errOut, code := runCmd("fmt", path)
	if code != exitUsage || !strings.Contains(errOut, path+":2:") || !strings.Contains(errOut, "1 error") {
		t.Errorf("exit %d, stderr:\n%s", code, errOut)
	}
	if b, _ := os.ReadFile(path); string(b) != src {
		t.Error("a file with a syntax error was rewritten")
	}
}

func TestFmtDirectory(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "a.hcl"), filepath.Join(dir, "b.txt"), filepath.Join(sub, "c.hcl")} {
		if err := os.WriteFile(p, []byte(unformatted), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, _, code := runCmd("fmt", "-check", dir)
	if code != exitError || out != filepath.Join(dir, "a.hcl")+"\n" {
		t.Errorf("dir: exit %d, stdout %q", code, out)
	}
	out, _, code = runCmd("fmt", "-check", "-recursive", dir)
	if code != exitError || out != filepath.Join(dir, "a.hcl")+"\n"+filepath.Join(sub, "c.hcl")+"\n" {
		t.Errorf("-recursive: exit %d, stdout %q", code, out)
	}
	if _, errOut, code := runCmd("fmt", filepath.Join(dir, "none.hcl")); code != exitError || errOut == "" {
		t.Errorf("missing file: exit %d", code)
	}
	if _, _, code := runCmd("fmt"); code != exitUsage {
		t.Errorf("no arguments: exit %d", code)
	}
}

func TestUnifiedDiff(t *testing.T) {
	tests := []struct {
		name, a, b, want string
	}{
		{"equal", "x\n", "x\n", ""},
		{"change in the middle", "1\n2\n3\n4\n5\n6\n7\n8\n9\n", "1\n2\n3\n4\nV\n6\n7\n8\n9\n",
			"--- a/f\n+++ b/f\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+V\n 6\n 7\n 8\n"},
		{"two hunks", "a\n1\n2\n3\n4\n5\n6\n7\n8\nb\n", "A\n1\n2\n3\n4\n5\n6\n7\n8\nB\n",
			"--- a/f\n+++ b/f\n@@ -1,4 +1,4 @@\n-a\n+A\n 1\n 2\n 3\n@@ -7,4 +7,4 @@\n 6\n 7\n 8\n-b\n+B\n"},
		{"insert into empty", "", "x\n", "--- a/f\n+++ b/f\n@@ -0,0 +1,1 @@\n+x\n"},
		{"no final newline", "x", "x\n", "--- a/f\n+++ b/f\n@@ -1,1 +1,1 @@\n-x\n\\ No newline at end of file\n+x\n"},
	}
	for _, tt := range tests {
		if got := unifiedDiff("f", []byte(tt.a), []byte(tt.b)); got != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.name, got, tt.want)
		}
	}
}
