package ckpt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleetd/agentwire"
)

// Config configures a Manager.
type Config struct {
	// Dir is the local checkpoint directory (absolute).
	Dir string
	// Keep is how many complete checkpoints the store and Dir keep (≥ 1).
	Keep int
	// Fleet and Node go into manifests.
	Fleet, Node string
	// StateDir holds the upload journal that makes an upload resumable
	// after an agent restart (the agent's work dir).
	StateDir string
	// Parallel is how many files move at once; default 4.
	Parallel int
	// Poll is how often Dir is scanned for a new complete checkpoint;
	// default 1s.
	Poll time.Duration
	// RetryMin and RetryMax bound the backoff after a failed upload;
	// defaults 2s and 1m.
	RetryMin, RetryMax time.Duration
	// Log receives progress; default discards.
	Log *slog.Logger
	// OnEvent receives every event (uploaded, failures, restores); it
	// must not block for long.
	OnEvent func(Event)
}

// Event kinds.
const (
	EventUploaded      = "uploaded"
	EventUploadFailed  = "upload-failed"
	EventRestored      = "restored"
	EventRestoreFailed = "restore-failed"
	EventCorrupt       = "corrupt"
	EventPruned        = "pruned"
)

// Event is something the daemon should hear about (an event in its log,
// an alert while the last upload failed).
type Event = agentwire.CheckpointEvent

// Transfer is an upload or restore in progress.
type Transfer = agentwire.CheckpointTransfer

// Status is the manager's state, reported to the daemon.
type Status = agentwire.CheckpointNodeStatus

// Manager uploads, prunes and restores one job's checkpoints on a node.
type Manager struct {
	cfg   Config
	store Store // nil: no store, local pruning only

	mu sync.Mutex
	st Status
	// upMu serialises uploads (Run's and Sync's).
	upMu sync.Mutex
	// version counts status changes (the reporter sends on change).
	version atomic.Int64
}

// New returns a manager; store may be nil (checkpoints stay local).
func New(cfg Config, store Store) *Manager {
	if cfg.Keep < 1 {
		cfg.Keep = 1
	}
	if cfg.Parallel < 1 {
		cfg.Parallel = 4
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 2 * time.Second
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(time.Minute, cfg.RetryMin)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{cfg: cfg, store: store}
	m.st = Status{Dir: cfg.Dir, LastStep: -1, LocalStep: -1, RestoredStep: -1}
	if store != nil {
		m.st.Store = store.String()
	}
	return m
}

// Status returns a snapshot and its version (bumped on every change).
func (m *Manager) Status() (Status, int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.st
	if s.Uploading != nil {
		u := *s.Uploading
		s.Uploading = &u
	}
	if s.Restoring != nil {
		r := *s.Restoring
		s.Restoring = &r
	}
	return s, m.version.Load()
}

func (m *Manager) update(f func(*Status)) {
	m.mu.Lock()
	f(&m.st)
	m.mu.Unlock()
	m.version.Add(1)
}

func (m *Manager) emit(e Event) {
	e.At = time.Now().UTC()
	if m.cfg.OnEvent != nil {
		m.cfg.OnEvent(e)
	}
}

func (m *Manager) fail(kind string, step int64, err error) {
	ek := ErrorKind(err)
	m.update(func(s *Status) {
		s.Error, s.ErrorKind, s.ErrorAt = err.Error(), ek, time.Now().UTC()
		if kind == EventUploadFailed {
			s.Failures++
		}
	})
	m.emit(Event{Kind: kind, Step: step, ErrorKind: ek, Detail: err.Error()})
}

// storeSteps lists the steps whose manifest is in the store, newest first.
func (m *Manager) storeSteps(ctx context.Context) ([]int64, error) {
	objs, err := m.store.List(ctx, ManifestPrefix)
	if err != nil {
		return nil, err
	}
	var steps []int64
	for _, o := range objs {
		if n, ok := ManifestStep(o.Key); ok {
			steps = append(steps, n)
		}
	}
	slices.SortFunc(steps, cmpDesc)
	return steps, nil
}

// Run uploads every new complete checkpoint until ctx ends, pruning the
// store and Dir beyond Keep. Failures are reported (status, events) and
// retried with backoff; nothing local is deleted that is not in the store.
func (m *Manager) Run(ctx context.Context) error {
	known := false // the store's latest step is known
	delay := m.cfg.RetryMin
	var failedStep int64 = -1
	var retryAt time.Time
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		t.Reset(m.cfg.Poll)
		local, err := LocalSteps(m.cfg.Dir)
		if err != nil {
			m.cfg.Log.Warn("scanning the checkpoint dir failed", "dir", m.cfg.Dir, "err", err)
			continue
		}
		newest := int64(-1)
		if len(local) > 0 {
			newest = local[0].Step
		}
		if st, _ := m.Status(); st.LocalStep != newest {
			m.update(func(s *Status) { s.LocalStep = newest })
		}
		if m.store == nil {
			m.pruneLocal(local, newest)
			continue
		}
		if time.Now().Before(retryAt) {
			continue
		}
		if !known {
			steps, err := m.storeSteps(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				m.fail(EventUploadFailed, newest, fmt.Errorf("reading the store's checkpoints: %w", err))
				retryAt, delay = time.Now().Add(delay), min(2*delay, m.cfg.RetryMax)
				continue
			}
			known = true
			if len(steps) > 0 {
				m.update(func(s *Status) { s.LastStep = steps[0] })
			}
		}
		st, _ := m.Status()
		if newest > st.LastStep {
			err := m.Upload(ctx, local[0])
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				if failedStep != newest {
					delay = m.cfg.RetryMin
				}
				failedStep = newest
				m.cfg.Log.Warn("checkpoint upload failed; retrying, training goes on", "step", newest, "retry_in", delay.String(), "err", err)
				m.fail(EventUploadFailed, newest, err)
				retryAt, delay = time.Now().Add(delay), min(2*delay, m.cfg.RetryMax)
				continue
			}
			failedStep, delay = -1, m.cfg.RetryMin
			if err := m.Prune(ctx); err != nil && ctx.Err() == nil {
				m.cfg.Log.Warn("pruning checkpoints failed", "err", err)
			}
			st, _ = m.Status()
		}
		m.pruneLocal(local, st.LastStep)
	}
}

// pruneLocal removes complete local checkpoints beyond Keep that are no
// newer than inStore (the store's latest, or every one without a store).
func (m *Manager) pruneLocal(local []LocalStep, inStore int64) {
	for i, l := range local {
		if i < m.cfg.Keep || l.Step > inStore {
			continue
		}
		if err := os.RemoveAll(l.Dir); err != nil {
			m.cfg.Log.Warn("removing an old local checkpoint failed", "dir", l.Dir, "err", err)
			continue
		}
		m.cfg.Log.Info("removed old local checkpoint", "step", l.Step, "dir", l.Dir)
	}
}

// journal records what an interrupted upload already put in the store.
type journal struct {
	Store string                  `json:"store"`
	Step  int64                   `json:"step"`
	Files map[string]journalEntry `json:"files"`
}

type journalEntry struct {
	Size     int64  `json:"size"`
	ModNano  int64  `json:"mod_ns"`
	SHA256   string `json:"sha256"`
	MD5      string `json:"md5"`
	Uploaded bool   `json:"uploaded"`
}

// JournalFile is the upload journal's name in Config.StateDir.
const JournalFile = "checkpoint-upload.json"

func (m *Manager) journalPath() string {
	if m.cfg.StateDir == "" {
		return ""
	}
	return filepath.Join(m.cfg.StateDir, JournalFile)
}

func (m *Manager) loadJournal(step int64) *journal {
	j := &journal{Store: m.store.String(), Step: step, Files: map[string]journalEntry{}}
	p := m.journalPath()
	if p == "" {
		return j
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return j
	}
	var old journal
	if json.Unmarshal(b, &old) != nil || old.Store != j.Store || old.Step != step || old.Files == nil {
		return j
	}
	return &old
}

func (m *Manager) saveJournal(j *journal) error {
	p := m.journalPath()
	if p == "" {
		return nil
	}
	b, err := json.Marshal(j)
	if err != nil {
		return err
	}
	return WriteFileAtomic(p, b, 0o600) // CreateTemp's mode, as before
}

// CountingReader adds the bytes read from r to n (a transfer's progress;
// agent/stage.go counts staged data with it).
func CountingReader(r io.Reader, n *atomic.Int64) io.Reader { return progressReader{r, n} }

// progressReader counts bytes into a transfer's progress.
type progressReader struct {
	r    io.Reader
	done *atomic.Int64
}

func (p progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done.Add(int64(n))
	return n, err
}

// Upload puts a complete local checkpoint into the store: the files in
// parallel (each multipart through the driver, or one signed PUT), every
// one hashed while it is sent and compared with the hash taken before, a
// file already uploaded by an earlier attempt (journal and size agree)
// skipped; then the object sizes are checked and the manifest written
// last. Only the manifest makes the checkpoint the store's latest.
func (m *Manager) Upload(ctx context.Context, ls LocalStep) error {
	m.upMu.Lock()
	defer m.upMu.Unlock()
	return m.upload(ctx, ls)
}

func (m *Manager) upload(ctx context.Context, ls LocalStep) error {
	step := ls.Step
	files, err := walkStep(ls.Dir)
	if err != nil {
		return fmt.Errorf("reading %s: %w", ls.Dir, err)
	}
	j := m.loadJournal(step)
	var total int64
	for _, f := range files {
		total += f.size
	}
	start := time.Now()
	var done atomic.Int64
	m.update(func(s *Status) { s.Uploading = &Transfer{Step: step, TotalBytes: total, StartedAt: start.UTC()} })
	defer m.update(func(s *Status) { s.Uploading = nil })
	stopProgress := m.trackProgress(&done, func(s *Status) *Transfer { return s.Uploading })
	defer stopProgress()

	// Hash first: the manifest needs every digest, and a file whose
	// journal entry matches needs no upload.
	if err := m.parallel(ctx, len(files), func(i int) error {
		f := &files[i]
		if e, ok := j.Files[f.rel]; ok && e.Size == f.size && e.ModNano == f.modNano && e.SHA256 != "" {
			f.sha256 = e.SHA256
			if b, err := hex.DecodeString(e.MD5); err == nil {
				f.md5 = b
			}
			return nil
		}
		sum, md, n, err := hashFile(f.abs)
		if err != nil {
			return err
		}
		if n != f.size {
			return fmt.Errorf("%s changed while being read (the checkpoint was marked complete too early)", f.abs)
		}
		f.sha256, f.md5 = sum, md
		return nil
	}); err != nil {
		return err
	}
	remote, err := m.objectSizes(ctx, DataPrefix+StepName(step)+"/")
	if err != nil {
		return err
	}
	var todo []int
	var jmu sync.Mutex
	for i, f := range files {
		e, ok := j.Files[f.rel]
		size, there := remote[DataKey(step, f.rel)]
		if ok && e.Uploaded && e.SHA256 == f.sha256 && there && size == f.size {
			done.Add(f.size)
			continue
		}
		j.Files[f.rel] = journalEntry{Size: f.size, ModNano: f.modNano, SHA256: f.sha256, MD5: hex.EncodeToString(f.md5)}
		todo = append(todo, i)
	}
	if err := m.saveJournal(j); err != nil {
		m.cfg.Log.Warn("writing the upload journal failed; an interrupted upload will start over", "err", err)
	}
	skipped := done.Load()
	if len(todo) < len(files) {
		m.cfg.Log.Info("resuming checkpoint upload", "step", step, "files_done", len(files)-len(todo), "bytes_done", skipped)
	}
	if p, ok := m.store.(interface {
		Prepare(context.Context, string, []string) error
	}); ok {
		keys := make([]string, 0, len(todo)+1)
		for _, i := range todo {
			keys = append(keys, DataKey(step, files[i].rel))
		}
		if err := p.Prepare(ctx, "PUT", append(keys, ManifestKey(step))); err != nil {
			return err
		}
	}
	sendStart := time.Now()
	if err := m.parallel(ctx, len(todo), func(k int) error {
		f := files[todo[k]]
		fh, err := os.Open(f.abs)
		if err != nil {
			return err
		}
		defer fh.Close()
		h := sha256.New()
		r := progressReader{r: io.TeeReader(io.LimitReader(fh, f.size), h), done: &done}
		if err := m.store.Put(ctx, DataKey(step, f.rel), r, f.size, f.md5); err != nil {
			return err
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != f.sha256 {
			return &StoreError{Op: "upload", Key: DataKey(step, f.rel), Kind: KindCorrupt,
				Err: fmt.Errorf("%s changed while it was uploaded (sha256 %s, hashed before as %s)", f.abs, got[:12], f.sha256[:12])}
		}
		jmu.Lock()
		e := j.Files[f.rel]
		e.Uploaded = true
		j.Files[f.rel] = e
		err = m.saveJournal(j)
		jmu.Unlock()
		if err != nil {
			m.cfg.Log.Warn("writing the upload journal failed", "err", err)
		}
		return nil
	}); err != nil {
		return err
	}
	sent := done.Load() - skipped
	sendTime := time.Since(sendStart)

	// Every object must be there with its size before the manifest says so.
	remote, err = m.objectSizes(ctx, DataPrefix+StepName(step)+"/")
	if err != nil {
		return err
	}
	man := Manifest{Format: ManifestFormat, Step: step, Fleet: m.cfg.Fleet, Node: m.cfg.Node, CreatedAt: time.Now().UTC(), Bytes: total}
	for _, f := range files {
		key := DataKey(step, f.rel)
		if size, ok := remote[key]; !ok || size != f.size {
			return &StoreError{Op: "verify", Key: key, Kind: KindCorrupt, Err: fmt.Errorf("the store holds %d bytes, want %d", size, f.size)}
		}
		man.Files = append(man.Files, FileEntry{Path: f.rel, Size: f.size, SHA256: f.sha256})
	}
	b, err := json.MarshalIndent(man, "", " ")
	if err != nil {
		return err
	}
	if err := m.store.Put(ctx, ManifestKey(step), strings.NewReader(string(b)), int64(len(b)), md5Sum(b)); err != nil {
		return err
	}
	if p := m.journalPath(); p != "" {
		_ = os.Remove(p)
	}
	mibps := mib(sent) / max(sendTime.Seconds(), 1e-6)
	m.update(func(s *Status) {
		s.LastStep, s.LastAt, s.LastBytes, s.Uploads = step, man.CreatedAt, total, s.Uploads+1
		if sent > 0 {
			s.UploadMiBps = mibps
		}
		s.Error, s.ErrorKind, s.ErrorAt = "", "", time.Time{}
	})
	ev := Event{Kind: EventUploaded, Step: step, Bytes: total, Seconds: time.Since(start).Seconds()}
	if sent > 0 {
		ev.MiBps = mibps
	}
	if skipped > 0 {
		ev.Detail = fmt.Sprintf("resumed: %d of %d bytes were already in the store", skipped, total)
	}
	m.cfg.Log.Info("checkpoint uploaded", "step", step, "bytes", total, "files", len(files), "sent", sent,
		"mib_per_s", fmt.Sprintf("%.1f", mibps), "took", time.Since(start).Round(time.Millisecond).String(), "store", m.store.String())
	m.emit(ev)
	return nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// trackProgress copies the byte counter into the status twice a second.
func (m *Manager) trackProgress(done *atomic.Int64, which func(*Status) *Transfer) func() {
	return Every(500*time.Millisecond, func() {
		m.update(func(s *Status) {
			if tr := which(s); tr != nil {
				tr.DoneBytes = done.Load()
			}
		})
	})
}

// Every calls fn every d until the returned stop is called; stop returns
// once fn is no longer running. Transfers report their progress with it.
func Every(d time.Duration, fn func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fn()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func (m *Manager) objectSizes(ctx context.Context, prefix string) (map[string]int64, error) {
	objs, err := m.store.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(objs))
	for _, o := range objs {
		out[o.Key] = o.Size
	}
	return out, nil
}

// parallel runs f(0..n-1) on Config.Parallel goroutines; the first error
// cancels the rest.
func (m *Manager) parallel(ctx context.Context, n int, f func(i int) error) error {
	if n == 0 {
		return ctx.Err()
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range min(m.cfg.Parallel, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err; cancel(err) })
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return context.Cause(ctx)
}

// Prune deletes the store's checkpoints beyond Keep (manifest first, so a
// half-deleted one is never restored), and data left by uploads that
// never finished when it is older than the oldest checkpoint kept.
func (m *Manager) Prune(ctx context.Context) error {
	objs, err := m.store.List(ctx, "")
	if err != nil {
		return err
	}
	var manifests []int64
	data := map[int64][]string{}
	for _, o := range objs {
		if n, ok := ManifestStep(o.Key); ok {
			manifests = append(manifests, n)
		} else if n, ok := DataStep(o.Key); ok {
			data[n] = append(data[n], o.Key)
		}
	}
	slices.SortFunc(manifests, cmpDesc)
	keep := min(m.cfg.Keep, len(manifests))
	oldestKept := int64(-1) // no checkpoint: leave every data object alone
	if keep > 0 {
		oldestKept = manifests[keep-1]
	}
	var gone []int64
	for _, step := range manifests[keep:] {
		if err := m.store.Delete(ctx, []string{ManifestKey(step)}); err != nil {
			return err
		}
		gone = append(gone, step)
	}
	steps := make([]int64, 0, len(data))
	for s := range data {
		steps = append(steps, s)
	}
	sort.Slice(steps, func(a, b int) bool { return steps[a] < steps[b] })
	for _, s := range steps {
		if s >= oldestKept {
			continue
		}
		if err := m.store.Delete(ctx, data[s]); err != nil {
			return err
		}
		if !slices.Contains(gone, s) {
			m.cfg.Log.Info("removed data of an unfinished upload", "step", s, "objects", len(data[s]))
		}
	}
	for _, s := range gone {
		m.cfg.Log.Info("pruned checkpoint from the store", "step", s, "keep", m.cfg.Keep)
		m.emit(Event{Kind: EventPruned, Step: s, Detail: fmt.Sprintf("beyond keep = %d", m.cfg.Keep)})
	}
	return nil
}

// ErrNoCheckpoint: the store holds no complete checkpoint newer than the
// local one.
var ErrNoCheckpoint = errors.New("no newer checkpoint in the store")

// Restored describes a restore.
type Restored struct {
	Step  int64
	Dir   string
	Bytes int64
	MiBps float64
	// Local: the local dir already had this checkpoint (no download).
	Local bool
	// Skipped lists the newer checkpoints that failed verification.
	Skipped []int64
}

// Restore makes the latest complete checkpoint available in Dir before
// the workers start: the newest one in the store that verifies (every
// file's size and sha256 as its manifest says), unless Dir already has
// it or a newer one. A checkpoint that fails verification is reported
// (corrupt) and the previous one is tried. It downloads into a dot-
// directory and renames it to step-N with the COMPLETE marker inside, so
// the workers never see half a checkpoint. Transient errors are retried
// a few times; then the error is returned and the workers start with
// what Dir has.
func (m *Manager) Restore(ctx context.Context) (Restored, error) {
	local, err := LocalSteps(m.cfg.Dir)
	if err != nil {
		return Restored{}, fmt.Errorf("scanning %s: %w", m.cfg.Dir, err)
	}
	have := int64(-1)
	if len(local) > 0 {
		have = local[0].Step
		m.update(func(s *Status) { s.LocalStep = have })
	}
	if m.store == nil {
		if have >= 0 {
			return Restored{Step: have, Dir: local[0].Dir, Local: true}, nil
		}
		return Restored{Step: -1}, ErrNoCheckpoint
	}
	var steps []int64
	err = m.retry(ctx, func() error {
		var err error
		steps, err = m.storeSteps(ctx)
		return err
	})
	if err != nil {
		m.fail(EventRestoreFailed, -1, fmt.Errorf("listing the store's checkpoints: %w", err))
		return Restored{Step: have}, err
	}
	if len(steps) > 0 {
		m.update(func(s *Status) { s.LastStep = steps[0] })
	}
	var skipped []int64
	for _, step := range steps {
		if step <= have {
			break
		}
		var r Restored
		err := m.retry(ctx, func() error {
			var err error
			r, err = m.restoreStep(ctx, step)
			return err
		})
		if err == nil {
			r.Skipped = skipped
			return r, nil
		}
		if ErrorKind(err) != KindCorrupt {
			m.fail(EventRestoreFailed, step, err)
			return Restored{Step: have, Skipped: skipped}, err
		}
		m.cfg.Log.Error("checkpoint in the store is corrupt; trying the previous one", "step", step, "err", err)
		m.fail(EventCorrupt, step, err)
		skipped = append(skipped, step)
	}
	if have >= 0 {
		return Restored{Step: have, Dir: local[0].Dir, Local: true, Skipped: skipped}, nil
	}
	return Restored{Step: -1, Skipped: skipped}, ErrNoCheckpoint
}

// restoreAttempts bounds the retries of a transient restore failure.
const restoreAttempts = 3

// retry runs f until it succeeds, fails in a way another attempt cannot
// mend (a corrupt checkpoint, a missing bucket, refused credentials: the
// workers should not wait for those), or restoreAttempts are spent.
func (m *Manager) retry(ctx context.Context, f func() error) error {
	delay := m.cfg.RetryMin
	var err error
	for attempt := 1; attempt <= restoreAttempts; attempt++ {
		if err = f(); err == nil || ctx.Err() != nil {
			return err
		}
		switch ErrorKind(err) {
		case KindCorrupt, KindNotFound, KindDenied:
			return err
		}
		if attempt < restoreAttempts {
			m.cfg.Log.Warn("checkpoint store failed; retrying", "attempt", attempt, "err", err)
			select {
			case <-ctx.Done():
				return err
			case <-time.After(delay):
			}
			delay = min(2*delay, m.cfg.RetryMax)
		}
	}
	return err
}

func (m *Manager) restoreStep(ctx context.Context, step int64) (Restored, error) {
	man, err := m.readManifest(ctx, step)
	if err != nil {
		return Restored{}, err
	}
	if err := os.MkdirAll(m.cfg.Dir, 0o755); err != nil {
		return Restored{}, err
	}
	tmp := filepath.Join(m.cfg.Dir, ".restore-"+StepName(step))
	_ = os.RemoveAll(tmp)
	defer os.RemoveAll(tmp) // gone after the rename, or on failure
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return Restored{}, err
	}
	if p, ok := m.store.(interface {
		Prepare(context.Context, string, []string) error
	}); ok {
		keys := make([]string, len(man.Files))
		for i, f := range man.Files {
			keys[i] = DataKey(step, f.Path)
		}
		if err := p.Prepare(ctx, "GET", keys); err != nil {
			return Restored{}, err
		}
	}
	start := time.Now()
	var done atomic.Int64
	m.update(func(s *Status) { s.Restoring = &Transfer{Step: step, TotalBytes: man.Bytes, StartedAt: start.UTC()} })
	defer m.update(func(s *Status) { s.Restoring = nil })
	stop := m.trackProgress(&done, func(s *Status) *Transfer { return s.Restoring })
	defer stop()
	err = m.parallel(ctx, len(man.Files), func(i int) error {
		f := man.Files[i]
		key := DataKey(step, f.Path)
		r, err := m.store.Open(ctx, key)
		if err != nil {
			if ErrorKind(err) == KindNotFound {
				return &StoreError{Op: "restore", Key: key, Kind: KindCorrupt, Err: fmt.Errorf("listed in the manifest but missing: %w", err)}
			}
			return err
		}
		defer r.Close()
		dst := filepath.Join(tmp, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		out, err := os.Create(dst)
		if err != nil {
			return err
		}
		h := sha256.New()
		// One byte more than the manifest says reveals a longer object.
		n, err := io.Copy(io.MultiWriter(out, h), progressReader{r: io.LimitReader(r, f.Size+1), done: &done})
		if err == nil {
			err = out.Sync()
		}
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return &StoreError{Op: "restore", Key: key, Kind: kindOf(err), Err: err}
		}
		if got := hex.EncodeToString(h.Sum(nil)); n != f.Size || got != f.SHA256 {
			return &StoreError{Op: "restore", Key: key, Kind: KindCorrupt,
				Err: fmt.Errorf("read %d bytes with sha256 %s, the manifest says %d bytes with sha256 %s", n, got[:12], f.Size, f.SHA256[:12])}
		}
		return nil
	})
	if err != nil {
		return Restored{}, err
	}
	marker := filepath.Join(tmp, CompleteMarker)
	if _, err := os.Stat(marker); err != nil {
		if err := os.WriteFile(marker, []byte(fmt.Sprintf("{\"step\": %d, \"restored\": true}\n", step)), 0o644); err != nil {
			return Restored{}, err
		}
	}
	final := filepath.Join(m.cfg.Dir, StepName(step))
	// A step-N without COMPLETE is a write that never finished.
	if err := os.RemoveAll(final); err != nil {
		return Restored{}, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return Restored{}, err
	}
	syncDir(m.cfg.Dir)
	took := time.Since(start)
	mibps := mib(man.Bytes) / max(took.Seconds(), 1e-6)
	m.update(func(s *Status) {
		s.RestoredStep, s.RestoreMiBps, s.LocalStep = step, mibps, max(s.LocalStep, step)
		if s.LastAt.IsZero() && s.LastStep == step {
			s.LastAt, s.LastBytes = man.CreatedAt, man.Bytes
		}
		s.Error, s.ErrorKind, s.ErrorAt = "", "", time.Time{}
	})
	m.cfg.Log.Info("checkpoint restored", "step", step, "bytes", man.Bytes, "files", len(man.Files),
		"mib_per_s", fmt.Sprintf("%.1f", mibps), "took", took.Round(time.Millisecond).String(), "dir", final)
	m.emit(Event{Kind: EventRestored, Step: step, Bytes: man.Bytes, MiBps: mibps, Seconds: took.Seconds()})
	return Restored{Step: step, Dir: final, Bytes: man.Bytes, MiBps: mibps}, nil
}

func kindOf(err error) string {
	if k, ok := transportKind(err); ok {
		return k
	}
	return ErrorKind(err)
}

func (m *Manager) readManifest(ctx context.Context, step int64) (Manifest, error) {
	key := ManifestKey(step)
	r, err := m.store.Open(ctx, key)
	if err != nil {
		return Manifest{}, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, maxManifestSize+1))
	if err != nil {
		return Manifest{}, &StoreError{Op: "read", Key: key, Kind: kindOf(err), Err: err}
	}
	man, err := ParseManifest(b, step)
	if err != nil {
		return Manifest{}, &StoreError{Op: "read", Key: key, Kind: KindCorrupt, Err: err}
	}
	return man, nil
}

func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil {
		_ = f.Sync()
		f.Close()
	}
}

// WriteFileAtomic replaces file with data at perm so a reader never sees
// half of it.
func WriteFileAtomic(file string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Chmod(tmp.Name(), perm); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), file)
}

// Sync uploads the newest complete local checkpoint now if the store
// does not have it yet (the job finished: the node goes away next).
func (m *Manager) Sync(ctx context.Context) error {
	if m.store == nil {
		return nil
	}
	m.upMu.Lock()
	defer m.upMu.Unlock()
	local, err := LocalSteps(m.cfg.Dir)
	if err != nil || len(local) == 0 {
		return err
	}
	steps, err := m.storeSteps(ctx)
	if err != nil {
		return err
	}
	if len(steps) > 0 && steps[0] >= local[0].Step {
		return nil
	}
	if err := m.upload(ctx, local[0]); err != nil {
		m.fail(EventUploadFailed, local[0].Step, err)
		return err
	}
	return m.Prune(ctx)
}
