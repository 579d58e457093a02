package spec

import (
	"fmt"
	"maps"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

var rootSchema = &hcl.BodySchema{
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "variable", LabelNames: []string{"name"}},
		{Type: "fleet", LabelNames: []string{"name"}},
	},
}

// parser holds the state of one Parse call. Every problem goes to diags and
// decoding carries on, so one run reports everything.
type parser struct {
	filename string
	opts     Options
	env      map[string]string
	file     *File
	diags    hcl.Diagnostics

	vars    map[string]cty.Value
	varDefs map[string]*hcl.Block
	ctx     *hcl.EvalContext
	// badRoots are unknown root names (anything but var). Like undeclared
	// or invalid variables they evaluate to unknown values, so a reported
	// mistake causes no follow-up errors.
	badRoots map[string]bool
}

func newParser(filename string, opts Options) *parser {
	return &parser{
		filename: filename,
		opts:     opts,
		env:      envMap(opts.Env),
		file:     &File{Filename: filename, Files: map[string]*hcl.File{}},
		vars:     map[string]cty.Value{},
		varDefs:  map[string]*hcl.Block{},
		badRoots: map[string]bool{},
	}
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			m[k] = v
		}
	}
	return m
}

func (p *parser) parse(src []byte) {
	hp := hclparse.NewParser()
	f, diags := hp.ParseHCL(src, p.filename)
	p.file.Files = hp.Files()
	p.diags = append(p.diags, diags...)
	// After a syntax error the recovered body is partial; decoding it would
	// only add confusing follow-up errors.
	if diags.HasErrors() {
		return
	}
	content, diags := f.Body.Content(rootSchema)
	p.diags = append(p.diags, diags...)

	var varBlocks, fleetBlocks hcl.Blocks
	for _, b := range content.Blocks {
		switch b.Type {
		case "variable":
			varBlocks = append(varBlocks, b)
		case "fleet":
			fleetBlocks = append(fleetBlocks, b)
		}
	}
	p.decodeVariables(varBlocks)
	for _, b := range fleetBlocks {
		p.checkRefs(b.Body)
	}
	p.ctx = p.evalContext(true)

	seen := map[string]*hcl.Block{}
	for _, b := range fleetBlocks {
		name := b.Labels[0]
		if prev, dup := seen[name]; dup {
			p.errorAt(b.LabelRanges[0], "Duplicate fleet name",
				fmt.Sprintf("A fleet named %q was already declared at %s. Fleet names must be unique.", name, p.where(prev.DefRange)))
		} else {
			seen[name] = b
		}
		if fl := p.decodeFleet(b); fl != nil {
			p.file.Fleets = append(p.file.Fleets, fl)
		}
	}
	if len(fleetBlocks) == 0 && !diags.HasErrors() {
		p.diags = append(p.diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "No fleet declared",
			Detail:   `A spec needs at least one fleet "NAME" { ... } block.`,
			Subject:  f.Body.MissingItemRange().Ptr(),
		})
	}
}

func (p *parser) evalContext(withVars bool) *hcl.EvalContext {
	ctx := &hcl.EvalContext{Functions: p.functions()}
	if withVars {
		ctx.Variables = map[string]cty.Value{"var": cty.ObjectVal(p.vars)}
		for root := range p.badRoots {
			ctx.Variables[root] = cty.DynamicVal
		}
	}
	return ctx
}

// checkRefs reports every reference to an undeclared variable in body, once
// per occurrence, and makes it evaluate to an unknown value.
func (p *parser) checkRefs(body hcl.Body) {
	sb, ok := body.(*hclsyntax.Body)
	if !ok {
		return
	}
	for _, name := range sortedAttrNames(sb.Attributes) {
		for _, tr := range sb.Attributes[name].Expr.Variables() {
			p.checkTraversal(tr)
		}
	}
	for _, b := range sb.Blocks {
		p.checkRefs(b.Body)
	}
}

func sortedAttrNames(attrs hclsyntax.Attributes) []string {
	names := make([]string, 0, len(attrs))
	for n := range attrs {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		return attrs[names[i]].SrcRange.Start.Byte < attrs[names[j]].SrcRange.Start.Byte
	})
	return names
}

func (p *parser) checkTraversal(tr hcl.Traversal) {
	root := tr.RootName()
	if root != "var" {
		p.errorAt(tr.SourceRange(), "Unknown variable",
			fmt.Sprintf("There is no variable named %q. Variables are declared with variable blocks and referenced as var.NAME.", root))
		p.badRoots[root] = true
		return
	}
	if len(tr) < 2 {
		return
	}
	var name string
	switch step := tr[1].(type) {
	case hcl.TraverseAttr:
		name = step.Name
	case hcl.TraverseIndex:
		if step.Key.Type() != cty.String || !step.Key.IsKnown() || step.Key.IsNull() {
			return
		}
		name = step.Key.AsString()
	default:
		return
	}
	if _, ok := p.vars[name]; ok {
		return
	}
	detail := fmt.Sprintf("No variable named %q is declared in this file.", name)
	if s := suggest(name, slices.Sorted(maps.Keys(p.vars))); s != "" {
		detail += fmt.Sprintf(" Did you mean %q?", s)
	} else {
		detail += fmt.Sprintf(` Declare it with a variable %q { } block.`, name)
	}
	p.errorAt(hcl.RangeBetween(tr[0].SourceRange(), tr[1].SourceRange()), "Reference to undeclared variable", detail)
	p.vars[name] = cty.DynamicVal
}

func (p *parser) errorAt(r hcl.Range, summary, detail string) {
	p.diags = append(p.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: r.Ptr()})
}

// attrError reports a problem with an attribute's value: the subject is the
// value, the context the whole attribute.
func (p *parser) attrError(a *hcl.Attribute, summary, detail string) {
	p.attrDiag(hcl.DiagError, a, summary, detail)
}

func (p *parser) attrWarning(a *hcl.Attribute, summary, detail string) {
	p.attrDiag(hcl.DiagWarning, a, summary, detail)
}

func (p *parser) attrDiag(sev hcl.DiagnosticSeverity, a *hcl.Attribute, summary, detail string) {
	p.diags = append(p.diags, &hcl.Diagnostic{
		Severity:    sev,
		Summary:     summary,
		Detail:      detail,
		Subject:     a.Expr.Range().Ptr(),
		Context:     a.Range.Ptr(),
		Expression:  a.Expr,
		EvalContext: p.ctx,
	})
}

// eval evaluates attribute a and converts it to ty. ok is false when the
// attribute is unset, null, in error (reported) or depends on a value that
// is already in error (not reported again).
func (p *parser) eval(a *hcl.Attribute, ty cty.Type) (cty.Value, bool) {
	if a == nil {
		return cty.NilVal, false
	}
	v, diags := a.Expr.Value(p.ctx)
	p.diags = append(p.diags, diags...)
	if diags.HasErrors() || !v.IsWhollyKnown() || v.IsNull() {
		return cty.NilVal, false
	}
	cv, err := convert.Convert(v, ty)
	if err != nil {
		p.attrError(a, "Incorrect attribute value type",
			fmt.Sprintf("Inappropriate value for attribute %q: %s.", a.Name, convertMessage(err, ty)))
		return cty.NilVal, false
	}
	if !cv.IsWhollyKnown() || cv.IsNull() {
		return cty.NilVal, false
	}
	return cv, true
}

// requireValue reports a required attribute that evaluates to null, which
// eval otherwise treats as "not set".
func (p *parser) requireValue(a *hcl.Attribute) {
	if a == nil {
		return
	}
	v, diags := a.Expr.Value(p.ctx)
	if !diags.HasErrors() && v.IsKnown() && v.IsNull() {
		p.attrError(a, "Missing value", fmt.Sprintf("%s is required and must not be null.", a.Name))
	}
}

func convertMessage(err error, ty cty.Type) string {
	msg := err.Error()
	if ty.IsPrimitiveType() {
		return ty.FriendlyNameForConstraint() + " required"
	}
	return msg
}

func (p *parser) intAttr(a *hcl.Attribute, dst *int) bool {
	v, ok := p.eval(a, cty.Number)
	if !ok {
		return false
	}
	bf := v.AsBigFloat()
	if !bf.IsInt() {
		p.attrError(a, "Invalid value", fmt.Sprintf("%s must be a whole number, got %s.", a.Name, bf.Text('g', -1)))
		return false
	}
	i, acc := bf.Int64()
	if acc != big.Exact || i > 1<<31 || i < -(1<<31) {
		p.attrError(a, "Invalid value", fmt.Sprintf("%s is out of range.", a.Name))
		return false
	}
	*dst = int(i)
	return true
}

func (p *parser) floatAttr(a *hcl.Attribute, dst *float64) bool {
	v, ok := p.eval(a, cty.Number)
	if !ok {
		return false
	}
	*dst, _ = v.AsBigFloat().Float64()
	return true
}

func (p *parser) boolAttr(a *hcl.Attribute, dst *bool) bool {
	v, ok := p.eval(a, cty.Bool)
	if !ok {
		return false
	}
	*dst = v.True()
	return true
}

func (p *parser) stringAttr(a *hcl.Attribute, dst *string) bool {
	v, ok := p.eval(a, cty.String)
	if !ok {
		return false
	}
	*dst = v.AsString()
	return true
}

func (p *parser) stringListAttr(a *hcl.Attribute, dst *[]string) bool {
	v, ok := p.eval(a, cty.List(cty.String))
	if !ok {
		return false
	}
	out := make([]string, 0, v.LengthInt())
	for it := v.ElementIterator(); it.Next(); {
		_, ev := it.Element()
		if ev.IsNull() {
			p.attrError(a, "Invalid value", fmt.Sprintf("%s must not contain null elements.", a.Name))
			return false
		}
		out = append(out, ev.AsString())
	}
	*dst = out
	return true
}

func (p *parser) stringMapAttr(a *hcl.Attribute, dst *map[string]string) bool {
	v, ok := p.eval(a, cty.Map(cty.String))
	if !ok {
		return false
	}
	out := make(map[string]string, v.LengthInt())
	for it := v.ElementIterator(); it.Next(); {
		k, ev := it.Element()
		if ev.IsNull() {
			p.attrError(a, "Invalid value", fmt.Sprintf("%s[%q] must not be null.", a.Name, k.AsString()))
			return false
		}
		out[k.AsString()] = ev.AsString()
	}
	*dst = out
	return true
}

// durationAttr decodes a Go duration string ("90s", "10m", "1h30m").
// allowZero admits "0s" where zero has a meaning of its own.
func (p *parser) durationAttr(a *hcl.Attribute, dst *time.Duration, allowZero bool) bool {
	var s string
	if !p.stringAttr(a, &s) {
		return false
	}
	d, err := parseDuration(s)
	if err != nil {
		p.attrError(a, "Invalid duration", fmt.Sprintf("%s: %s", a.Name, err))
		return false
	}
	if d < 0 || (d == 0 && !allowZero) {
		want := "greater than zero"
		if allowZero {
			want = "zero or more"
		}
		p.attrError(a, "Invalid duration", fmt.Sprintf("%s must be %s, got %q.", a.Name, want, s))
		return false
	}
	*dst = d
	return true
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err == nil {
		return d, nil
	}
	if _, nerr := strconv.ParseFloat(strings.TrimSpace(s), 64); nerr == nil {
		return 0, fmt.Errorf("%q has no unit; write a duration such as %q", s, strings.TrimSpace(s)+"s")
	}
	return 0, fmt.Errorf("%q is not a duration; use a number with a unit (ns, us, ms, s, m, h), e.g. \"90s\", \"10m\", \"1h30m\"", s)
}

// singleBlock returns the only block of type typ, reporting duplicates.
func (p *parser) singleBlock(blocks hcl.Blocks, typ string) *hcl.Block {
	var first *hcl.Block
	for _, b := range blocks {
		if b.Type != typ {
			continue
		}
		if first != nil {
			p.errorAt(b.DefRange, fmt.Sprintf("Duplicate %s block", typ),
				fmt.Sprintf("A %s block was already declared at %s; a fleet has at most one.", typ, p.where(first.DefRange)))
			continue
		}
		first = b
	}
	return first
}

// where names a position for a diagnostic's detail: "line 3" within the
// spec itself, file:line:col elsewhere.
func (p *parser) where(r hcl.Range) string {
	if r.Filename == p.filename {
		return fmt.Sprintf("line %d", r.Start.Line)
	}
	return fmt.Sprintf("%s:%d:%d", r.Filename, r.Start.Line, r.Start.Column)
}

// sortDiagnostics orders diagnostics by position so the output reads top to
// bottom; diagnostics without a position come first. Ties are broken by
// text, since some decoders report from map iteration order.
func sortDiagnostics(diags hcl.Diagnostics) {
	sort.SliceStable(diags, func(i, j int) bool {
		a, b := diags[i].Subject, diags[j].Subject
		switch {
		case (a == nil) != (b == nil):
			return a == nil
		case a != nil && a.Filename != b.Filename:
			return a.Filename < b.Filename
		case a != nil && a.Start.Byte != b.Start.Byte:
			return a.Start.Byte < b.Start.Byte
		case diags[i].Summary != diags[j].Summary:
			return diags[i].Summary < diags[j].Summary
		}
		return diags[i].Detail < diags[j].Detail
	})
}
