package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleetd/agent/ckpt"
	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/internal/ctxtime"
)

// Data modes (spec.DataMount etc.; agent/ does not import fleet/).
const (
	dataStage  = "stage"
	dataStream = "stream"
)

// stagedMarker, in a staged directory, records a finished copy: a
// restarted agent does not copy again.
const stagedMarker = ".fleetd-staged"

// partSuffix marks a file being written; it is renamed when complete.
const partSuffix = ".fleetd-part"

// Staging knobs: files copied at once, and how often progress goes to the
// daemon and the log.
var (
	stageParallel    = 8
	stageReportEvery = time.Second
)

// stageSource is what staging reads: a bucket, a node directory or a peer
// node's copy (ckpt's stores and peerSource have it).
type stageSource interface {
	List(ctx context.Context, prefix string) ([]ckpt.Object, error)
	Open(ctx context.Context, key string) (io.ReadCloser, error)
	String() string
}

// stagedInfo is the marker's content.
type stagedInfo struct {
	Source string `json:"source"`
	Bytes  int64  `json:"bytes"`
	Files  int    `json:"files"`
}

// stageCounter is a copy's progress, updated by the copying goroutines
// and read by the reporter.
type stageCounter struct {
	bytes, files      atomic.Int64
	total, totalFiles int64
	start             time.Time
}

// report is the counter as a StagingReport at now.
func (c *stageCounter) report(d agentwire.DataConfig, from string, now time.Time) agentwire.StagingReport {
	r := agentwire.StagingReport{Source: d.Source, MountPath: d.MountPath, From: from,
		Bytes: c.bytes.Load(), Total: c.total, Files: int(c.files.Load()), TotalFiles: int(c.totalFiles)}
	if el := now.Sub(c.start).Seconds(); el > 0 {
		r.RateBps = float64(r.Bytes) / el
	}
	if r.RateBps > 0 && r.Total > r.Bytes {
		r.ETASeconds = float64(r.Total-r.Bytes) / r.RateBps
	}
	return r
}

// safeKey: an object key is a relative path inside the staged directory.
func safeKey(k string) bool {
	if k == "" || strings.HasPrefix(k, "/") || strings.Contains(k, "\\") || strings.HasSuffix(k, partSuffix) || k == stagedMarker {
		return false
	}
	for _, p := range strings.Split(k, "/") {
		if p == "" || p == "." || p == ".." {
			return false
		}
	}
	return true
}

// listStage lists a source and checks its keys.
func listStage(ctx context.Context, src stageSource) ([]ckpt.Object, error) {
	objs, err := src.List(ctx, "")
	if err != nil {
		return nil, err
	}
	out := objs[:0]
	for _, o := range objs {
		if o.Key == stagedMarker {
			continue // a peer's own marker
		}
		if !safeKey(o.Key) {
			return nil, fmt.Errorf("stage %s: object key %q is not a relative path", src, o.Key)
		}
		out = append(out, o)
	}
	// Largest first: the long copies start early and the tail is short.
	sort.Slice(out, func(i, j int) bool {
		return out[i].Size > out[j].Size || out[i].Size == out[j].Size && out[i].Key < out[j].Key
	})
	return out, nil
}

// stageCopy copies objs from src into dir, stageParallel at a time,
// counting into c. Each file is written beside its name and renamed when
// its size matches the listing, so a half-copied file is never mistaken
// for data.
func stageCopy(ctx context.Context, src stageSource, objs []ckpt.Object, dir string, c *stageCounter) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan ckpt.Object)
	var wg sync.WaitGroup
	for range max(1, min(stageParallel, len(objs))) {
		wg.Go(func() {
			for o := range work {
				if err := stageFile(ctx, src, o, dir, c); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for _, o := range objs {
		select {
		case work <- o:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

func stageFile(ctx context.Context, src stageSource, o ckpt.Object, dir string, c *stageCounter) error {
	dst := filepath.Join(dir, filepath.FromSlash(o.Key))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("stage %s: %w", o.Key, err)
	}
	r, err := src.Open(ctx, o.Key)
	if err != nil {
		return fmt.Errorf("stage %s from %s: %w", o.Key, src, err)
	}
	defer r.Close()
	f, err := os.Create(dst + partSuffix)
	if err != nil {
		return fmt.Errorf("stage %s: %w", o.Key, err)
	}
	// Counted as it arrives, so progress moves within large files.
	n, err := io.Copy(f, ckpt.CountingReader(r, &c.bytes))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != o.Size {
		err = fmt.Errorf("got %d bytes, listed %d", n, o.Size)
	}
	if err != nil {
		c.bytes.Add(-n) // a retry (from the bucket, after a peer) counts afresh
		os.Remove(dst + partSuffix)
		return fmt.Errorf("stage %s from %s: %w", o.Key, src, err)
	}
	if err := os.Rename(dst+partSuffix, dst); err != nil {
		return fmt.Errorf("stage %s: %w", o.Key, err)
	}
	c.files.Add(1)
	return nil
}

// readStaged returns the marker of a finished copy of source in dir.
func readStaged(dir, source string) (stagedInfo, bool) {
	b, err := os.ReadFile(filepath.Join(dir, stagedMarker))
	if err != nil {
		return stagedInfo{}, false
	}
	var si stagedInfo
	if json.Unmarshal(b, &si) != nil || si.Source != source {
		return stagedInfo{}, false
	}
	return si, true
}

// stager copies a fleet's staged sources for one node.
type stager struct {
	root string // re-roots mount paths (local nodes); "" on a VM
	// open opens a source URL (ckpt.OpenBucket in the agent).
	open func(ctx context.Context, source string) (stageSource, error)
	// peers, when set, offers a surviving node's copy of a source in the
	// node's zone; nil or ok false: read the source.
	peers func(ctx context.Context, d agentwire.DataConfig) (src stageSource, from string, ok bool)
	// serve offers a finished copy to peers and returns its URL ("" for
	// none); nil: not served.
	serve func(mountPath, dir string) string
	// send reports progress to the daemon (best effort).
	send func(ctx context.Context, r agentwire.StagingReport) error
	log  func(msg string, args ...any)
	now  func() time.Time
}

// dir is where d is staged on this node.
func (s *stager) dir(d agentwire.DataConfig) string {
	return filepath.Join(s.root, filepath.FromSlash(path.Clean(d.MountPath)))
}

// stageAll copies every staged source in turn (each one's files in
// parallel), reporting progress; the first failure ends it.
func (s *stager) stageAll(ctx context.Context, data []agentwire.DataConfig) error {
	for _, d := range data {
		if d.Mode != dataStage {
			continue
		}
		if err := s.stageOne(ctx, d); err != nil {
			return err
		}
	}
	return nil
}

func (s *stager) stageOne(ctx context.Context, d agentwire.DataConfig) error {
	dir := s.dir(d)
	if si, ok := readStaged(dir, d.Source); ok {
		s.log("data already staged", "source", redactSource(d.Source), "dir", dir, "bytes", si.Bytes)
		s.sendFinal(ctx, agentwire.StagingReport{Source: redactSource(d.Source), MountPath: d.MountPath, From: "disk", Bytes: si.Bytes, Total: si.Bytes,
			Files: si.Files, TotalFiles: si.Files, Done: true, PeerURL: s.served(d, dir)})
		return nil
	}
	src, from, err := s.source(ctx, d)
	if err == nil {
		err = s.copyFrom(ctx, d, src, from, dir)
		if err != nil && from != "bucket" && ctx.Err() == nil {
			// A peer that went away mid-copy: the bucket still has it all.
			s.log("staging from the peer failed; copying from the source", "peer", from, "err", err)
			if src, err = s.open(ctx, d.Source); err == nil {
				err = s.copyFrom(ctx, d, src, "bucket", dir)
			}
		}
	}
	if err != nil {
		err = fmt.Errorf("staging %s to %s: %w", redactSource(d.Source), d.MountPath, err)
		s.sendFinal(ctx, agentwire.StagingReport{Source: redactSource(d.Source), MountPath: d.MountPath, From: from, Done: true, Error: err.Error()})
		return err
	}
	return nil
}

// source is a peer's copy when one is offered, else the source itself.
func (s *stager) source(ctx context.Context, d agentwire.DataConfig) (stageSource, string, error) {
	if s.peers != nil {
		if src, from, ok := s.peers(ctx, d); ok {
			return src, from, nil
		}
	}
	src, err := s.open(ctx, d.Source)
	return src, "bucket", err
}

func (s *stager) copyFrom(ctx context.Context, d agentwire.DataConfig, src stageSource, from, dir string) error {
	objs, err := listStage(ctx, src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	c := &stageCounter{start: s.now(), totalFiles: int64(len(objs))}
	for _, o := range objs {
		c.total += o.Size
	}
	rd := agentwire.DataConfig{Source: redactSource(d.Source), MountPath: d.MountPath}
	s.log("staging data", "source", rd.Source, "from", from, "dir", dir, "files", len(objs), "bytes", c.total)

	stop := ckpt.Every(stageReportEvery, func() {
		r := c.report(rd, from, s.now())
		s.log("staging progress", "source", rd.Source, "from", from, "bytes", r.Bytes, "total", r.Total,
			"rate_mb_s", strconv.FormatFloat(r.RateBps/1e6, 'f', 1, 64), "eta_s", strconv.FormatFloat(r.ETASeconds, 'f', 1, 64))
		_ = s.send(ctx, r) // best effort: the copy does not wait for the daemon
	})
	err = stageCopy(ctx, src, objs, dir, c)
	stop()
	if err != nil {
		return err
	}
	si := stagedInfo{Source: d.Source, Bytes: c.bytes.Load(), Files: int(c.files.Load())}
	if err := writeJSONAtomic(filepath.Join(dir, stagedMarker), si); err != nil {
		return err
	}
	r := c.report(rd, from, s.now())
	r.Done, r.PeerURL = true, s.served(d, dir)
	s.log("data staged", "source", rd.Source, "from", from, "bytes", r.Bytes, "files", r.Files,
		"seconds", strconv.FormatFloat(s.now().Sub(c.start).Seconds(), 'f', 1, 64))
	s.sendFinal(ctx, r)
	return nil
}

func (s *stager) served(d agentwire.DataConfig, dir string) string {
	if s.serve == nil {
		return ""
	}
	return s.serve(d.MountPath, dir)
}

// sendFinal reports an end state, retrying a little: status should not
// keep showing a copy in progress.
func (s *stager) sendFinal(ctx context.Context, r agentwire.StagingReport) {
	for i := range 3 {
		if s.send(ctx, r) == nil || ctxtime.Sleep(ctx, time.Duration(i+1)*stageReportEvery) != nil {
			return
		}
	}
}

// redactSource drops a source's query (an endpoint or key file).
func redactSource(s string) string {
	if i := strings.IndexByte(s, '?'); i >= 0 {
		return s[:i]
	}
	return s
}

// dataEnv names the data to the workers: FLEETD_DATA_<i>_PATH (where it
// is on the node: the mount path, under root on a local node), _SOURCE
// and _MODE, per data block in spec order, and FLEETD_DATA_COUNT. A
// streamed source's workers read _SOURCE themselves.
func dataEnv(data []agentwire.DataConfig, root string) map[string]string {
	if len(data) == 0 {
		return nil
	}
	env := map[string]string{"FLEETD_DATA_COUNT": strconv.Itoa(len(data))}
	for i, d := range data {
		p := "FLEETD_DATA_" + strconv.Itoa(i) + "_"
		env[p+"PATH"], env[p+"SOURCE"], env[p+"MODE"] = filepath.Join(root, filepath.FromSlash(d.MountPath)), d.Source, d.Mode
	}
	return env
}

// withDataEnv adds dataEnv to tc's environment (the spec's own env wins).
func withDataEnv(tc agentwire.TrainingConfig, root string) agentwire.TrainingConfig {
	de := dataEnv(tc.Data, root)
	if de == nil {
		return tc
	}
	env := make(map[string]string, len(tc.Env)+len(de))
	for k, v := range de {
		env[k] = v
	}
	for k, v := range tc.Env {
		env[k] = v
	}
	tc.Env = env
	return tc
}

// stageData is the elastic agent's staging before its first join: the
// node joins the round only with its data on disk.
func (e *elastic) stageData(ctx context.Context) error {
	tc := e.trainingConfig()
	staged := false
	for _, d := range tc.Data {
		staged = staged || d.Mode == dataStage
	}
	if !staged {
		return nil
	}
	s := &stager{root: e.a.opts.Root,
		open:  func(ctx context.Context, source string) (stageSource, error) { return ckpt.OpenBucket(ctx, source) },
		peers: e.peerFor,
		serve: func(mp, dir string) string { return e.servePeer(ctx, mp, dir) },
		send:  e.dc.staging,
		log:   func(msg string, args ...any) { e.a.log.Info(msg, args...) },
		now:   time.Now,
	}
	if err := s.stageAll(ctx, tc.Data); err != nil {
		if errors.Is(err, ckpt.ErrNoNodeDriver) {
			return fmt.Errorf("%w (staging a bucket needs the node-store agent build)", err)
		}
		return err
	}
	return nil
}
