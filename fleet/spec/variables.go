package spec

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// EnvVarPrefix prefixes environment variables that set spec variables:
// FLEETD_VAR_region sets var.region (FLEETD_VAR_REGION works too).
const EnvVarPrefix = "FLEETD_VAR_"

var variableSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "type"},
		{Name: "default"},
		{Name: "description"},
	},
}

// decodeVariables fills p.vars. A variable whose value is in error is set to
// an unknown value so references to it add no second error.
func (p *parser) decodeVariables(blocks hcl.Blocks) {
	fctx := p.evalContext(false) // defaults may call functions, not read variables
	for _, b := range blocks {
		name := b.Labels[0]
		if !hclsyntax.ValidIdentifier(name) {
			p.errorAt(b.LabelRanges[0], "Invalid variable name",
				fmt.Sprintf("%q is not a valid variable name: use letters, digits, underscores and dashes, starting with a letter.", name))
			continue
		}
		if prev := p.varDefs[name]; prev != nil {
			p.errorAt(b.LabelRanges[0], "Duplicate variable",
				fmt.Sprintf("A variable named %q was already declared at %s.", name, p.where(prev.DefRange)))
			continue
		}
		p.varDefs[name] = b
		p.vars[name] = cty.DynamicVal

		content, diags := b.Body.Content(variableSchema)
		p.diags = append(p.diags, diags...)

		ty, tyOK := cty.DynamicPseudoType, true
		if a := content.Attributes["type"]; a != nil {
			t, d := typeexpr.TypeConstraint(a.Expr)
			p.diags = append(p.diags, d...)
			ty, tyOK = t, !d.HasErrors()
		}
		if a := content.Attributes["description"]; a != nil {
			v, d := a.Expr.Value(fctx)
			p.diags = append(p.diags, d...)
			if !d.HasErrors() && (v.Type() != cty.String || v.IsNull()) {
				p.attrError(a, "Invalid description", "A variable's description must be a string.")
			}
		}

		def, hasDef, defOK := cty.NilVal, false, true
		if a := content.Attributes["default"]; a != nil {
			hasDef = true
			def, defOK = p.variableDefault(a, fctx, ty, tyOK)
		}
		if !tyOK || !defOK {
			continue
		}

		// Precedence: -var, then the environment, then the default.
		if raw, ok := p.opts.Vars[name]; ok {
			p.setVariable(b, name, raw, ty, "-var "+name)
			continue
		}
		if raw, src, ok := p.envVariable(name); ok {
			p.setVariable(b, name, raw, ty, "environment variable "+src)
			continue
		}
		if hasDef {
			p.vars[name] = def
			continue
		}
		p.errorAt(b.DefRange, "No value for required variable",
			fmt.Sprintf("Variable %q has no default. Set it with -var %s=VALUE or the environment variable %s%s.", name, name, EnvVarPrefix, name))
	}
	for _, name := range slices.Sorted(maps.Keys(p.opts.Vars)) {
		if p.varDefs[name] != nil {
			continue
		}
		detail := fmt.Sprintf("A value was given with -var %s=..., but no variable %q is declared in %s.", name, name, p.filename)
		if s := suggest(name, slices.Sorted(maps.Keys(p.varDefs))); s != "" {
			detail += fmt.Sprintf(" Did you mean %q?", s)
		}
		p.diags = append(p.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Value for undeclared variable", Detail: detail})
	}
}

func (p *parser) variableDefault(a *hcl.Attribute, fctx *hcl.EvalContext, ty cty.Type, tyOK bool) (cty.Value, bool) {
	if refs := a.Expr.Variables(); len(refs) > 0 {
		p.errorAt(refs[0].SourceRange(), "Variables not allowed",
			"A variable's default must not refer to other variables.")
		return cty.NilVal, false
	}
	v, d := a.Expr.Value(fctx)
	p.diags = append(p.diags, d...)
	if d.HasErrors() {
		return cty.NilVal, false
	}
	if !tyOK || v.IsNull() {
		return v, true
	}
	cv, err := convert.Convert(v, ty)
	if err != nil {
		p.attrError(a, "Invalid default value",
			fmt.Sprintf("The default does not match the variable's type %s: %s.", typeexpr.TypeString(ty), err))
		return cty.NilVal, false
	}
	return cv, true
}

func (p *parser) envVariable(name string) (value, source string, ok bool) {
	for _, key := range []string{EnvVarPrefix + name, EnvVarPrefix + strings.ToUpper(name)} {
		if v, ok := p.env[key]; ok {
			return v, key, true
		}
	}
	return "", "", false
}

func (p *parser) setVariable(b *hcl.Block, name, raw string, ty cty.Type, source string) {
	v, err := parseVarValue(name, raw, ty)
	if err != nil {
		p.errorAt(b.DefRange, "Invalid value for variable",
			fmt.Sprintf("The value from %s is not valid for variable %q: %s.", source, name, err))
		return
	}
	p.vars[name] = v
	if p.file.Inputs == nil {
		p.file.Inputs = map[string]string{}
	}
	p.file.Inputs[name] = raw
}

// parseVarValue turns a command-line or environment string into a value of
// type ty. Primitive types take the string as is (no quoting needed);
// collections and objects are written as HCL literals: -var 'zones=["a","b"]'.
func parseVarValue(name, raw string, ty cty.Type) (cty.Value, error) {
	if ty == cty.DynamicPseudoType {
		return cty.StringVal(raw), nil
	}
	if ty.IsPrimitiveType() {
		v, err := convert.Convert(cty.StringVal(raw), ty)
		if err != nil {
			return cty.NilVal, fmt.Errorf("%q is not a valid %s", raw, typeexpr.TypeString(ty))
		}
		return v, nil
	}
	expr, diags := hclsyntax.ParseExpression([]byte(raw), "<value for var."+name+">", hcl.InitialPos)
	if diags.HasErrors() {
		return cty.NilVal, fmt.Errorf("cannot parse %q as an HCL value (%s)", raw, diags[0].Detail)
	}
	v, diags := expr.Value(nil)
	if diags.HasErrors() {
		return cty.NilVal, fmt.Errorf("%q must be a literal value (%s)", raw, diags[0].Detail)
	}
	cv, err := convert.Convert(v, ty)
	if err != nil {
		return cty.NilVal, fmt.Errorf("%s required, got %q (%v)", typeexpr.TypeString(ty), raw, err)
	}
	return cv, nil
}
