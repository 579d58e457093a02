package local

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// AgentConfigPath is where, inside the node, the agent config lives; the
// node boots `fleetd agent -config` on it. The local image ships a default
// one; a bootstrap's write_files entry for this path replaces it.
const AgentConfigPath = "/etc/fleetd/agent.json"

// MaxUserData is the largest user-data accepted: EC2's limit (16 KiB), the
// strictest of the clouds, so a bootstrap that fits here fits everywhere.
const MaxUserData = 16 << 10

// maxWriteFile bounds one decoded write_files entry (gzip can expand).
const maxWriteFile = 4 << 20

// cloudConfig is the part of a #cloud-config document a local node honours.
type cloudConfig struct {
	WriteFiles []writeFile `yaml:"write_files"`
	// RunCmd is parsed for validation only: the local node starts the
	// agent by the contract in docs/providers/local.md instead of running
	// shell commands on the host.
	RunCmd []yaml.Node `yaml:"runcmd"`
}

type writeFile struct {
	Path        string `yaml:"path"`
	Content     string `yaml:"content"`
	Encoding    string `yaml:"encoding"`
	Permissions string `yaml:"permissions"`
	Owner       string `yaml:"owner"` // accepted, not applied: nodes run as the daemon's user
	Append      bool   `yaml:"append"`
	Defer       bool   `yaml:"defer"` // accepted; every file is written before the agent starts
}

// parseCloudConfig parses user-data. Only #cloud-config documents are
// supported (no shell scripts, no MIME multipart).
func parseCloudConfig(userData []byte) (cloudConfig, error) {
	if len(userData) > MaxUserData {
		return cloudConfig{}, fmt.Errorf("user-data is %d bytes, more than the %d allowed", len(userData), MaxUserData)
	}
	first, _, _ := bytes.Cut(userData, []byte("\n"))
	if strings.TrimRight(string(first), " \r\t") != "#cloud-config" {
		return cloudConfig{}, errors.New(`user-data must start with a "#cloud-config" line`)
	}
	var cc cloudConfig
	dec := yaml.NewDecoder(bytes.NewReader(userData))
	dec.KnownFields(false) // other modules (packages, users, ...) are cloud-init's business
	if err := dec.Decode(&cc); err != nil && !errors.Is(err, io.EOF) {
		return cloudConfig{}, fmt.Errorf("user-data: %w", err)
	}
	for i, f := range cc.WriteFiles {
		if _, err := f.target(); err != nil {
			return cloudConfig{}, fmt.Errorf("write_files[%d]: %w", i, err)
		}
		if _, err := f.mode(); err != nil {
			return cloudConfig{}, fmt.Errorf("write_files[%d] %s: %w", i, f.Path, err)
		}
		if _, err := f.decode(); err != nil {
			return cloudConfig{}, fmt.Errorf("write_files[%d] %s: %w", i, f.Path, err)
		}
	}
	return cc, nil
}

// target is the path relative to the node root. Only absolute paths are
// valid in cloud-init; ".." cannot climb above the root.
func (f writeFile) target() (string, error) {
	if !strings.HasPrefix(f.Path, "/") {
		return "", fmt.Errorf("path %q must be absolute", f.Path)
	}
	rel := strings.TrimPrefix(path.Clean(f.Path), "/")
	if rel == "" {
		return "", fmt.Errorf("path %q names the root directory", f.Path)
	}
	return rel, nil
}

// mode parses permissions: an octal string such as '0644' (cloud-init's
// form); YAML may also deliver an unquoted 0644 as the same text.
func (f writeFile) mode() (fs.FileMode, error) {
	if f.Permissions == "" {
		return 0o644, nil
	}
	p := strings.TrimPrefix(strings.TrimPrefix(f.Permissions, "0o"), "0O")
	m, err := strconv.ParseUint(p, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("permissions %q: want an octal mode like '0644'", f.Permissions)
	}
	return fs.FileMode(m).Perm() | modeBits(m), nil
}

func modeBits(m uint64) fs.FileMode {
	var b fs.FileMode
	if m&0o4000 != 0 {
		b |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		b |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		b |= fs.ModeSticky
	}
	return b
}

// decode returns the file content per its encoding (cloud-init's names).
func (f writeFile) decode() ([]byte, error) {
	enc := strings.ToLower(strings.TrimSpace(f.Encoding))
	var gz, b64 bool
	switch enc {
	case "", "text/plain":
	case "b64", "base64":
		b64 = true
	case "gz", "gzip":
		gz = true
	case "gz+b64", "gz+base64", "gzip+b64", "gzip+base64":
		gz, b64 = true, true
	default:
		return nil, fmt.Errorf("unknown encoding %q (want text/plain, b64, gz or gz+b64)", f.Encoding)
	}
	data := []byte(f.Content)
	if b64 {
		d, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(f.Content), ""))
		if err != nil {
			return nil, fmt.Errorf("base64 content: %w", err)
		}
		data = d
	}
	if gz {
		r, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("gzip content: %w", err)
		}
		d, err := io.ReadAll(io.LimitReader(r, maxWriteFile+1))
		if err != nil {
			return nil, fmt.Errorf("gzip content: %w", err)
		}
		if len(d) > maxWriteFile {
			return nil, fmt.Errorf("gzip content larger than %d bytes", maxWriteFile)
		}
		data = d
	}
	return data, nil
}

// writeFiles applies write_files under root, the way cloud-init does on a
// VM: parents created, permissions set (umask not applied), append honoured.
// os.Root guarantees nothing is written outside the node's directory.
func (cc cloudConfig) writeFiles(root string) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	for _, f := range cc.WriteFiles {
		rel, _ := f.target()
		mode, _ := f.mode()
		data, _ := f.decode() // all validated by parseCloudConfig
		if dir := path.Dir(rel); dir != "." {
			if err := r.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("write_files %s: %w", f.Path, err)
			}
		}
		flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
		if f.Append {
			flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
		}
		fh, err := r.OpenFile(rel, flags, mode)
		if err != nil {
			return fmt.Errorf("write_files %s: %w", f.Path, err)
		}
		_, werr := fh.Write(data)
		cerr := fh.Close()
		if err := errors.Join(werr, cerr); err != nil {
			return fmt.Errorf("write_files %s: %w", f.Path, err)
		}
		if err := r.Chmod(rel, mode); err != nil {
			return fmt.Errorf("write_files %s: %w", f.Path, err)
		}
	}
	return nil
}
