package spec

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
)

func TestSummary(t *testing.T) {
	e := &hcl.Diagnostic{Severity: hcl.DiagError}
	w := &hcl.Diagnostic{Severity: hcl.DiagWarning}
	tests := []struct {
		diags hcl.Diagnostics
		want  string
	}{
		{nil, ""},
		{hcl.Diagnostics{e}, "1 error"},
		{hcl.Diagnostics{e, e, e}, "3 errors"},
		{hcl.Diagnostics{w}, "1 warning"},
		{hcl.Diagnostics{e, w, e, w}, "2 errors, 2 warnings"},
	}
	for _, tt := range tests {
		if got := Summary(tt.diags); got != tt.want {
			t.Errorf("Summary(%d diags) = %q, want %q", len(tt.diags), got, tt.want)
		}
	}
}

func TestWriteDiagnosticsColorAndWidth(t *testing.T) {
	src := parts{placement: `strategy = "cheap"`}.src()
	f, diags := parseString(t, src, testOptions())
	var plain, color, narrow bytes.Buffer
	if err := WriteDiagnostics(&plain, f.Files, diags, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := WriteDiagnostics(&color, f.Files, diags, 0, true); err != nil {
		t.Fatal(err)
	}
	if err := WriteDiagnostics(&narrow, f.Files, diags, 40, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain.String(), "\x1b[") {
		t.Errorf("plain output has escapes:\n%s", plain.String())
	}
	if !strings.Contains(color.String(), ansiRed+"Error"+ansiReset) || !strings.Contains(color.String(), ansiRed+"^^^^^^^"+ansiReset) {
		t.Errorf("colored output lacks highlighted severity and carets:\n%q", color.String())
	}
	for _, line := range strings.Split(narrow.String(), "\n") {
		// Detail lines wrap at the width; source lines are never cut.
		if strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "  on ") && !strings.Contains(line, "|") && len(line) > 40 {
			t.Errorf("detail line longer than 40 columns: %q", line)
		}
	}
	if strings.Count(narrow.String(), "\n") <= strings.Count(plain.String(), "\n") {
		t.Errorf("narrow output was not wrapped:\n%s", narrow.String())
	}
}

func TestWriteDiagnosticsShowsVariableValues(t *testing.T) {
	src := "variable \"n\" {\n  default = 0\n}\n" + parts{minMax: "min_nodes = var.n\nmax_nodes = 2"}.src()
	f, diags := parseString(t, src, testOptions())
	var buf bytes.Buffer
	if err := WriteDiagnostics(&buf, f.Files, diags, 0, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "with var.n = 0") {
		t.Errorf("rendering does not show the variable's value:\n%s", buf.String())
	}
}

func TestWriteDiagnosticsMultiLineAndTabs(t *testing.T) {
	src := "fleet \"f\" {\n\tmin_nodes = 1\n\tmax_nodes = 2\n\tnode {\n\t\tgpus = 1\n\t}\n\tprovider \"local\" {}\n\ttraining {\n\t\tcommand = [\n\t\t\t\"x\",\n\t\t]\n\t\tmaster_port = 0\n\t}\n}\n"
	f, diags := parseString(t, src, testOptions())
	var buf bytes.Buffer
	if err := WriteDiagnostics(&buf, f.Files, diags, 0, false); err != nil {
		t.Fatal(err)
	}
	want := "   12 | \t\tmaster_port = 0\n      | \t\t              ^\n"
	if !strings.Contains(buf.String(), want) {
		t.Errorf("caret not aligned under a tab-indented value; got:\n%s", buf.String())
	}
}

func TestWriteDiagnosticsWithoutSource(t *testing.T) {
	diags := hcl.Diagnostics{
		{Severity: hcl.DiagError, Summary: "No source", Detail: "d", Subject: &hcl.Range{Filename: "gone.hcl", Start: hcl.Pos{Line: 3, Column: 4, Byte: 20}, End: hcl.Pos{Line: 3, Column: 5, Byte: 21}}},
		{Severity: hcl.DiagWarning, Summary: "No subject"},
	}
	var buf bytes.Buffer
	if err := WriteDiagnostics(&buf, nil, diags, 0, false); err != nil {
		t.Fatal(err)
	}
	want := "Error: No source\n\n  on gone.hcl:3:4:\n\n  d\n\nWarning: No subject\n\n1 error, 1 warning\n"
	if buf.String() != want {
		t.Errorf("got:\n%q\nwant:\n%q", buf.String(), want)
	}
}

func TestDiagnosticsJSON(t *testing.T) {
	src := parts{training: "command = [\"x\"]\nmaster_port = 70000"}.src()
	f, diags := parseString(t, src, testOptions())
	out := DiagnosticsJSON(f.Files, diags)
	if len(out) != 1 {
		t.Fatalf("got %d diagnostics", len(out))
	}
	d := out[0]
	if d.Severity != "error" || d.Summary != "Invalid master_port" || d.Range == nil || d.Range.Filename != "test.hcl" || d.Snippet == nil {
		t.Fatalf("diagnostic = %+v", d)
	}
	if got := d.Snippet.Code[d.Snippet.HighlightStartOffset:d.Snippet.HighlightEndOffset]; got != "70000" {
		t.Errorf("highlight = %q", got)
	}
	if d.Snippet.Context != `fleet "f", training` || d.Snippet.StartLine != d.Range.Start.Line {
		t.Errorf("snippet = %+v", d.Snippet)
	}
	if _, err := json.Marshal(out); err != nil {
		t.Fatal(err)
	}
}

func TestWrap(t *testing.T) {
	got := wrap("aaa bbb ccc\n\nddd", 7)
	want := []string{"aaa bbb", "ccc", "", "ddd"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("wrap = %q, want %q", got, want)
	}
}

func TestSuggest(t *testing.T) {
	opts := []string{"price-capacity", "lowest-price", "capacity"}
	tests := map[string]string{"lowest_price": "lowest-price", "capacty": "capacity", "Capacity": "capacity", "cheapest": ""}
	for given, want := range tests {
		if got := suggest(given, opts); got != want {
			t.Errorf("suggest(%q) = %q, want %q", given, got, want)
		}
	}
}

func TestFormat(t *testing.T) {
	in := "fleet \"a\" {\nmin_nodes=1\n  max_nodes =   2 # two\nnode {\ngpus=1\n}\n}\n"
	want := "fleet \"a\" {\n  min_nodes = 1\n  max_nodes = 2 # two\n  node {\n    gpus = 1\n  }\n}\n"
	got := string(Format([]byte(in)))
	if got != want {
		t.Errorf("Format:\n%s\nwant:\n%s", got, want)
	}
	if again := string(Format([]byte(got))); again != got {
		t.Errorf("Format is not idempotent:\n%s", again)
	}
	if _, diags := CheckSyntax("x.hcl", []byte("fleet {")); !diags.HasErrors() {
		t.Errorf("CheckSyntax accepted broken input")
	}
	if _, diags := CheckSyntax("x.hcl", []byte(in)); diags.HasErrors() {
		t.Errorf("CheckSyntax: %v", diags)
	}
}
