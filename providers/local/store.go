package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/providers"
)

// record is one instance as the provider persists it, in
// <state>/instances/<id>/instance.json (0600: it holds the node's control
// secret). The provider writes it; the node supervisor only reads it.
type record struct {
	ID          string             `json:"id"`
	TokenHash   string             `json:"token_sha256,omitempty"` // the launch's idempotency token, hashed
	Fleet       string             `json:"fleet"`
	Offering    providers.Offering `json:"offering"`
	Address     string             `json:"address"`
	MetadataURL string             `json:"metadata_url"`
	Tags        map[string]string  `json:"tags"`
	LaunchedAt  time.Time          `json:"launched_at"`
	// PID is the node supervisor, leader of the node's session; PIDStart is
	// its /proc start time, so a reused pid is never mistaken for it.
	PID         int           `json:"pid"`
	PIDStart    uint64        `json:"pid_start"`
	Secret      string        `json:"secret"`
	AgentBinary string        `json:"agent_binary"`
	StopGrace   time.Duration `json:"stop_grace"`

	Deleted      bool                        `json:"deleted,omitempty"`
	DeletedAt    time.Time                   `json:"deleted_at,omitzero"`
	TerminatedAt time.Time                   `json:"terminated_at,omitzero"`
	Interruption *providers.InterruptionInfo `json:"interruption,omitempty"`
}

// status is written by the node supervisor to <dir>/status.json.
type status struct {
	AgentPID   int                         `json:"agent_pid,omitempty"`
	AgentStart uint64                      `json:"agent_start,omitempty"`
	Notice     *providers.InterruptionInfo `json:"notice,omitempty"`
	Exited     bool                        `json:"exited,omitempty"`
	ExitedAt   time.Time                   `json:"exited_at,omitzero"`
	ExitReason string                      `json:"exit_reason,omitempty"`
	// Reclaimed: the node was stopped by its notice's deadline (or an
	// injected loss), not by Delete.
	Reclaimed bool `json:"reclaimed,omitempty"`
}

// tokenFile maps an idempotency token to the instances it launched.
type tokenFile struct {
	Offering  string    `json:"offering"`
	Count     int       `json:"count"`
	Instances []string  `json:"instances"`
	CreatedAt time.Time `json:"created_at"`
}

// store is the on-disk layout under one state dir:
//
//	.lock                     flock serialising writers across processes
//	tokens/<sha256>.json      idempotency token -> instance ids
//	instances/<id>/           one per instance ("the hypervisor's view")
//	  instance.json           record (provider-owned)
//	  status.json             supervisor-owned runtime status
//	  user-data               as launched, served by the metadata emulator
//	  console.log             supervisor output; agent.console.log: the agent's
//	  root/                   the node's filesystem (write_files land here)
type store struct{ dir string }

func (s store) instancesDir() string         { return filepath.Join(s.dir, "instances") }
func (s store) instanceDir(id string) string { return filepath.Join(s.instancesDir(), id) }
func (s store) tokensDir() string            { return filepath.Join(s.dir, "tokens") }

func tokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

func (s store) tokenPath(token string) string {
	return filepath.Join(s.tokensDir(), tokenHash(token)+".json")
}

func (s store) init() error {
	for _, d := range []string{s.instancesDir(), s.tokensDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("local provider state: %w", err)
		}
	}
	return nil
}

// lock takes the state dir's exclusive flock, polling so ctx is honoured.
// flock excludes separate open files even within one process, so this also
// serialises goroutines.
func (s store) lock(ctx context.Context) (unlock func(), err error) {
	if err := s.init(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(s.dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("local provider lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("local provider lock: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (s store) load(id string) (record, error) {
	var r record
	if !validID(id) {
		return r, providers.NotFound(fmt.Errorf("instance %q", id))
	}
	b, err := os.ReadFile(filepath.Join(s.instanceDir(id), "instance.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return r, providers.NotFound(fmt.Errorf("instance %q", id))
	}
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("instance %s record: %w", id, err)
	}
	return r, nil
}

func (s store) save(r record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(s.instanceDir(r.ID), "instance.json"), b, 0o600)
}

// all loads every record, sorted by launch time then id.
func (s store) all() ([]record, error) {
	ents, err := os.ReadDir(s.instancesDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []record
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		r, err := s.load(e.Name())
		if providers.IsNotFound(err) {
			continue // a launch in progress or a half-removed dir
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].LaunchedAt.Equal(out[j].LaunchedAt) {
			return out[i].LaunchedAt.Before(out[j].LaunchedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

func (s store) readStatus(id string) status {
	var st status
	if b, err := os.ReadFile(filepath.Join(s.instanceDir(id), "status.json")); err == nil {
		_ = json.Unmarshal(b, &st) // a missing or torn status means "nothing reported yet"
	}
	return st
}

func (s store) writeStatus(id string, st status) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(s.instanceDir(id), "status.json"), b, 0o644)
}

func (s store) loadToken(token string) (tokenFile, bool, error) {
	var t tokenFile
	b, err := os.ReadFile(s.tokenPath(token))
	if errors.Is(err, fs.ErrNotExist) {
		return t, false, nil
	}
	if err != nil {
		return t, false, err
	}
	if err := json.Unmarshal(b, &t); err != nil {
		return t, false, fmt.Errorf("token record: %w", err)
	}
	return t, true, nil
}

func (s store) saveToken(token string, t tokenFile) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return writeFileAtomic(s.tokenPath(token), b, 0o600)
}

// gc removes instances terminated longer than retention ago, with their
// token files. The instances of one token go together, and only when all
// are expired: an id in a token file without a record then always means
// "never started" (Create resumes it), never "forgotten". Called with the
// lock held.
func (s store) gc(now time.Time, retention time.Duration) {
	recs, err := s.all()
	if err != nil {
		return
	}
	expired := func(r record) bool { return !r.TerminatedAt.IsZero() && now.Sub(r.TerminatedAt) > retention }
	keep := map[string]bool{} // token hashes with an unexpired instance
	for _, r := range recs {
		if r.TokenHash != "" && !expired(r) {
			keep[r.TokenHash] = true
		}
	}
	for _, r := range recs {
		if expired(r) && !keep[r.TokenHash] {
			_ = os.RemoveAll(s.instanceDir(r.ID))
		}
	}
	ents, err := os.ReadDir(s.tokensDir())
	if err != nil {
		return
	}
	for _, e := range ents {
		hash, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || keep[hash] {
			continue
		}
		if info, err := e.Info(); err == nil && now.Sub(info.ModTime()) > retention {
			_ = os.Remove(filepath.Join(s.tokensDir(), e.Name()))
		}
	}
}

// writeFileAtomic replaces file so readers in other processes never see a
// partial write.
func writeFileAtomic(file string, data []byte, perm fs.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	cherr := tmp.Chmod(perm)
	cerr := tmp.Close()
	if err := errors.Join(werr, cherr, cerr); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), file)
}

// validID guards paths built from caller-supplied ids.
func validID(id string) bool {
	if len(id) < 3 || len(id) > 64 || id[:2] != "i-" {
		return false
	}
	for _, c := range id[2:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
