package schema_test

import (
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/api/schema"
	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/fleet/state"
)

func TestEveryDefinitionCompiles(t *testing.T) {
	for _, def := range []string{"Project", "QueueEntry", "AllocationInfo", schema.Status, schema.FleetSummary, schema.FleetDetail, schema.EventsResponse, schema.Event, "[]" + schema.FleetSummary} {
		if _, err := schema.Compile(def); err != nil {
			t.Errorf("%s: %v", def, err)
		}
	}
	if _, err := schema.Compile("Nope"); err == nil {
		t.Error("an unknown definition compiled")
	}
}

// jsonFields lists the JSON names of a struct's fields, embedded structs
// flattened as encoding/json does.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// schemaFields lists the properties a definition documents (following one
// $ref to the open field set FleetSummary and FleetDetail share).
func schemaFields(t *testing.T, defs map[string]any, name string) []string {
	t.Helper()
	def, ok := defs[name].(map[string]any)
	if !ok {
		t.Fatalf("no definition %s", name)
	}
	var out []string
	if props, ok := def["properties"].(map[string]any); ok {
		for k := range props {
			out = append(out, k)
		}
	}
	if ref, ok := def["$ref"].(string); ok {
		out = append(out, schemaFields(t, defs, strings.TrimPrefix(ref, "#/$defs/"))...)
	}
	sort.Strings(out)
	return out
}

// Every field of the Go wire types is documented in the schema and vice
// versa: fields hidden by omitempty in live responses are caught here.
func TestSchemaCoversWireTypes(t *testing.T) {
	var doc map[string]any
	if err := json.Unmarshal(schema.V1, &doc); err != nil {
		t.Fatal(err)
	}
	defs := doc["$defs"].(map[string]any)
	for _, c := range []struct {
		def string
		typ any
	}{
		{"Status", api.Status{}},
		{"FleetSummary", api.FleetSummary{}},
		{"FleetDetail", api.FleetDetail{}},
		{"NodeInfo", api.NodeInfo{}},
		{"RendezvousInfo", api.RendezvousInfo{}},
		{"RecoveryInfo", api.RecoveryInfo{}},
		{"AlertInfo", api.AlertInfo{}},
		{"InterruptionInfo", api.InterruptionInfo{}},
		{"TrainingInfo", api.TrainingInfo{}},
		{"TrainingPoint", api.TrainingPoint{}},
		{"ScalingInfo", api.ScalingInfo{}},
		{"AllocationInfo", api.AllocationInfo{}},
		{"BudgetInfo", api.BudgetInfo{}},
		{"Project", api.Project{}},
		{"ProjectRequest", api.ProjectRequest{}},
		{"ProjectChanged", api.ProjectChanged{}},
		{"BudgetLimits", budget.Limits{}},
		{"QueueEntry", api.QueueEntry{}},
		{"ScaleOption", api.ScaleOption{}},
		{"ScaleModel", api.ScaleModel{}},
		{"CheckpointStatus", api.CheckpointStatus{}},
		{"CheckpointTransfer", api.CheckpointTransfer{}},
		{"CheckpointRestore", api.CheckpointRestore{}},
		{"Event", state.Event{}},
		{"EventsResponse", api.EventsResponse{}},
	} {
		t.Run(c.def, func(t *testing.T) {
			goFields := jsonFields(reflect.TypeOf(c.typ))
			docFields := schemaFields(t, defs, c.def)
			if !reflect.DeepEqual(goFields, docFields) {
				t.Errorf("Go type has %v\nschema has   %v", goFields, docFields)
			}
		})
	}
}
