// Package spec decodes and validates fleet specs: HCL files with one or more
// `fleet "NAME" {}` blocks, `variable` blocks and HCL functions.
//
// Parse never stops at the first problem: it returns every error and warning
// as an hcl.Diagnostic that points at the offending attribute, together with
// the parsed sources so WriteDiagnostics can render snippets even when the
// spec is broken. Provider blocks are decoded with each provider's own
// schema, supplied by the caller, so the spec package knows no provider.
package spec

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/providers"
)

// Options are the inputs of Parse besides the source itself.
type Options struct {
	// Vars are variable values from the command line (-var NAME=VALUE).
	// They win over the environment and over declared defaults.
	Vars map[string]string
	// Env is the environment in os.Environ form. It feeds FLEETD_VAR_NAME
	// variable values and the env() function. Nil means an empty
	// environment, so Parse stays deterministic; the CLI passes os.Environ().
	Env []string
	// Schema returns the HCL schema of a provider block. A provider for
	// which it reports false is an error. Nil knows no provider.
	Schema func(provider string) (providers.ConfigSchema, bool)
	// KnownProviders lists the provider names Schema accepts. It is only
	// used to suggest a name when a provider is misspelled.
	KnownProviders []string
	// BaseDir is where file() resolves relative paths. ParseFile defaults it
	// to the spec's directory; Parse defaults it to the current directory.
	BaseDir string
	// ReadFile, when set, serves file() and fileexists() instead of the
	// filesystem: the daemon parses a spec with the files the CLI read, so
	// both see the same contents wherever the daemon runs.
	ReadFile func(path string) ([]byte, error)
	// Projects are the daemon's projects a fleet may name; nil accepts
	// any name (offline validation, where the daemon's are unknown).
	Projects ProjectSet
}

// ProjectSet is what the spec checks a fleet's project against (the
// daemon's projects.Config is one).
type ProjectSet interface {
	// Lookup gives a project's quota and borrowing ceiling in GPUs (0, 0:
	// not limited); ok is false for an unknown project.
	Lookup(name string) (quotaGPUs, maxGPUs int, ok bool)
	// Names lists the known projects, for suggestions.
	Names() []string
}

// File is a parsed spec file.
type File struct {
	Filename string   `json:"filename"`
	Fleets   []*Fleet `json:"fleets"`
	// Inputs are the raw variable values taken from Options.Vars and the
	// environment, by declared variable name (defaults are not included).
	// Parsing the same source elsewhere (the daemon) with
	// Options{Vars: Inputs} gives the same result without the environment.
	Inputs map[string]string `json:"inputs,omitempty"`
	// ReadFiles are the files file() read, by resolved path, and EnvUsed the
	// environment variables env() found: with Inputs they make a parse
	// reproducible elsewhere.
	ReadFiles map[string]string `json:"read_files,omitempty"`
	EnvUsed   map[string]string `json:"env_used,omitempty"`
	// Files holds every parsed source by name, for WriteDiagnostics. It is
	// set even when parsing fails.
	Files map[string]*hcl.File `json:"-"`
}

// Fleet returns the fleet with the given name, or nil.
func (f *File) Fleet(name string) *Fleet {
	for _, fl := range f.Fleets {
		if fl.Name == name {
			return fl
		}
	}
	return nil
}

// Fleet is one `fleet "NAME" {}` block with defaults applied.
type Fleet struct {
	Name     string `json:"name"`
	MinNodes int    `json:"min_nodes"`
	MaxNodes int    `json:"max_nodes"`
	// DesiredNodes is 0 when unset: the autoscaler picks within [min,max].
	DesiredNodes int `json:"desired_nodes,omitempty"`
	// Deadline is nil when unset.
	Deadline *time.Time `json:"deadline,omitempty"`
	// Work is the estimated remaining training time at MaxNodes; 0 if unset.
	Work       time.Duration `json:"work,omitempty"`
	Node       Node          `json:"node"`
	Placement  Placement     `json:"placement"`
	Providers  []Provider    `json:"providers"`
	Training   Training      `json:"training"`
	Rendezvous Rendezvous    `json:"rendezvous"`
	// Project is the project the fleet runs in; empty means the default
	// project (DefaultProject).
	Project string `json:"project,omitempty"`
	// Budget is the fleet's own budget block; nil when absent.
	Budget    *budget.Limits `json:"budget,omitempty"`
	DeclRange hcl.Range      `json:"-"`
}

// DefaultProject is the project of a fleet whose spec names none.
const DefaultProject = "default"

// ProjectName is the fleet's project with the default applied.
func (f *Fleet) ProjectName() string {
	if f.Project == "" {
		return DefaultProject
	}
	return f.Project
}

// TargetNodes is the node count to aim for before the autoscaler has
// decided: desired_nodes when set, otherwise max_nodes (the autoscaler
// then settles where throughput and price say, docs/autoscale.md).
func (f *Fleet) TargetNodes() int {
	if f.DesiredNodes > 0 {
		return f.DesiredNodes
	}
	return f.MaxNodes
}

// Provider returns the fleet's provider block with the given name.
func (f *Fleet) Provider(name string) (Provider, bool) {
	for _, p := range f.Providers {
		if p.Name == name {
			return p, true
		}
	}
	return Provider{}, false
}

// Node is the per-node hardware request.
type Node struct {
	// GPUs per node; 0 means a CPU-only fleet.
	GPUs int `json:"gpus"`
	// GPUTypes accepted (e.g. "A100", "H100"); empty accepts any.
	GPUTypes     []string `json:"gpu_types,omitempty"`
	MinVCPUs     int      `json:"min_vcpus,omitempty"`
	MinMemoryGiB float64  `json:"min_memory_gib,omitempty"`
	// Spot is true by default; false asks for on-demand capacity only.
	Spot bool `json:"spot"`
	// MaxPricePerGPUHour caps $/GPU-hour; 0 means no cap.
	MaxPricePerGPUHour float64 `json:"max_price_per_gpu_hour,omitempty"`
	// Network is node.network; "" means NetworkStandard (NetworkMode).
	Network Network `json:"network,omitempty"`
}

// Strategy ranks offerings.
type Strategy string

const (
	StrategyPriceCapacity Strategy = "price-capacity"
	StrategyLowestPrice   Strategy = "lowest-price"
	StrategyCapacity      Strategy = "capacity"
)

// Colocate says how close a fleet's nodes must be.
type Colocate string

const (
	ColocateZone   Colocate = "zone"
	ColocateRegion Colocate = "region"
	ColocateNone   Colocate = "none"
)

// Fallback is the on-demand fallback policy kind.
type Fallback string

const (
	// FallbackNever never launches on-demand nodes.
	FallbackNever Fallback = "never"
	// FallbackAfter launches on-demand nodes once the fleet has been below
	// min_nodes for Placement.FallbackAfter.
	FallbackAfter Fallback = "after"
	// FallbackDeadline spends on-demand only as needed to finish Work by
	// the fleet's Deadline.
	FallbackDeadline Fallback = "deadline"
)

// Placement is where and how nodes are placed.
type Placement struct {
	Strategy Strategy `json:"strategy"`
	Colocate Colocate `json:"colocate"`
	Fallback Fallback `json:"on_demand_fallback"`
	// FallbackAfter is set when Fallback is FallbackAfter.
	FallbackAfter time.Duration `json:"on_demand_fallback_after,omitempty"`
	// EgressPerGB overrides the egress price table a job move is priced
	// with: "FROM->TO" (each "cloud", "cloud:region" or "*") → $/GB.
	EgressPerGB map[string]float64 `json:"egress_per_gb,omitempty"`
	// Scale is how the autoscaler sizes the fleet when desired_nodes is
	// unset; empty means ScaleGoodput (ScalePolicy).
	Scale Scale `json:"scale,omitempty"`
}

// Scale is the autoscaler's policy (placement.scale).
type Scale string

const (
	// ScaleGoodput sizes the fleet by measured training throughput and
	// price (docs/autoscale.md); the default.
	ScaleGoodput Scale = "goodput"
	// ScaleMax aims at max_nodes.
	ScaleMax Scale = "max"
)

// ScalePolicy is Scale with its default applied.
func (p Placement) ScalePolicy() Scale {
	if p.Scale == "" {
		return ScaleGoodput
	}
	return p.Scale
}

// FallbackString renders the fallback policy in spec syntax.
func (p Placement) FallbackString() string {
	if p.Fallback == FallbackAfter {
		return fmt.Sprintf("after %s below min_nodes", p.FallbackAfter)
	}
	return string(p.Fallback)
}

// Provider is one `provider "NAME" {}` block, decoded with the provider's
// schema into the JSON object that becomes providers.Config.Raw.
type Provider struct {
	Name      string          `json:"name"`
	Config    json.RawMessage `json:"config"`
	DeclRange hcl.Range       `json:"-"`
}

// Training is how the workers run on each node.
type Training struct {
	Command []string `json:"command"`
	// Setup are shell commands run once at boot, before the agent starts.
	Setup []string `json:"setup,omitempty"`
	// Workdir is the workers' working directory; empty means the agent's.
	Workdir       string            `json:"workdir,omitempty"`
	NprocPerNode  int               `json:"nproc_per_node"`
	MaxRestarts   int               `json:"max_restarts"`
	MasterPort    int               `json:"master_port"`
	DrainGrace    time.Duration     `json:"drain_grace"`
	CheckpointURI string            `json:"checkpoint_uri,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
	// PeerPort is the port nodes serve their staged data to peers of
	// their zone on (docs/agent.md, "Data staging"); 0: each node picks a
	// free one. A fixed port is what a security group or firewall rule
	// between the nodes can name.
	PeerPort int `json:"peer_port,omitempty"`
	// WarmStart false turns the agents' pre-started Python interpreters
	// off; nil (not set) means on (docs/agent.md, "Warm starts").
	WarmStart *bool `json:"warm_start,omitempty"`
	// Elastic is how membership changes reach the workers: ElasticRestart
	// (empty means the same: the default) or ElasticInProcess
	// (docs/agent.md, "In-process elastic mode").
	Elastic string `json:"elastic,omitempty"`
	// Checkpoint is the training.checkpoint block; nil when absent (then
	// checkpoint_uri alone is handed to the workers, as before).
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	// Data are the training.data blocks (data.go).
	Data []Data `json:"data,omitempty"`
	// GradientMB is what each step all-reduces across nodes, in MB
	// (parameters × bytes per gradient element); 0 when not given. With
	// the nodes' fast-path bandwidth it gives the autoscaler a first
	// guess for sizes it has not measured (docs/autoscale.md).
	GradientMB float64 `json:"gradient_mb,omitempty"`
}

// Elastic modes (training.elastic).
const (
	// ElasticRestart: workers are stopped and restarted at every
	// membership change (torchrun's behaviour; any script works).
	ElasticRestart = "restart"
	// ElasticInProcess: workers stay alive; the agent hands them each
	// new round and the script follows it with fleetd_elastic.
	ElasticInProcess = "in-process"
)

// Rendezvous tunes the membership rounds.
type Rendezvous struct {
	LastCall  time.Duration `json:"last_call"`
	Heartbeat time.Duration `json:"heartbeat"`
	DeadAfter time.Duration `json:"dead_after"`
}

// Defaults, as documented in docs/spec.md.
const (
	DefaultNprocPerNode  = 1
	DefaultMaxRestarts   = 3
	DefaultMasterPort    = 29500
	DefaultDrainGrace    = 90 * time.Second
	DefaultLastCall      = 5 * time.Second
	DefaultHeartbeat     = 2 * time.Second
	DefaultDeadAfter     = 10 * time.Second
	DefaultFallbackAfter = 10 * time.Minute
)

// Parse decodes and validates a spec. It returns every problem found. The
// returned File is never nil and always carries Files; when diags has
// errors its Fleets may be incomplete and must not be acted on.
func Parse(filename string, src []byte, opts Options) (*File, hcl.Diagnostics) {
	p := newParser(filename, opts)
	p.parse(src)
	sortDiagnostics(p.diags)
	return p.file, p.diags
}

// ParseFile reads and parses the spec at path. BaseDir defaults to the
// directory of path.
func ParseFile(path string, opts Options) (*File, hcl.Diagnostics) {
	src, err := os.ReadFile(path)
	if err != nil {
		return &File{Filename: path, Files: map[string]*hcl.File{}}, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Failed to read spec",
			Detail:   fmt.Sprintf("Cannot read %s: %v.", path, err),
		}}
	}
	if opts.BaseDir == "" {
		opts.BaseDir = filepath.Dir(path)
	}
	return Parse(path, src, opts)
}
