package spec

import (
	"strings"
	"testing"
)

// TestElasticSetting: training.elastic is "restart" (the default, kept
// empty) or "in-process"; anything else is refused with both choices.
func TestElasticSetting(t *testing.T) {
	for _, tt := range []struct {
		training, want, err string
	}{
		{training: `command = ["x"]`, want: ""},
		{training: "command = [\"x\"]\nelastic = \"restart\"", want: ElasticRestart},
		{training: "command = [\"x\"]\nelastic = \"in-process\"", want: ElasticInProcess},
		{training: "command = [\"x\"]\nelastic = \"inprocess\"", err: `elastic must be "restart"`},
		{training: "command = [\"x\"]\nelastic = true", err: `got "true"`},
		{training: "command = [\"x\"]\nelastic = [\"in-process\"]", err: "Incorrect attribute value type"},
	} {
		f, diags := parseString(t, parts{training: tt.training}.src(), testOptions())
		if tt.err != "" {
			if !diags.HasErrors() || !strings.Contains(diags.Error(), tt.err) {
				t.Errorf("%q: diagnostics %v, want an error with %q", tt.training, diags, tt.err)
			}
			continue
		}
		if diags.HasErrors() {
			t.Fatalf("%q: %v", tt.training, diags)
		}
		if got := f.Fleets[0].Training.Elastic; got != tt.want {
			t.Errorf("%q: elastic %q, want %q", tt.training, got, tt.want)
		}
	}
}
