package fleet

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/cluster"
	"github.com/fleetd/fleetd/fleet/projects"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// Config is the daemon configuration (daemon.hcl).
type Config struct {
	// Listen is the API address. Loopback by default: exposing the daemon is a choice.
	Listen string `hcl:"listen,optional"`
	// AdvertiseURL is the URL agents on nodes (and the other servers of a
	// cluster) use to reach the daemon; defaults to the listen address with
	// the right scheme. Apply refuses cloud fleets while it is loopback
	// (reachability.go).
	AdvertiseURL string `hcl:"advertise_url,optional"`
	DataDir      string `hcl:"data_dir,optional"`
	PluginDir    string `hcl:"plugin_dir,optional"`
	// AgentDir holds the agent binaries nodes download, fleetd-linux-amd64
	// and fleetd-linux-arm64 (what `make release` puts in dist/). Unset:
	// the directory of the daemon's executable, then <data_dir>/agents.
	// Either way the daemon's own executable serves its own platform when
	// no file does (agentbinaries.go).
	AgentDir string `hcl:"agent_dir,optional"`
	// TokenFile holds the admin token; generated (0600) on first start.
	TokenFile   string         `hcl:"token_file,optional"`
	OrphanGrace string         `hcl:"orphan_grace,optional"`
	LogLevel    string         `hcl:"log_level,optional"`
	TLS         *TLSConfig     `hcl:"tls,block"`
	Plugins     []PluginConfig `hcl:"plugin,block"`
	// Cluster runs this server as one of several on etcd (docs/ha.md);
	// nil: one server on bbolt.
	Cluster *cluster.Config `hcl:"cluster,block"`
	// Autoscale tunes the goodput autoscaler (docs/autoscale.md); nil:
	// its defaults.
	Autoscale *AutoscaleConfig `hcl:"autoscale,block"`
	// Allocation tunes the allocator that sizes fleets within projects
	// and budgets (docs/projects.md); nil: its defaults.
	Allocation *AllocationConfig `hcl:"allocation,block"`
	// Rest is what the daemon's own schema leaves over: max_gpus and the
	// project blocks, decoded into Projects (fleet/projects).
	Rest hcl.Body `hcl:",remain"`
	// Projects are the project blocks and the pool (docs/projects.md);
	// untagged: decoded from Rest.
	Projects projects.Config

	// Dev marks a throwaway daemon (temporary data dir, token printed).
	// Untagged: gohcl ignores untagged fields, while `hcl:"-"` would make
	// "-" a required attribute and reject every config file.
	Dev bool
	// orphanGrace is OrphanGrace parsed.
	orphanGrace time.Duration
}

// TLSConfig enables TLS on the API. With auto (the default when the block is
// present) the daemon generates a CA and a server certificate in its data dir
// on first start; agents pin the CA's fingerprint.
type TLSConfig struct {
	Enabled  *bool    `hcl:"enabled,optional"`
	CertFile string   `hcl:"cert_file,optional"`
	KeyFile  string   `hcl:"key_file,optional"`
	Hosts    []string `hcl:"hosts,optional"` // extra SANs for the generated certificate
}

// AutoscaleConfig is the daemon config's autoscale block: how the
// goodput autoscaler measures and changes fleet sizes.
type AutoscaleConfig struct {
	// MeasureFor: a new size is judged once its throughput was measured
	// this long (default 1m).
	MeasureFor string `hcl:"measure_for,optional"`
	// MinInterval is the least time between two size changes of a fleet
	// (default 3m).
	MinInterval string `hcl:"min_interval,optional"`
	// MarginalEfficiency: a larger size is worth its cost when the
	// progress it adds is at least this fraction of what the same money
	// buys at the smaller size (default 0.5).
	MarginalEfficiency *float64 `hcl:"marginal_efficiency,optional"`

	params autoscale.Params
}

// Params are the autoscaler's parameters the block sets (zero: default).
func (a *AutoscaleConfig) Params() autoscale.Params {
	if a == nil {
		return autoscale.Params{}
	}
	return a.params
}

func (a *AutoscaleConfig) finish() error {
	if err := setDurations("autoscale", durationOpt{"measure_for", a.MeasureFor, &a.params.MeasureFor},
		durationOpt{"min_interval", a.MinInterval, &a.params.MinInterval}); err != nil {
		return err
	}
	if e := a.MarginalEfficiency; e != nil {
		if *e <= 0 || *e > 1 {
			return fmt.Errorf("autoscale: marginal_efficiency must be in (0, 1], got %g", *e)
		}
		a.params.MarginalEfficiency = *e
	}
	return nil
}

// AllocationConfig is the daemon config's allocation block: how readily
// the allocator moves GPUs between fleets (allocator.Params).
type AllocationConfig struct {
	// MinInterval: a fleet resized less than this long ago keeps its
	// nodes unless another project's guarantee needs them (default 5m).
	MinInterval string `hcl:"min_interval,optional"`
	// Horizon: how long an allocation is expected to hold (default 30m).
	Horizon string `hcl:"horizon,optional"`
	// AgingEvery: a queued fleet's priority rises by one per this wait
	// (default 10m).
	AgingEvery string `hcl:"aging_every,optional"`
	// ReserveAfter: a queued fleet that has waited this long keeps its
	// place (default 30m).
	ReserveAfter string `hcl:"reserve_after,optional"`
	// Fairness: 0 (default) maximizes total work; 1 the geometric mean
	// of the fleets' speedups; 2 Pollux's (allocator.Params.Fairness).
	Fairness *float64 `hcl:"fairness,optional"`

	params allocator.Params
}

// Params are the allocator parameters the block sets (zero: default).
func (a *AllocationConfig) Params() allocator.Params {
	if a == nil {
		return allocator.Params{}
	}
	return a.params
}

func (a *AllocationConfig) finish() error {
	if err := setDurations("allocation", durationOpt{"min_interval", a.MinInterval, &a.params.MinInterval},
		durationOpt{"horizon", a.Horizon, &a.params.Horizon}, durationOpt{"aging_every", a.AgingEvery, &a.params.AgingEvery},
		durationOpt{"reserve_after", a.ReserveAfter, &a.params.ReserveAfter}); err != nil {
		return err
	}
	if f := a.Fairness; f != nil {
		if *f < 0 || *f > 3 {
			return fmt.Errorf("allocation: fairness must be in [0, 3], got %g", *f)
		}
		a.params.Fairness = *f
	}
	return nil
}

// durationOpt is one optional setting of a config block that, when set,
// must be a positive duration.
type durationOpt struct {
	name, s string
	to      *time.Duration
}

// setDurations parses every set option into its target; block names the
// config block in the error.
func setDurations(block string, opts ...durationOpt) error {
	for _, d := range opts {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil || v <= 0 {
			return fmt.Errorf("%s: %s %q is not a positive duration", block, d.name, d.s)
		}
		*d.to = v
	}
	return nil
}

// PluginConfig pins an external provider plugin by checksum.
type PluginConfig struct {
	Name   string `hcl:"name,label"`
	SHA256 string `hcl:"sha256"`
}

// DefaultConfig is what `fleetd serve` uses without -config.
func DefaultConfig() Config {
	return Config{
		Listen:      "127.0.0.1:7777",
		DataDir:     "/var/lib/fleetd",
		PluginDir:   "/usr/lib/fleetd/plugins",
		OrphanGrace: "5m",
		LogLevel:    "info",
	}
}

// LoadConfig reads a daemon.hcl file over the defaults. Diagnostics carry
// positions; the caller renders them.
func LoadConfig(path string) (Config, map[string]*hcl.File, hcl.Diagnostics) {
	cfg := DefaultConfig()
	src, err := os.ReadFile(path)
	if err != nil {
		return cfg, nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Cannot read daemon config", Detail: err.Error()}}
	}
	return ParseConfig(path, src)
}

// ParseConfig parses daemon config source.
func ParseConfig(filename string, src []byte) (Config, map[string]*hcl.File, hcl.Diagnostics) {
	cfg := DefaultConfig()
	f, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	files := map[string]*hcl.File{filename: f}
	if diags.HasErrors() {
		return cfg, files, diags
	}
	diags = append(diags, gohcl.DecodeBody(f.Body, nil, &cfg)...)
	if diags.HasErrors() {
		return cfg, files, diags
	}
	pc, pdiags := projects.Decode(cfg.Rest)
	cfg.Projects = pc
	if diags = append(diags, pdiags...); diags.HasErrors() {
		return cfg, files, diags
	}
	if err := cfg.finish(filepath.Dir(filename)); err != nil {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid daemon config", Detail: err.Error(), Subject: f.Body.MissingItemRange().Ptr()})
	}
	return cfg, files, diags
}

// finish validates and fills derived fields; relative paths are relative to base.
func (c *Config) finish(base string) error {
	if c.OrphanGrace == "" {
		c.OrphanGrace = "5m"
	}
	d, err := time.ParseDuration(c.OrphanGrace)
	if err != nil || d < 0 {
		return fmt.Errorf("orphan_grace %q is not a duration", c.OrphanGrace)
	}
	c.orphanGrace = d
	if c.AdvertiseURL != "" {
		u, err := url.Parse(c.AdvertiseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("advertise_url %q: want http(s)://HOST:PORT, the address nodes and other servers reach this daemon at", c.AdvertiseURL)
		}
		// Paths are appended to it ("/v1/agent/…").
		c.AdvertiseURL = strings.TrimRight(c.AdvertiseURL, "/")
	}
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) || base == "" {
			return p
		}
		return filepath.Join(base, p)
	}
	c.DataDir, c.PluginDir, c.TokenFile, c.AgentDir = abs(c.DataDir), abs(c.PluginDir), abs(c.TokenFile), abs(c.AgentDir)
	if c.TLS != nil {
		c.TLS.CertFile, c.TLS.KeyFile = abs(c.TLS.CertFile), abs(c.TLS.KeyFile)
		if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
			return fmt.Errorf("tls: cert_file and key_file must be set together")
		}
	}
	seen := map[string]bool{}
	for _, p := range c.Plugins {
		if seen[p.Name] {
			return fmt.Errorf("plugin %q is configured twice", p.Name)
		}
		seen[p.Name] = true
		if len(p.SHA256) != 64 {
			return fmt.Errorf("plugin %q: sha256 must be 64 hex characters", p.Name)
		}
	}
	if c.TokenFile == "" && c.DataDir != "" {
		c.TokenFile = filepath.Join(c.DataDir, "token")
	}
	if c.Cluster != nil {
		if err := c.Cluster.Finish(base, c.DataDir); err != nil {
			return err
		}
	}
	if c.Autoscale != nil {
		if err := c.Autoscale.finish(); err != nil {
			return err
		}
	}
	if c.Allocation != nil {
		if err := c.Allocation.finish(); err != nil {
			return err
		}
	}
	return nil
}

// Finish is finish for configs built in code (flags, -dev).
func (c *Config) Finish() error { return c.finish("") }

// TLSEnabled reports whether the API serves TLS.
func (c *Config) TLSEnabled() bool {
	return c.TLS != nil && (c.TLS.Enabled == nil || *c.TLS.Enabled)
}

// OrphanGraceDuration is the parsed orphan_grace.
func (c *Config) OrphanGraceDuration() time.Duration { return c.orphanGrace }
