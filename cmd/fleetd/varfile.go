package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/fleetd/fleetd/fleet/spec"
)

// varFiles is the -var-file flag: each FILE holds `name = value` lines
// (HCL attributes, as in a Terraform .tfvars file). Its values join the -var
// list at the flag's place on the command line, so later flags win, as in
// Terraform. Problems are kept with their positions for report.
type varFiles struct {
	vars  *varFlag
	files map[string]*hcl.File
	diags hcl.Diagnostics
	paths []string
}

// registerVars adds -var and -var-file to fs, both feeding vars.
func registerVars(fs *flag.FlagSet, vars *varFlag) *varFiles {
	vf := &varFiles{vars: vars, files: map[string]*hcl.File{}}
	fs.Var(vars, "var", "set a spec variable `NAME=VALUE` (repeatable; wins over FLEETD_VAR_NAME)")
	fs.Var(vf, "var-file", "read spec variables from `FILE` (name = value lines, HCL or .tfvars; repeatable)")
	return vf
}

func (v *varFiles) String() string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v.paths)
}

// Set reads one file. Only an unreadable file fails the flag; what is wrong
// inside it is reported with positions by report.
func (v *varFiles) Set(path string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	v.paths = append(v.paths, path)
	kvs, f, diags := parseVarFile(path, src)
	v.files[path] = f
	v.diags = append(v.diags, diags...)
	*v.vars = append(*v.vars, kvs...)
	return nil
}

// report renders the var files' diagnostics on stderr and returns a usage
// error when any is an error.
func (v *varFiles) report(stderr io.Writer) error {
	if v == nil || len(v.diags) == 0 {
		return nil
	}
	width, color := diagStyle(stderr)
	_ = spec.WriteDiagnostics(stderr, v.files, v.diags, width, color)
	if v.diags.HasErrors() {
		return usageError{fmt.Errorf("invalid -var-file %v", v.paths)}
	}
	return nil
}

// parseVarFile turns a variables file into NAME=VALUE entries in the form
// -var takes: strings, numbers and bools as their text, lists, maps and
// objects as their HCL source (the spec parses those by the variable's type).
// Values must be literals: a variables file cannot call functions or refer
// to anything.
func parseVarFile(path string, src []byte) ([]string, *hcl.File, hcl.Diagnostics) {
	f, diags := hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, f, diags
	}
	body := f.Body.(*hclsyntax.Body)
	for _, b := range body.Blocks {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Unexpected block",
			Detail:  fmt.Sprintf("A variables file holds only name = value lines; %q is a block.", b.Type),
			Subject: b.DefRange().Ptr()})
	}
	names := make([]string, 0, len(body.Attributes))
	for n := range body.Attributes {
		names = append(names, n)
	}
	// Source order, so the entries (and any later duplicates) are stable.
	sort.Slice(names, func(i, j int) bool {
		return body.Attributes[names[i]].SrcRange.Start.Byte < body.Attributes[names[j]].SrcRange.Start.Byte
	})
	var kvs []string
	for _, n := range names {
		a := body.Attributes[n]
		val, d := a.Expr.Value(nil)
		if d.HasErrors() {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Value must be a literal",
				Detail:  fmt.Sprintf("The value of %q must be a literal (string, number, bool, list or map): %s", n, d[0].Detail),
				Subject: a.Expr.Range().Ptr()})
			continue
		}
		switch {
		case val.IsNull():
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Null value",
				Detail: fmt.Sprintf("%q is null; leave it out to use the variable's default.", n), Subject: a.Expr.Range().Ptr()})
		case val.Type() == cty.String:
			kvs = append(kvs, n+"="+val.AsString())
		case val.Type() == cty.Number:
			kvs = append(kvs, n+"="+val.AsBigFloat().Text('f', -1))
		case val.Type() == cty.Bool:
			kvs = append(kvs, fmt.Sprintf("%s=%t", n, val.True()))
		default:
			r := a.Expr.Range()
			kvs = append(kvs, n+"="+string(src[r.Start.Byte:r.End.Byte]))
		}
	}
	return kvs, f, diags
}
