// Package ckpt is the agent's checkpoint store: it notices complete
// checkpoints the workers write into the checkpoint dir, uploads them to an
// object store (gocloud.dev/blob: s3, gcs, file; directly with the node's
// credentials or through short-lived URLs the daemon signs), records one
// as the latest only when every file is in, prunes beyond keep, and on a
// new node restores the latest complete one before the workers start.
// The s3 and gcs drivers for access = "node" are linked by
// agent/ckpt/nodestores, which the slim agent leaves out. See
// docs/checkpoints.md.
//
// Local layout (what workers write):
//
//	<dir>/step-<N>/...         one checkpoint; complete once <dir>/step-<N>/COMPLETE exists
//	<dir>/.<anything>          ignored (temporary directories of atomic renames, restores)
//
// Store layout (under the store's prefix):
//
//	data/step-<N>/<path>       the files of step N, one object each
//	manifests/step-<N>.json    written last: path, size and sha256 of every file
//
// A checkpoint is in the store only once its manifest is: an upload cut
// short (agent killed, store failing) leaves data objects without a
// manifest, which no restore reads and a later upload resumes.
package ckpt

import (
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// CompleteMarker is the file whose presence makes a local step-N
// directory a complete checkpoint. The workers write it last (after
// every other file of the step is closed), or build the directory under a
// dot-name and rename it to step-N with the marker already inside.
const CompleteMarker = "COMPLETE"

// ManifestFormat identifies the manifest's schema.
const ManifestFormat = "fleetd-checkpoint/1"

// Store key prefixes.
const (
	DataPrefix     = "data/"
	ManifestPrefix = "manifests/"
)

// StepName is the directory (and store) name of step n.
func StepName(step int64) string { return "step-" + strconv.FormatInt(step, 10) }

// DataKey is the store key of a file of a step.
func DataKey(step int64, rel string) string { return DataPrefix + StepName(step) + "/" + rel }

// ManifestKey is the store key of a step's manifest.
func ManifestKey(step int64) string { return ManifestPrefix + StepName(step) + ".json" }

var (
	stepDirRE      = regexp.MustCompile(`^step-(\d{1,18})$`)
	manifestKeyRE  = regexp.MustCompile(`^manifests/step-(\d{1,18})\.json$`)
	dataStepPrefRE = regexp.MustCompile(`^data/step-(\d{1,18})/`)
)

// ParseStepName returns N of "step-N".
func ParseStepName(name string) (int64, bool) { return stepIn(stepDirRE, name) }

// ManifestStep returns the step of a manifest key.
func ManifestStep(key string) (int64, bool) { return stepIn(manifestKeyRE, key) }

// DataStep returns the step a data key belongs to.
func DataStep(key string) (int64, bool) { return stepIn(dataStepPrefRE, key) }

// stepIn returns the step number re captures (its first group) in s.
func stepIn(re *regexp.Regexp, s string) (int64, bool) {
	m := re.FindStringSubmatch(s)
	if m == nil {
		return 0, false
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	return n, err == nil
}

// FileEntry is one file of a checkpoint.
type FileEntry struct {
	Path   string `json:"path"` // slash-separated, relative to step-N/
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // hex
}

// Manifest lists a complete checkpoint's files; its presence in the store
// is what makes the checkpoint complete there.
type Manifest struct {
	Format    string      `json:"format"`
	Step      int64       `json:"step"`
	Fleet     string      `json:"fleet,omitempty"`
	Node      string      `json:"node,omitempty"`
	CreatedAt time.Time   `json:"created_at"`
	Bytes     int64       `json:"bytes"`
	Files     []FileEntry `json:"files"`
}

// maxManifestSize bounds a manifest read from the store.
const maxManifestSize = 64 << 20

// ParseManifest decodes and checks a manifest read for step.
func ParseManifest(b []byte, step int64) (Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("manifest of %s: %w", StepName(step), err)
	}
	if m.Format != ManifestFormat {
		return Manifest{}, fmt.Errorf("manifest of %s has format %q, want %q", StepName(step), m.Format, ManifestFormat)
	}
	if m.Step != step {
		return Manifest{}, fmt.Errorf("manifest of %s names step %d", StepName(step), m.Step)
	}
	var total int64
	for _, f := range m.Files {
		if err := checkRel(f.Path); err != nil {
			return Manifest{}, fmt.Errorf("manifest of %s: %w", StepName(step), err)
		}
		if f.Size < 0 || len(f.SHA256) != 64 {
			return Manifest{}, fmt.Errorf("manifest of %s: file %q has a bad size or sha256", StepName(step), f.Path)
		}
		total += f.Size
	}
	if total != m.Bytes {
		return Manifest{}, fmt.Errorf("manifest of %s: files add up to %d bytes, the manifest says %d", StepName(step), total, m.Bytes)
	}
	return m, nil
}

// checkRel refuses paths that would leave the step directory.
func checkRel(rel string) error {
	if rel == "" || strings.HasPrefix(rel, "/") || path.Clean(rel) != rel || rel == ".." || strings.HasPrefix(rel, "../") || strings.ContainsRune(rel, '\\') {
		return fmt.Errorf("file path %q is not a clean relative path", rel)
	}
	return nil
}

// LocalStep is a complete checkpoint in the local dir.
type LocalStep struct {
	Step int64
	Dir  string // absolute
}

// LocalSteps lists the complete checkpoints in dir, newest first. A
// missing dir has none.
func LocalSteps(dir string) ([]LocalStep, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []LocalStep
	for _, e := range ents {
		n, ok := ParseStepName(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		d := filepath.Join(dir, e.Name())
		if _, err := os.Stat(filepath.Join(d, CompleteMarker)); err != nil {
			continue // still being written
		}
		out = append(out, LocalStep{Step: n, Dir: d})
	}
	slices.SortFunc(out, func(a, b LocalStep) int { return cmpDesc(a.Step, b.Step) })
	return out, nil
}

func cmpDesc(a, b int64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// localFile is a file of a local checkpoint, with its digests once hashed.
type localFile struct {
	rel     string
	abs     string
	size    int64
	modNano int64
	sha256  string
	md5     []byte
}

// walkStep lists the regular files of a step directory, sorted by path.
// Symlinks and other special files are refused: a restore could not
// reproduce them.
func walkStep(dir string) ([]localFile, error) {
	var out []localFile
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file (symlinks and devices cannot be restored)", p)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		out = append(out, localFile{rel: filepath.ToSlash(rel), abs: p, size: info.Size(), modNano: info.ModTime().UnixNano()})
		return nil
	})
	slices.SortFunc(out, func(a, b localFile) int { return strings.Compare(a.rel, b.rel) })
	return out, err
}

// hashFile returns the sha256 (hex) and md5 of a file's content.
func hashFile(p string) (string, []byte, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", nil, 0, err
	}
	defer f.Close()
	s, m := sha256.New(), md5.New()
	n, err := io.Copy(io.MultiWriter(s, m), f)
	if err != nil {
		return "", nil, 0, err
	}
	return hex.EncodeToString(s.Sum(nil)), m.Sum(nil), n, nil
}

func md5Sum(b []byte) []byte {
	s := md5.Sum(b)
	return s[:]
}
