// Package schema holds the JSON Schema of fleetd's v1 admin API responses
// (docs/api.md), embedded so tests and clients validate against the very
// document the daemon is checked with.
package schema

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// V1 is the JSON Schema document (draft 2020-12) of the v1 responses.
//
//go:embed v1.json
var V1 []byte

// V1URL is the schema's $id.
const V1URL = "https://fleetd.dev/schema/api/v1.json"

// Definitions the API documents.
const (
	Status         = "Status"
	FleetSummary   = "FleetSummary"
	FleetDetail    = "FleetDetail"
	EventsResponse = "EventsResponse"
	Event          = "Event"
)

// Validator validates JSON documents against one definition of the schema.
type Validator struct{ s *jsonschema.Schema }

// Compile returns a validator for a definition in $defs (e.g. Status). A
// value of the JSON array of definition ("[]FleetSummary") validates arrays.
func Compile(def string) (*Validator, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(V1))
	if err != nil {
		return nil, fmt.Errorf("schema v1: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource(V1URL, doc); err != nil {
		return nil, fmt.Errorf("schema v1: %w", err)
	}
	ref := V1URL + "#/$defs/" + def
	if inner, ok := bytes.CutPrefix([]byte(def), []byte("[]")); ok {
		arr := map[string]any{"type": "array", "items": map[string]any{"$ref": V1URL + "#/$defs/" + string(inner)}}
		if err := c.AddResource("mem://array-of-"+string(inner), arr); err != nil {
			return nil, err
		}
		ref = "mem://array-of-" + string(inner)
	}
	s, err := c.Compile(ref)
	if err != nil {
		return nil, fmt.Errorf("schema v1 %s: %w", def, err)
	}
	return &Validator{s: s}, nil
}

// Validate checks one JSON document.
func (v *Validator) Validate(doc []byte) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return v.s.Validate(inst)
}

// ValidateValue checks a Go value as it marshals to JSON.
func (v *Validator) ValidateValue(x any) error {
	b, err := json.Marshal(x)
	if err != nil {
		return err
	}
	return v.Validate(b)
}
