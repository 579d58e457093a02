package providers

import (
	"encoding/json"
	"fmt"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// AttrType is the type of a provider config attribute. The set is small on
// purpose: it must cross the plugin wire and map onto cty types.
type AttrType string

const (
	TypeString     AttrType = "string"
	TypeNumber     AttrType = "number"
	TypeBool       AttrType = "bool"
	TypeListString AttrType = "list(string)"
	TypeMapString  AttrType = "map(string)"
	// TypeJSON is any HCL value (objects, lists of objects), delivered as JSON.
	TypeJSON AttrType = "any"
)

// Attribute is one attribute of a provider block.
type Attribute struct {
	Name        string   `json:"name"`
	Type        AttrType `json:"type"`
	Required    bool     `json:"required,omitempty"`
	Description string   `json:"description,omitempty"`
}

// ConfigSchema is the schema of a provider's HCL block. The daemon decodes the
// block with it, so unknown attributes are errors with their source position.
type ConfigSchema struct {
	Attributes []Attribute `json:"attributes"`
}

func (t AttrType) ctyType() (cty.Type, error) {
	switch t {
	case TypeString:
		return cty.String, nil
	case TypeNumber:
		return cty.Number, nil
	case TypeBool:
		return cty.Bool, nil
	case TypeListString:
		return cty.List(cty.String), nil
	case TypeMapString:
		return cty.Map(cty.String), nil
	case TypeJSON:
		return cty.DynamicPseudoType, nil
	}
	return cty.NilType, fmt.Errorf("unknown attribute type %q", t)
}

// HCLSpec turns the schema into an hcldec spec.
func (s ConfigSchema) HCLSpec() (hcldec.ObjectSpec, error) {
	spec := hcldec.ObjectSpec{}
	for _, a := range s.Attributes {
		ty, err := a.Type.ctyType()
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %w", a.Name, err)
		}
		spec[a.Name] = &hcldec.AttrSpec{Name: a.Name, Type: ty, Required: a.Required}
	}
	return spec, nil
}

// DecodeBody decodes an HCL body against the schema into the JSON object the
// provider receives as Config.Raw. Attributes that are not set are omitted.
func (s ConfigSchema) DecodeBody(body hcl.Body, ctx *hcl.EvalContext) (json.RawMessage, hcl.Diagnostics) {
	spec, err := s.HCLSpec()
	if err != nil {
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Invalid provider schema", Detail: err.Error(), Subject: body.MissingItemRange().Ptr()}}
	}
	val, diags := hcldec.Decode(body, spec, ctx)
	if diags.HasErrors() {
		return nil, diags
	}
	out := map[string]json.RawMessage{}
	for name := range spec {
		v := val.GetAttr(name)
		if v.IsNull() {
			continue
		}
		if !v.IsWhollyKnown() {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Unknown value", Detail: fmt.Sprintf("The value of %q cannot be known in a fleet spec.", name), Subject: body.MissingItemRange().Ptr()})
			continue
		}
		b, err := ctyjson.Marshal(v, v.Type())
		if err != nil {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Unencodable value", Detail: err.Error(), Subject: body.MissingItemRange().Ptr()})
			continue
		}
		out[name] = b
	}
	raw, err := json.Marshal(out)
	if err != nil {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Unencodable provider block", Detail: err.Error()})
	}
	return raw, diags
}
