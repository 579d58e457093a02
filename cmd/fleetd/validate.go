package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/local"
)

func init() {
	register(command{name: "validate", synopsis: "Check a fleet spec and report every problem", run: runValidate})
}

// builtinSchemas are the provider block schemas this binary knows. Other
// files add theirs from init (builtinSchemas["sim"] = sim.Schema): the map
// is initialised before any init function runs.
var builtinSchemas = map[string]providers.ConfigSchema{
	aws.Name:   aws.Schema,
	gcp.Name:   gcp.Schema,
	local.Name: local.Schema,
}

// builtinSchema looks up a built-in provider's schema; it is the
// spec.Options.Schema of the CLI and the daemon.
func builtinSchema(name string) (providers.ConfigSchema, bool) {
	s, ok := builtinSchemas[name]
	return s, ok
}

// builtinSchemaNames lists the providers builtinSchema knows, sorted.
func builtinSchemaNames() []string {
	names := make([]string, 0, len(builtinSchemas))
	for n := range builtinSchemas {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// varFlag collects repeated -var NAME=VALUE flags.
type varFlag []string

func (v *varFlag) String() string { return strings.Join(*v, ",") }

func (v *varFlag) Set(s string) error {
	if k, _, ok := strings.Cut(s, "="); !ok || k == "" {
		return fmt.Errorf("want NAME=VALUE, got %q", s)
	}
	*v = append(*v, s)
	return nil
}

// loadSpec reads and validates the spec at path with -var values and the
// process environment (FLEETD_VAR_*), using the built-in provider schemas.
// The returned sources render the diagnostics even when parsing failed.
func loadSpec(path string, vars []string) (*spec.File, map[string]*hcl.File, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	vm := make(map[string]string, len(vars))
	for _, kv := range vars {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid -var option",
				Detail: fmt.Sprintf("-var %q: want NAME=VALUE.", kv)})
			continue
		}
		vm[k] = v
	}
	// An absolute base makes file() paths the same keys the daemon resolves.
	base := filepath.Dir(path)
	if abs, err := filepath.Abs(base); err == nil {
		base = abs
	}
	f, d := spec.ParseFile(path, spec.Options{
		BaseDir:        base,
		Vars:           vm,
		Env:            os.Environ(),
		Schema:         builtinSchema,
		KnownProviders: builtinSchemaNames(),
	})
	return f, f.Files, append(diags, d...)
}

// parseInterleaved parses flags that may come before or after positional
// arguments (fleetd validate FILE -var x=1), which package flag alone does
// not allow. Arguments after "--" are all positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for range len(args) + 1 { // each round consumes at least one argument
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	return pos, nil
}

// diagStyle picks how to render diagnostics on w: colour and wrapping only
// on a terminal, and no colour when NO_COLOR is set.
func diagStyle(w io.Writer) (width uint, color bool) {
	f, ok := w.(*os.File)
	if !ok {
		return 0, false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return 0, false
	}
	width = 100
	if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c > 20 {
		width = uint(c)
	}
	return width, os.Getenv("NO_COLOR") == ""
}

// validateOutput is the -json document (written through secondsJSON).
type validateOutput struct {
	Valid        bool                  `json:"valid"`
	ErrorCount   int                   `json:"error_count"`
	WarningCount int                   `json:"warning_count"`
	Diagnostics  []spec.JSONDiagnostic `json:"diagnostics"`
	Fleets       []*spec.Fleet         `json:"fleets,omitempty"`
}

func runValidate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("validate", stderr)
	fs.SetOutput(stderr)
	var vars varFlag
	varFiles := registerVars(fs, &vars)
	asJSON := fs.Bool("json", false, "print the result as JSON on stdout")
	noColor := fs.Bool("no-color", false, "never colour diagnostics")
	setUsage(fs, stderr,
		"Usage: fleetd validate [-var NAME=VALUE ...] [-var-file FILE] [-json] FILE",
		"\nChecks a fleet spec and prints every problem with its position.",
		"Exit status: 0 valid (warnings allowed), 2 errors in the spec or usage.",
	)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 1 {
		fs.Usage()
		return exitUsage
	}
	f, files, diags := loadSpec(pos[0], vars)
	// Problems in a -var-file are shown with the spec's, at their positions.
	if files == nil {
		files = map[string]*hcl.File{}
	}
	for name, vf := range varFiles.files {
		files[name] = vf
	}
	diags = append(varFiles.diags, diags...)

	if *asJSON {
		out := validateOutput{Valid: !diags.HasErrors(), Diagnostics: spec.DiagnosticsJSON(files, diags)}
		for _, d := range diags {
			if d.Severity == hcl.DiagError {
				out.ErrorCount++
			} else {
				out.WarningCount++
			}
		}
		if out.Valid {
			out.Fleets = f.Fleets
		}
		// Durations as seconds (drain_grace_seconds), as the API writes them.
		doc, err := secondsJSON(out)
		if err != nil {
			fmt.Fprintln(stderr, "Error:", err)
			return exitError
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(doc); err != nil {
			fmt.Fprintln(stderr, "Error:", err)
			return exitError
		}
		if !out.Valid {
			return exitUsage
		}
		return exitOK
	}

	if len(diags) > 0 {
		width, color := diagStyle(stderr)
		if err := spec.WriteDiagnostics(stderr, files, diags, width, color && !*noColor); err != nil {
			fmt.Fprintln(stderr, "Error:", err)
			return exitError
		}
	}
	if diags.HasErrors() {
		return exitUsage
	}
	for _, fl := range f.Fleets {
		fmt.Fprintln(stdout, fleetSummary(fl))
	}
	return exitOK
}

// fleetSummary is one line per valid fleet: name, node range, providers.
func fleetSummary(fl *spec.Fleet) string {
	names := make([]string, len(fl.Providers))
	for i, p := range fl.Providers {
		names[i] = p.Name
	}
	nodes := fmt.Sprintf("%d..%d", fl.MinNodes, fl.MaxNodes)
	if fl.DesiredNodes > 0 {
		nodes += fmt.Sprintf(" (desired %d)", fl.DesiredNodes)
	}
	capacity := "spot"
	if !fl.Node.Spot {
		capacity = "on-demand"
	}
	gpus := fmt.Sprintf("%d GPU", fl.Node.GPUs)
	if fl.Node.GPUs != 1 {
		gpus += "s"
	}
	if len(fl.Node.GPUTypes) > 0 {
		gpus += " " + strings.Join(fl.Node.GPUTypes, "|")
	}
	return fmt.Sprintf("fleet %q: valid; nodes %s, %s %s each, providers %s",
		fl.Name, nodes, gpus, capacity, strings.Join(names, ", "))
}
