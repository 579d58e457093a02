package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/fleetd/fleetd/agent/ckpt"
	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/rendezvous"
)

// CheckpointConfig is training.checkpoint as the daemon sends it.
type CheckpointConfig = agentwire.CheckpointConfig

// EnvCheckpointDir is the worker variable naming the local checkpoint dir.
const EnvCheckpointDir = "FLEETD_CHECKPOINT_DIR"

// The checkpoint part of the agent API (agentwire).
type (
	checkpointSignRequest   = agentwire.CheckpointSignRequest
	checkpointSignResponse  = agentwire.CheckpointSignResponse
	checkpointListRequest   = agentwire.CheckpointListRequest
	checkpointListResponse  = agentwire.CheckpointListResponse
	checkpointDeleteRequest = agentwire.CheckpointDeleteRequest
	checkpointReport        = agentwire.CheckpointReport
)

// writeFileAtomic replaces file (readable by all) so readers never see a
// partial write.
func writeFileAtomic(file string, data []byte) error { return ckpt.WriteFileAtomic(file, data, 0o644) }

// daemonSigner is the daemon's half of a signed store, over the node API.
type daemonSigner struct{ dc *daemonClient }

var kindRE = regexp.MustCompile(`"kind":\s*"([a-z-]+)"`)

// storeErr turns the daemon's refusal into a store error with the kind
// the daemon saw (it talks to the store for listings and deletes).
func storeErr(op string, err error) error {
	kind := ckpt.KindFailed
	var se *statusError
	if errors.As(err, &se) {
		if m := kindRE.FindStringSubmatch(se.Body); m != nil {
			kind = m[1]
		} else if se.Code == http.StatusForbidden {
			kind = ckpt.KindDenied
		}
	} else {
		kind = ckpt.KindUnreachable // the daemon: the store is reached through it
	}
	return &ckpt.StoreError{Op: op, Kind: kind, Err: err}
}

func (s daemonSigner) Sign(ctx context.Context, method string, keys []string) (map[string]string, time.Time, error) {
	var r checkpointSignResponse
	if err := s.dc.post(ctx, "checkpoint/sign", checkpointSignRequest{Method: method, Keys: keys}, &r); err != nil {
		return nil, time.Time{}, storeErr("sign", err)
	}
	return r.URLs, r.ExpiresAt, nil
}

func (s daemonSigner) List(ctx context.Context, prefix string) ([]ckpt.Object, error) {
	var r checkpointListResponse
	if err := s.dc.post(ctx, "checkpoint/list", checkpointListRequest{Prefix: prefix}, &r); err != nil {
		return nil, storeErr("list", err)
	}
	return r.Objects, nil
}

func (s daemonSigner) Delete(ctx context.Context, keys []string) error {
	if err := s.dc.post(ctx, "checkpoint/delete", checkpointDeleteRequest{Keys: keys}, nil); err != nil {
		return storeErr("delete", err)
	}
	return nil
}

// checkpoints is the agent's checkpoint manager and its reporter.
type checkpoints struct {
	m   *ckpt.Manager
	dir string

	mu       sync.Mutex
	events   []queuedEvent
	seq      int64
	restored int64 // -1: nothing restored or found
}

// queuedEvent is an event waiting for the daemon, numbered so that a
// report removes exactly what it delivered.
type queuedEvent struct {
	seq int64
	ev  ckpt.Event
}

// maxQueuedEvents bounds the events kept while the daemon is away.
const maxQueuedEvents = 100

// checkpointDirFor resolves the checkpoint dir like the workers' paths:
// absolute as is, relative to the workers' workdir (itself relative to
// the agent's directory).
func checkpointDirFor(tc TrainingConfig) (string, error) {
	d := tc.Checkpoint.Dir
	if !filepath.IsAbs(d) && tc.Workdir != "" {
		d = filepath.Join(tc.Workdir, d)
	}
	return filepath.Abs(d)
}

// startCheckpoints sets up the checkpoint manager when the fleet has a
// checkpoint block, restores the latest complete checkpoint into the
// dir (before the node joins, so before its workers start) and then
// uploads new ones in the background. A store that fails is reported and
// training goes on with what the dir has.
func (e *elastic) startCheckpoints(ctx context.Context, wg *sync.WaitGroup) {
	tc := e.trainingConfig()
	if tc.Checkpoint == nil || e.ckpt != nil {
		return
	}
	dir, err := checkpointDirFor(tc)
	if err != nil {
		e.a.log.Error("checkpoint dir unusable; checkpoints are not managed", "dir", tc.Checkpoint.Dir, "err", err)
		return
	}
	c := &checkpoints{dir: dir, restored: -1}
	var store ckpt.Store
	var openErr error
	switch {
	case tc.Checkpoint.Store == "":
	case tc.Checkpoint.Access == "node":
		bs, err := ckpt.OpenBucket(ctx, tc.Checkpoint.Store)
		if err != nil {
			openErr = err
		} else {
			store = bs
		}
	default:
		scheme, _, _, _ := ckpt.ParseStore(tc.Checkpoint.Store)
		ss := ckpt.NewSignedStore(daemonSigner{dc: e.dc}, e.a.opts.TransferClient, tc.Checkpoint.Store)
		ss.SendMD5 = scheme == "s3" // S3 verifies Content-MD5; a GCS V4 URL would have to sign it
		store = ss
	}
	c.m = ckpt.New(ckpt.Config{
		Dir: dir, Keep: tc.Checkpoint.Keep, Fleet: e.fleet, Node: e.node, StateDir: e.a.paths.WorkDir,
		Poll: e.a.opts.CheckpointPoll, Log: e.a.log.With("component", "checkpoints"),
		OnEvent: func(ev ckpt.Event) { c.queue(ev) },
	}, store)
	e.ckpt = c
	e.sup.ckptDir = dir
	wg.Go(func() { c.report(ctx, e) })
	if openErr != nil {
		e.a.log.Error("checkpoint store unusable; checkpoints stay on the node", "store", tc.Checkpoint.Store, "err", openErr)
		c.queue(ckpt.Event{Kind: ckpt.EventUploadFailed, Step: -1, ErrorKind: ckpt.ErrorKind(openErr), Detail: openErr.Error(), At: time.Now().UTC()})
		return
	}
	if store != nil {
		start := time.Now()
		r, err := c.m.Restore(ctx)
		switch {
		case err == nil && !r.Local:
			c.setRestored(r.Step)
			e.a.log.Info("restored the latest checkpoint before starting workers", "step", r.Step, "dir", r.Dir,
				"bytes", r.Bytes, "took", time.Since(start).Round(time.Millisecond).String(), "skipped_corrupt", r.Skipped)
		case err == nil:
			c.setRestored(r.Step)
			e.a.log.Info("the checkpoint dir already has the latest checkpoint", "step", r.Step, "dir", r.Dir)
		case errors.Is(err, ckpt.ErrNoCheckpoint):
			e.a.log.Info("no checkpoint to restore; workers start from scratch", "store", store.String(), "skipped_corrupt", r.Skipped)
		default:
			if r.Step >= 0 {
				c.setRestored(r.Step)
			}
			e.a.log.Error("restoring the latest checkpoint failed; workers start with what the dir has", "err", err, "local_step", r.Step)
		}
	}
	wg.Go(func() { _ = c.m.Run(ctx) })
}

func (c *checkpoints) setRestored(step int64) {
	c.mu.Lock()
	c.restored = step
	c.mu.Unlock()
}

// restoredStep is the checkpoint the node holds since its start (-1: none).
func (c *checkpoints) restoredStep() int64 {
	if c == nil {
		return -1
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.restored
}

func (c *checkpoints) queue(ev ckpt.Event) {
	c.mu.Lock()
	if len(c.events) >= maxQueuedEvents {
		c.events = c.events[1:]
	}
	c.seq++
	c.events = append(c.events, queuedEvent{seq: c.seq, ev: ev})
	c.mu.Unlock()
}

// pending returns the queued events and the number of the last one.
func (c *checkpoints) pending() ([]ckpt.Event, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]ckpt.Event, len(c.events))
	for i, q := range c.events {
		out[i] = q.ev
	}
	var last int64
	if n := len(c.events); n > 0 {
		last = c.events[n-1].seq
	}
	return out, last
}

// delivered drops the events up to seq.
func (c *checkpoints) delivered(seq int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := 0
	for i < len(c.events) && c.events[i].seq <= seq {
		i++
	}
	c.events = c.events[i:]
}

// report sends the manager's status with the queued events at the
// heartbeat interval whenever something changed, and at least every 30 s;
// events stay queued until the daemon took them.
func (c *checkpoints) report(ctx context.Context, e *elastic) {
	var sent int64 = -1
	var sentAt time.Time
	prog := every{d: progressEvery}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(e.heartbeatEvery()):
		}
		_, ver := c.m.Status()
		if evs, _ := c.pending(); ver == sent && len(evs) == 0 && time.Since(sentAt) < 30*time.Second {
			continue
		}
		ver, err := c.send(ctx, e.dc)
		if err != nil {
			if ctx.Err() == nil && prog.ok() {
				e.a.log.Warn("reporting checkpoint status failed; retrying", "err", err)
			}
			continue
		}
		sent, sentAt = ver, time.Now()
	}
}

// send reports the manager's status with the queued events once and
// drops the events the daemon took; it returns the status version sent.
func (c *checkpoints) send(ctx context.Context, dc *daemonClient) (int64, error) {
	st, ver := c.m.Status()
	evs, last := c.pending()
	if err := dc.post(ctx, "checkpoint/report", checkpointReport{Status: st, Events: evs}, nil); err != nil {
		return 0, err
	}
	c.delivered(last)
	return ver, nil
}

// DefaultCheckpointFlush bounds the upload of the job's last checkpoint
// when it finishes (Options.CheckpointFlush).
const DefaultCheckpointFlush = 10 * time.Minute

// flushCheckpoints uploads the newest complete checkpoint when the job
// finished, if the store lacks it, within CheckpointFlush: the daemon
// terminates the node next.
func (e *elastic) flushCheckpoints(ctx context.Context) error {
	if e.ckpt == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.a.opts.CheckpointFlush)
	defer cancel()
	err := e.ckpt.m.Sync(ctx)
	if err != nil {
		e.a.log.Error("uploading the final checkpoint failed", "err", err)
	}
	return err
}

// drainReportBound bounds reporting a drain's end when the exclusion
// carried no deadline.
const drainReportBound = 5 * time.Minute

// reportDrained tells the daemon that this excluded node is done: its
// workers have stopped, so its newest checkpoint is stored (and reported)
// first, then the daemon may delete the node at once instead of at the
// drain deadline: a paused or shrunk fleet stops paying for it. It runs
// beside the event loop, bounded by the notice's deadline (past which
// the node is deleted anyway); a daemon without the call (404) is left
// to its deadline.
func (e *elastic) reportDrained(ctx context.Context, v rendezvous.View) {
	deadline := time.Now().Add(drainReportBound)
	if nd := e.a.noticeDeadline(); !nd.IsZero() {
		deadline = nd
	} else if !v.NoticeDeadline.IsZero() {
		deadline = v.NoticeDeadline
	}
	req := agentwire.DrainedRequest{Reason: v.Reason, CheckpointStep: -1}
	if e.ws != nil {
		if step, n := e.ws.checkpointed(); n > 0 {
			req.CheckpointStep = step
		}
	}
	ck, dc, log, b := e.ckpt, e.dc, e.a.log, e.b
	go func() {
		ctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		if ck != nil {
			start := time.Now()
			if err := e.flushCheckpoints(ctx); err != nil {
				req.FlushError = err.Error()
			} else if _, err := ck.send(ctx, dc); err != nil {
				log.Warn("reporting the checkpoint status before leaving failed", "err", err)
			}
			log.Info("checkpoints stored before leaving", "took", time.Since(start).Round(time.Millisecond).String())
		}
		prog := every{d: progressEvery}
		err := retry(ctx, b, func(ctx context.Context) error {
			err := dc.drained(ctx, req)
			if se := (*statusError)(nil); errors.As(err, &se) && se.Code == http.StatusNotFound {
				return fmt.Errorf("%w (a daemon older than this agent)", errNoDrainedCall)
			}
			return err
		}, func(attempt int, err error) {
			if prog.ok() {
				log.Warn("reporting the drain's end failed; retrying", "attempt", attempt, "err", err)
			}
		})
		if err != nil {
			log.Warn("the daemon did not take the drain's end; it deletes the node at the drain deadline", "err", err)
			return
		}
		log.Info("drained: the daemon may delete this node now", "checkpoint_step", req.CheckpointStep)
	}()
}

// errNoDrainedCall: the daemon does not serve the drained call; retrying
// cannot help.
var errNoDrainedCall = errors.New("the daemon has no drained call")
