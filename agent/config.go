// Package agent is fleetd's on-VM elastic agent, the stand-in for
// torchrun's LocalElasticAgent: it reads the config the bootstrap wrote,
// watches the instance metadata for interruption notices (drain file),
// registers with the daemon, follows the daemon's rendezvous and runs the
// training workers with torchrun's environment contract. See docs/agent.md.
package agent

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"strings"
	"unicode"

	"github.com/fleetd/fleetd/agentwire"
)

// Metadata service kinds.
const (
	MetadataAWSIMDS = "aws-imds"
	MetadataGCE     = "gce"
	MetadataNone    = "none"
)

// Default VM paths, relative to the agent's root.
const (
	DefaultConfigPath = "/etc/fleetd/agent.json"
	DefaultWorkDir    = "/var/lib/fleetd"
	DefaultLogDir     = "/var/log/fleetd"
)

// Environment variables the agent reads; the local provider sets them for
// its nodes (docs/providers/local.md).
const (
	EnvMetadataURL = "FLEETD_METADATA_URL" // overrides metadata.url
	EnvNodeAddr    = "FLEETD_NODE_ADDR"    // the node's private address
)

// maxConfigSize bounds the config file; it arrives through user-data.
const maxConfigSize = 1 << 20

// MetadataConfig says which metadata service carries interruption notices.
type MetadataConfig = agentwire.MetadataConfig

// Config is the agent's configuration (agent.json), written by the
// bootstrap into the VM's user-data: the wire form agentwire declares, with
// the agent's defaults and validation as its methods.
type Config agentwire.AgentConfig

// LoadConfig reads, decodes and validates a config file. Unknown fields are
// errors: a typo in a bootstrap template must not be silently ignored.
func LoadConfig(file string) (Config, error) {
	f, err := os.Open(file)
	if err != nil {
		return Config{}, fmt.Errorf("agent config: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigSize+1))
	if err != nil {
		return Config{}, fmt.Errorf("agent config %s: %w", file, err)
	}
	if len(b) > maxConfigSize {
		return Config{}, fmt.Errorf("agent config %s: larger than %d bytes", file, maxConfigSize)
	}
	cfg, err := ParseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("agent config %s: %w", file, err)
	}
	return cfg, nil
}

// ParseConfig decodes and validates a config document, with defaults applied.
func ParseConfig(b []byte) (Config, error) {
	var cfg Config
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return Config{}, fmt.Errorf("decoding: %w", err)
	}
	if dec.More() {
		return Config{}, errors.New("decoding: trailing data after the JSON object")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// WithDefaults fills the optional fields.
func (c Config) WithDefaults() Config {
	if c.Metadata.Kind == "" {
		c.Metadata.Kind = MetadataNone
	}
	if c.WorkDir == "" {
		c.WorkDir = DefaultWorkDir
	}
	if c.LogDir == "" {
		c.LogDir = DefaultLogDir
	}
	return c
}

// Validate reports every problem of the config at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	checkName := func(field, v string) {
		switch {
		case v == "":
			bad("%s is required", field)
		case len(v) > 128:
			bad("%s is longer than 128 characters", field)
		case strings.ContainsFunc(v, func(r rune) bool { return r == '/' || r == '\\' || unicode.IsSpace(r) || !unicode.IsPrint(r) }):
			bad("%s %q contains a slash, space or control character", field, v)
		}
	}
	checkName("fleet", c.Fleet)
	checkName("node_id", c.NodeID)

	if c.DaemonURL != "" {
		if err := checkHTTPURL(c.DaemonURL); err != nil {
			bad("daemon_url: %v", err)
		}
		for _, u := range c.DaemonURLs {
			if err := checkHTTPURL(u); err != nil {
				bad("daemon_urls: %v", err)
			}
		}
		if c.Token == "" {
			bad("token is required when daemon_url is set")
		}
	}
	if c.CAFingerprint != "" {
		if _, err := ParseFingerprint(c.CAFingerprint); err != nil {
			bad("ca_fingerprint: %v", err)
		}
	}
	switch c.Metadata.Kind {
	case MetadataAWSIMDS, MetadataGCE, MetadataNone:
	case "":
		bad("metadata.kind is required (aws-imds, gce or none)")
	default:
		bad("metadata.kind %q: want aws-imds, gce or none", c.Metadata.Kind)
	}
	if c.Metadata.URL != "" {
		if c.Metadata.Kind == MetadataNone {
			bad("metadata.url is set but metadata.kind is none")
		} else if err := checkHTTPURL(c.Metadata.URL); err != nil {
			bad("metadata.url: %v", err)
		}
	}
	for field, p := range map[string]string{"work_dir": c.WorkDir, "log_dir": c.LogDir} {
		if p != "" && !path.IsAbs(p) {
			bad("%s %q must be an absolute path", field, p)
		}
	}
	return errors.Join(errs...)
}

func checkHTTPURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an absolute http(s) URL", s)
	}
	return nil
}

// ParseFingerprint parses "sha256:<hex>" (or bare hex), hex optionally
// colon-separated as openssl prints it, into the 32-byte digest.
func ParseFingerprint(s string) ([]byte, error) {
	h := strings.TrimPrefix(strings.ToLower(s), "sha256:")
	h = strings.ReplaceAll(h, ":", "")
	b, err := hex.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("%q is not hex", s)
	}
	if len(b) != 32 {
		return nil, fmt.Errorf("%q is %d bytes, want a 32-byte sha256", s, len(b))
	}
	return b, nil
}
