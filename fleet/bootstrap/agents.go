package bootstrap

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// AgentArches are the node architectures fleetd builds an agent for
// (`make release`, `make agents`), as Go names them.
var AgentArches = []string{"amd64", "arm64"}

// AgentFileName is the file the full fleetd for linux/arch is looked up
// by in the agent directories: the name `make release` gives it in dist/.
// It can serve nodes (`fleetd agent`), at ten times the slim agent's size.
func AgentFileName(arch string) string { return "fleetd-linux-" + arch }

// Flavor is which build of the agent a binary is.
type Flavor string

const (
	// FlavorSlim is cmd/fleetd-agent: what nodes run by default.
	FlavorSlim Flavor = "slim"
	// FlavorNode is cmd/fleetd-agent built with -tags nodestore: the slim
	// agent plus the s3 and gcs drivers that checkpoint access = "node"
	// needs.
	FlavorNode Flavor = "node"
	// FlavorFull is the whole fleetd (a file fleetd-linux-ARCH, or the
	// daemon's own executable): the fallback when no agent build is there.
	FlavorFull Flavor = "full"
)

// flavorFiles are the file names per flavor, as `make release` and `make
// agents` name them.
var flavorFiles = []struct {
	flavor Flavor
	name   func(arch string) string
}{
	{FlavorSlim, func(a string) string { return "fleetd-agent-linux-" + a }},
	{FlavorNode, func(a string) string { return "fleetd-agent-node-linux-" + a }},
	{FlavorFull, AgentFileName},
}

// AgentFlavorFileName is the file name of an agent build for linux/arch.
func AgentFlavorFileName(f Flavor, arch string) string {
	for _, ff := range flavorFiles {
		if ff.flavor == f {
			return ff.name(arch)
		}
	}
	return AgentFileName(arch)
}

// NormalizeArch maps an offering's architecture to an agent's: "" (a
// provider that does not say) is amd64.
func NormalizeArch(arch string) string {
	if arch == "" {
		return "amd64"
	}
	return arch
}

// AgentBinary is one agent executable the daemon hands to nodes.
type AgentBinary struct {
	Arch   string `json:"arch"` // GOARCH; the OS is always linux
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Flavor Flavor `json:"flavor"`
	// Self: the daemon's own executable, used for its own platform when
	// no file for it is in the agent directories.
	Self bool `json:"self,omitempty"`
}

// AgentIndex is what agent binaries a daemon has, by architecture and
// flavor.
type AgentIndex struct {
	// Dirs are the directories searched, in order (the first file wins).
	Dirs []string
	// Self is the daemon's executable, when it could count.
	Self     string
	binaries map[string]map[Flavor]AgentBinary
	// Skipped says why files with an agent's name were not taken.
	Skipped []string
}

// Lookup returns the agent a node of linux/arch ("" is amd64) gets by
// default (LookupFor without node stores).
func (x *AgentIndex) Lookup(arch string) (AgentBinary, bool) { return x.LookupFor(arch, false) }

// LookupFor returns the smallest agent for linux/arch that can do the
// job: for a fleet whose nodes open the checkpoint store themselves
// (nodeStores: access = "node") the node-store build, else the slim one;
// each falls back to the bigger builds that can do as much, down to the
// full fleetd, so a daemon without agent builds still serves its nodes.
func (x *AgentIndex) LookupFor(arch string, nodeStores bool) (AgentBinary, bool) {
	if x == nil {
		return AgentBinary{}, false
	}
	order := []Flavor{FlavorSlim, FlavorNode, FlavorFull}
	if nodeStores {
		order = order[1:]
	}
	m := x.binaries[NormalizeArch(arch)]
	for _, f := range order {
		if b, ok := m[f]; ok {
			return b, true
		}
	}
	return AgentBinary{}, false
}

// Binaries lists, by architecture, the agent nodes get by default.
func (x *AgentIndex) Binaries() []AgentBinary {
	if x == nil {
		return nil
	}
	out := make([]AgentBinary, 0, len(x.binaries))
	for arch := range x.binaries {
		if b, ok := x.Lookup(arch); ok {
			out = append(out, b)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Arch < out[j].Arch })
	return out
}

// All lists every binary found, by architecture then flavor.
func (x *AgentIndex) All() []AgentBinary {
	if x == nil {
		return nil
	}
	var out []AgentBinary
	for _, arch := range AgentArches {
		for _, ff := range flavorFiles {
			if b, ok := x.binaries[arch][ff.flavor]; ok {
				out = append(out, b)
			}
		}
	}
	return out
}

// Arches lists the architectures the index serves, sorted.
func (x *AgentIndex) Arches() []string {
	var out []string
	for _, b := range x.Binaries() {
		out = append(out, b.Arch)
	}
	return out
}

// IndexAgents finds the agent binaries in dirs: for each architecture of
// AgentArches and each flavor the first file of its name
// (AgentFlavorFileName) that is a linux ELF executable for that machine
// (debug/elf; a file that is not is skipped and said so in Skipped). The
// executable self, when it is an ELF for an architecture with no full
// fleetd file in the directories, is that architecture's full flavor: a
// daemon built for linux/amd64 serves amd64 nodes without any setup.
// Missing directories are no error; unreadable files are skipped.
func IndexAgents(dirs []string, self string) *AgentIndex {
	x := &AgentIndex{Dirs: dirs, Self: self, binaries: map[string]map[Flavor]AgentBinary{}}
	put := func(b AgentBinary) {
		if x.binaries[b.Arch] == nil {
			x.binaries[b.Arch] = map[Flavor]AgentBinary{}
		}
		x.binaries[b.Arch][b.Flavor] = b
	}
	for _, dir := range dirs {
		if dir == "" {
			continue
		}
		for _, arch := range AgentArches {
			for _, ff := range flavorFiles {
				if _, ok := x.binaries[arch][ff.flavor]; ok {
					continue
				}
				p := filepath.Join(dir, ff.name(arch))
				b, err := inspectAgent(p)
				switch {
				case errors.Is(err, fs.ErrNotExist):
					continue
				case err != nil:
					x.Skipped = append(x.Skipped, fmt.Sprintf("%s: %v", p, err))
				case b.Arch != arch:
					x.Skipped = append(x.Skipped, fmt.Sprintf("%s: built for linux/%s, not linux/%s", p, b.Arch, arch))
				default:
					b.Flavor = ff.flavor
					put(b)
				}
			}
		}
	}
	if self != "" {
		b, err := inspectAgent(self)
		if err == nil {
			if _, ok := x.binaries[b.Arch][FlavorFull]; !ok {
				b.Self, b.Flavor = true, FlavorFull
				put(b)
			}
		}
	}
	return x
}

// elfArches maps ELF machines to Go architectures.
var elfArches = map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}

// inspectAgent checks that path is a 64-bit ELF executable for an
// architecture fleetd knows and returns it with its size and sha256.
func inspectAgent(path string) (AgentBinary, error) {
	f, err := os.Open(path)
	if err != nil {
		return AgentBinary{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return AgentBinary{}, err
	}
	if !st.Mode().IsRegular() {
		return AgentBinary{}, errors.New("not a regular file")
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return AgentBinary{}, fmt.Errorf("not an ELF executable (a Linux build of fleetd): %w", err)
	}
	arch, ok := elfArches[ef.Machine]
	if !ok || ef.Class != elf.ELFCLASS64 || (ef.Type != elf.ET_EXEC && ef.Type != elf.ET_DYN) {
		return AgentBinary{}, fmt.Errorf("ELF %s %s %s is not a linux/amd64 or linux/arm64 executable", ef.Class, ef.Machine, ef.Type)
	}
	sum, err := fileSHA256(f, path, st)
	if err != nil {
		return AgentBinary{}, err
	}
	return AgentBinary{Arch: arch, Path: path, SHA256: sum, Size: st.Size()}, nil
}

// sumCache keeps the sha256 of files by path, size and mtime: a daemon
// (and a test process starting many) hashes a 50 MB binary once.
var sumCache struct {
	sync.Mutex
	m map[sumKey]string
}

type sumKey struct {
	path string
	size int64
	mod  time.Time
}

func fileSHA256(f *os.File, path string, st fs.FileInfo) (string, error) {
	k := sumKey{path, st.Size(), st.ModTime()}
	sumCache.Lock()
	sum, ok := sumCache.m[k]
	sumCache.Unlock()
	if ok {
		return sum, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	sum = hex.EncodeToString(h.Sum(nil))
	sumCache.Lock()
	if sumCache.m == nil {
		sumCache.m = map[sumKey]string{}
	}
	sumCache.m[k] = sum
	sumCache.Unlock()
	return sum, nil
}

// NoAgentError is a node architecture the daemon has no agent binary for.
type NoAgentError struct {
	Arch string
	Dirs []string // where the daemon looked
}

func (e *NoAgentError) Error() string {
	return fmt.Sprintf("no agent binary for linux/%s (looked for %s, %s and %s in %s)", e.Arch,
		AgentFlavorFileName(FlavorSlim, e.Arch), AgentFlavorFileName(FlavorNode, e.Arch), AgentFileName(e.Arch), strings.Join(e.Dirs, ", "))
}

// AgentFix is how to provide the agent for arch.
func AgentFix(arch string, dirs []string) string {
	dir := "agent_dir"
	if len(dirs) > 0 {
		dir = dirs[0]
	}
	return fmt.Sprintf("build it with `make release` (or `make agents`) and copy dist/%s and dist/%s (the slim agents; dist/%s works too, ten times bigger) into %s, or set agent_dir in the daemon config to a directory holding them, then restart the daemon",
		AgentFlavorFileName(FlavorSlim, arch), AgentFlavorFileName(FlavorNode, arch), AgentFileName(arch), dir)
}

// AgentDownload is where a node of arch downloads its agent from the
// daemon at daemonURL and the sha256 its user-data pins; nodeStores asks
// for a build that opens s3/gcs stores itself (LookupFor).
func (x *AgentIndex) AgentDownload(daemonURL, fleet, node, arch string, nodeStores bool) (string, string, error) {
	arch = NormalizeArch(arch)
	b, ok := x.LookupFor(arch, nodeStores)
	if !ok {
		var dirs []string
		if x != nil {
			dirs = x.Dirs
		}
		return "", "", &NoAgentError{Arch: arch, Dirs: dirs}
	}
	q := url.Values{"fleet": {fleet}, "node": {node}, "arch": {arch}}
	if nodeStores {
		q.Set("flavor", string(FlavorNode))
	}
	return daemonURL + "/v1/agent/binary?" + q.Encode(), b.SHA256, nil
}

// StubELF returns a header-only linux ELF executable for arch ("amd64",
// "arm64") that IndexAgents accepts but that runs nowhere: for tests, and
// to try a fleet's arch handling without cross-building.
func StubELF(arch string) []byte {
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	b := make([]byte, 64)
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS], b[elf.EI_DATA], b[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	le := binary.LittleEndian
	le.PutUint16(b[16:], uint16(elf.ET_EXEC))
	le.PutUint16(b[18:], uint16(machine))
	le.PutUint32(b[20:], uint32(elf.EV_CURRENT))
	le.PutUint16(b[52:], 64) // e_ehsize
	le.PutUint16(b[54:], 56) // e_phentsize
	le.PutUint16(b[58:], 64) // e_shentsize
	return b
}
