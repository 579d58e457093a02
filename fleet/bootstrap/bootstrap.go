// Package bootstrap renders the #cloud-config user-data a node boots from:
// the agent's config (daemon URL, CA fingerprint, per-node token), the agent
// binary (downloaded from the daemon and sha256-checked), a systemd unit and
// the spec's extra setup. Real VMs run it through cloud-init; the local
// provider boots its nodes from the same document.
package bootstrap

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/fleetd/fleetd/agentwire"
	"gopkg.in/yaml.v3"
)

// Well-known paths on a node. The local provider re-roots them under the
// node's directory.
const (
	AgentConfigPath = "/etc/fleetd/agent.json"
	CACertPath      = "/etc/fleetd/ca.pem"
	SetupPath       = "/etc/fleetd/setup.sh"
	AgentBinaryPath = "/usr/local/bin/fleetd-agent"
	UnitPath        = "/etc/systemd/system/fleetd-agent.service"
)

// AgentConfig is the JSON the agent reads (agent.Config's wire form),
// from agentwire so fleet/ does not depend on agent/.
type AgentConfig = agentwire.AgentConfig

// MetadataConfig names the node's metadata service.
type MetadataConfig = agentwire.MetadataConfig

// Input is everything one node's user-data depends on.
type Input struct {
	Agent AgentConfig
	// CACertPEM is the daemon CA certificate (public); written so the
	// download of the agent binary can verify TLS.
	CACertPEM []byte
	// AgentURL and AgentSHA256 locate the agent binary; the download is
	// refused if the checksum differs.
	AgentURL    string
	AgentSHA256 string
	// Setup are the spec's extra shell commands, run before the agent starts.
	Setup []string
	// Env is written to the agent unit's environment (not secrets).
	Env map[string]string
	// Mounts are the data file systems (MountsFor), mounted before the
	// setup commands run.
	Mounts []Mount
}

// NewToken returns a fresh per-node token and the hash the daemon stores.
func NewToken() (token, hash string) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	token = "fleetd_node_" + hex.EncodeToString(b)
	return token, HashToken(token)
}

// HashToken is how node tokens are stored: the daemon never keeps the token.
func HashToken(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

type writeFile struct {
	Path        string `yaml:"path"`
	Permissions string `yaml:"permissions"`
	Owner       string `yaml:"owner,omitempty"`
	Encoding    string `yaml:"encoding,omitempty"`
	Content     string `yaml:"content"`
}

type cloudConfig struct {
	WriteFiles []writeFile `yaml:"write_files"`
	RunCmd     [][]string  `yaml:"runcmd"`
	// Mounts are fstab entries (cloud-init's mounts module).
	Mounts [][]string `yaml:"mounts,omitempty"`
}

// Render returns the #cloud-config document for one node.
func Render(in Input) (string, error) {
	a := in.Agent
	if a.Fleet == "" || a.NodeID == "" {
		return "", errors.New("bootstrap: fleet and node id are required")
	}
	if a.DaemonURL != "" && a.Token == "" {
		return "", errors.New("bootstrap: a daemon URL needs a node token")
	}
	if in.AgentURL != "" && !isSHA256Hex(in.AgentSHA256) {
		// It is spliced into a shell line: hex only, or it could run commands.
		return "", errors.New("bootstrap: the agent download needs its sha256 (64 lowercase hex digits)")
	}
	if strings.ContainsFunc(a.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		// It becomes an HTTP header on the curl command line.
		return "", errors.New("bootstrap: the node token contains spaces or control characters")
	}
	if a.Metadata.Kind == "" {
		a.Metadata.Kind = "none"
	}
	cfg, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return "", err
	}
	files := []writeFile{{Path: AgentConfigPath, Permissions: "0600", Owner: "root:root", Content: string(cfg) + "\n"}}
	if len(in.CACertPEM) > 0 {
		files = append(files, writeFile{Path: CACertPath, Permissions: "0644", Owner: "root:root", Content: string(in.CACertPEM)})
	}
	var setup strings.Builder
	setup.WriteString("#!/bin/sh\n# Extra setup from the fleet spec, run once before the agent starts.\nset -eu\n")
	for _, c := range in.Setup {
		setup.WriteString(c + "\n")
	}
	files = append(files, writeFile{Path: SetupPath, Permissions: "0755", Owner: "root:root", Content: setup.String()})
	files = append(files, writeFile{Path: UnitPath, Permissions: "0644", Owner: "root:root", Content: unit(in.Env)})

	var run [][]string
	if in.AgentURL != "" {
		// --compressed: the daemon serves a gzip copy, about 40% of the
		// binary; curl decompresses before the sha256 check.
		curl := []string{"curl", "-fsSL", "--compressed", "--retry", "10", "--retry-connrefused", "-H", "Authorization: Bearer " + a.Token, "-o", AgentBinaryPath + ".download"}
		if len(in.CACertPEM) > 0 {
			curl = append(curl, "--cacert", CACertPath)
		}
		curl = append(curl, in.AgentURL)
		run = append(run,
			curl,
			// The binary runs as root: refuse it unless it is exactly the daemon's build.
			[]string{"sh", "-c", fmt.Sprintf("echo '%s  %s.download' | sha256sum -c - && chmod 0755 %s.download && mv %s.download %s",
				in.AgentSHA256, AgentBinaryPath, AgentBinaryPath, AgentBinaryPath, AgentBinaryPath)},
		)
	}
	if len(in.Mounts) > 0 {
		files = append(files, writeFile{Path: MountsPath, Permissions: "0755", Owner: "root:root", Content: mountsScript(in.Mounts)})
		run = append(run, []string{MountsPath})
	}
	run = append(run,
		[]string{SetupPath},
		[]string{"systemctl", "daemon-reload"},
		[]string{"systemctl", "enable", "--now", "fleetd-agent.service"},
	)
	out, err := yaml.Marshal(cloudConfig{WriteFiles: files, RunCmd: run, Mounts: fstab(in.Mounts)})
	if err != nil {
		return "", err
	}
	return "#cloud-config\n" + string(out), nil
}

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func unit(env map[string]string) string {
	var b strings.Builder
	b.WriteString(`[Unit]
Description=fleetd elastic agent
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=` + AgentBinaryPath + ` agent -config ` + AgentConfigPath + `
Restart=always
RestartSec=2
# Workers are in their own process groups; the agent stops them itself on drain.
KillMode=mixed
TimeoutStopSec=120
`)
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "Environment=%q\n", k+"="+env[k])
	}
	b.WriteString("\n[Install]\nWantedBy=multi-user.target\n")
	return b.String()
}

// ParsedFile is one write_files entry of a rendered document.
type ParsedFile struct {
	Path        string
	Permissions string
	Content     []byte
}

// AgentConfigFrom extracts the agent config from a rendered document; used by
// tests and by tools that inspect user-data.
func AgentConfigFrom(userData string) (AgentConfig, error) {
	var cc cloudConfig
	if !strings.HasPrefix(userData, "#cloud-config") {
		return AgentConfig{}, errors.New("user-data is not a #cloud-config document")
	}
	if err := yaml.Unmarshal([]byte(userData), &cc); err != nil {
		return AgentConfig{}, fmt.Errorf("user-data: %w", err)
	}
	for _, f := range cc.WriteFiles {
		if f.Path == AgentConfigPath {
			var a AgentConfig
			if err := json.Unmarshal([]byte(f.Content), &a); err != nil {
				return AgentConfig{}, fmt.Errorf("agent config in user-data: %w", err)
			}
			return a, nil
		}
	}
	return AgentConfig{}, errors.New("user-data has no agent config")
}
