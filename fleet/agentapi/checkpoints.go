package agentapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"cloud.google.com/go/storage"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// stores
	_ "gocloud.dev/blob/gcsblob"  // gs:// stores
	_ "gocloud.dev/blob/s3blob"   // s3:// stores
	"gocloud.dev/gcerrors"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
)

// Checkpoint stores, the daemon's side (docs/checkpoints.md). With
// access = "signed" the daemon holds the store's credentials: a node asks
// it for short-lived URLs for exactly the objects it reads or writes, and
// for listings and deletes, over its node-token API; so a node never needs
// keys for the store's cloud. Every node reports its checkpoint state at
// its heartbeat interval; the daemon keeps the latest per fleet (memory),
// turns the reports' events into events and alerts, and shows them in
// status and metrics.

// CheckpointURLExpiry is how long a signed URL is valid.
const CheckpointURLExpiry = 15 * time.Minute

// maxCheckpointKeys bounds the keys of one sign or delete call.
const maxCheckpointKeys = 1000

// AlertCheckpointStore is the alert kind of a failing checkpoint store.
const AlertCheckpointStore = "checkpoint-store"

// The store layout (agent/ckpt): manifests/step-N.json, data/step-N/PATH.
var (
	ckptManifestRE = regexp.MustCompile(`^manifests/step-(\d{1,18})\.json$`)
	ckptDataRE     = regexp.MustCompile(`^data/step-(\d{1,18})/(.+)$`)
	ckptDataDirRE  = regexp.MustCompile(`^data/step-(\d{1,18})/$`)
)

// ckptKeyStep returns the step of a layout key, or false for any other key.
func ckptKeyStep(key string) (int64, bool) {
	var num string
	if m := ckptManifestRE.FindStringSubmatch(key); m != nil {
		num = m[1]
	} else if m := ckptDataRE.FindStringSubmatch(key); m != nil {
		rel := m[2]
		if path.Clean(rel) != rel || rel == ".." || strings.HasPrefix(rel, "../") || strings.HasPrefix(rel, "/") || strings.ContainsAny(rel, "\\\x00") {
			return 0, false
		}
		num = m[1]
	} else {
		return 0, false
	}
	n, err := strconv.ParseInt(num, 10, 64)
	return n, err == nil
}

// ckptRegistry is the daemon's checkpoint state: open buckets by store
// URL and the fleets' reports.
type ckptRegistry struct {
	mu     sync.Mutex // fleets
	fleets map[string]*ckptFleet
	// bmu guards buckets: opening one may wait for credentials (GCE
	// metadata), which must not hold up reports.
	bmu     sync.Mutex
	buckets map[string]*blob.Bucket
}

type ckptFleet struct {
	nodes map[string]api.CheckpointNodeStatus
	// From events: the newest upload, the last restore, the last failure.
	last        api.CheckpointEvent
	lastRestore *api.CheckpointRestore
	failure     *api.CheckpointEvent
	failNode    string
	// lastFailEvent rate-limits repeated failure events: one per node
	// and error kind every failureEventEvery.
	lastFailEvent time.Time
	lastFailMsg   string
}

func (r *ckptRegistry) fleet(name string) *ckptFleet {
	if r.fleets == nil {
		r.fleets = map[string]*ckptFleet{}
	}
	f := r.fleets[name]
	if f == nil {
		f = &ckptFleet{nodes: map[string]api.CheckpointNodeStatus{}, last: api.CheckpointEvent{Step: -1}}
		r.fleets[name] = f
	}
	return f
}

// bucket opens (once) a store's bucket with the daemon's credentials,
// scoped to the store's prefix.
func (r *ckptRegistry) bucket(ctx context.Context, store string) (*blob.Bucket, error) {
	r.bmu.Lock()
	defer r.bmu.Unlock()
	if b, ok := r.buckets[store]; ok {
		return b, nil
	}
	st, err := spec.ParseStoreURL(store)
	if err != nil {
		return nil, err
	}
	b, err := blob.OpenBucket(ctx, st.OpenerURL())
	if err != nil {
		return nil, fmt.Errorf("opening checkpoint store %s: %w", redactStore(store), err)
	}
	if st.Prefix != "" {
		b = blob.PrefixedBucket(b, st.Prefix+"/")
	}
	if r.buckets == nil {
		r.buckets = map[string]*blob.Bucket{}
	}
	r.buckets[store] = b
	return b, nil
}

func redactStore(s string) string {
	if i := strings.IndexByte(s, '?'); i >= 0 {
		return s[:i]
	}
	return s
}

// storeErrKind classifies a store failure like the agent does.
func storeErrKind(err error) string {
	var oe *net.OpError
	var de *net.DNSError
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.As(err, &oe), errors.As(err, &de), errors.As(err, &ne) && ne.Timeout():
		return "unreachable"
	}
	switch gcerrors.Code(err) {
	case gcerrors.NotFound:
		return "not-found"
	case gcerrors.PermissionDenied:
		return "denied"
	}
	var hs interface{ HTTPStatusCode() int }
	if errors.As(err, &hs) {
		switch hs.HTTPStatusCode() {
		case 401, 403:
			return "denied"
		case 404:
			return "not-found"
		}
	}
	return "failed"
}

// ckptTarget resolves the fleet of a node API call to its signed store.
func (a *API) ckptTarget(ctx context.Context, fleetName string) (*spec.Checkpoint, *blob.Bucket, int, error) {
	f, err := state.Read(ctx, a.deps, func(tx state.Tx) (state.Fleet, error) { return tx.Fleet(fleetName) })
	if err != nil {
		if errors.Is(err, state.ErrNotFound) {
			return nil, nil, http.StatusNotFound, err
		}
		return nil, nil, http.StatusInternalServerError, err
	}
	fl, err := a.deps.FleetSpec(f)
	if err != nil {
		return nil, nil, http.StatusInternalServerError, err
	}
	c := fl.Training.Checkpoint
	if c == nil || c.Store == "" || c.Access != spec.CheckpointAccessSigned {
		return nil, nil, http.StatusConflict, fmt.Errorf("fleet %q has no checkpoint store with access = \"signed\"", fleetName)
	}
	b, err := a.ckpts.bucket(ctx, c.Store)
	if err != nil {
		return nil, nil, http.StatusBadGateway, err
	}
	return c, b, 0, nil
}

func writeStoreError(w http.ResponseWriter, code int, err error) {
	kind := "failed"
	if code == http.StatusBadGateway {
		kind = storeErrKind(err)
	}
	api.WriteJSON(w, code, api.CheckpointStoreError{Kind: kind, Error: err.Error()})
}

// checkpointSign signs URLs for layout keys of the node's fleet.
func (a *API) checkpointSign(w http.ResponseWriter, r *http.Request) {
	var req api.CheckpointSignRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	if req.Method != http.MethodGet && req.Method != http.MethodPut {
		api.WriteError(w, http.StatusBadRequest, fmt.Errorf("method must be GET or PUT, got %q", req.Method))
		return
	}
	if len(req.Keys) == 0 || len(req.Keys) > maxCheckpointKeys {
		api.WriteError(w, http.StatusBadRequest, fmt.Errorf("keys: want 1..%d, got %d", maxCheckpointKeys, len(req.Keys)))
		return
	}
	for _, k := range req.Keys {
		if _, ok := ckptKeyStep(k); !ok {
			api.WriteError(w, http.StatusBadRequest, fmt.Errorf("key %q is not a checkpoint key (manifests/step-N.json or data/step-N/PATH)", k))
			return
		}
	}
	c, b, code, err := a.ckptTarget(r.Context(), r.PathValue("fleet"))
	if err != nil {
		writeStoreError(w, code, err)
		return
	}
	urls, err := signCheckpointURLs(r.Context(), b, c.Store, req.Method, req.Keys, CheckpointURLExpiry)
	if err != nil {
		writeStoreError(w, http.StatusBadGateway, err)
		return
	}
	resp := api.CheckpointSignResponse{URLs: urls, ExpiresAt: a.now().Add(CheckpointURLExpiry)}
	api.WriteJSON(w, http.StatusOK, resp)
}

// signCheckpointURLs signs method for each key with the store's driver:
// s3blob presigns with the AWS SDK (SigV4, query-string auth), gcsblob
// with the storage client's signer, here V4 (GOOG4-RSA-SHA256).
func signCheckpointURLs(ctx context.Context, b *blob.Bucket, store, method string, keys []string, expiry time.Duration) (map[string]string, error) {
	st, err := spec.ParseStoreURL(store)
	if err != nil {
		return nil, err
	}
	opts := &blob.SignedURLOptions{Method: method, Expiry: expiry}
	if st.Scheme == "gs" {
		opts.BeforeSign = func(as func(any) bool) error {
			var o *storage.SignedURLOptions
			if as(&o) {
				o.Scheme = storage.SigningSchemeV4
			}
			return nil
		}
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		u, err := b.SignedURL(ctx, k, opts)
		if err != nil {
			return nil, fmt.Errorf("signing %s %s: %w", method, k, err)
		}
		out[k] = u
	}
	return out, nil
}

// maxCheckpointList bounds a listing.
const maxCheckpointList = 1_000_000

func listStore(ctx context.Context, b *blob.Bucket, prefix string) ([]api.CheckpointObject, error) {
	it := b.List(&blob.ListOptions{Prefix: prefix})
	out := []api.CheckpointObject{}
	for len(out) < maxCheckpointList {
		o, err := it.Next(ctx)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if !o.IsDir {
			out = append(out, api.CheckpointObject{Key: o.Key, Size: o.Size})
		}
	}
	return nil, fmt.Errorf("more than %d objects under %q", maxCheckpointList, prefix)
}

// checkpointList lists the store: "", "manifests/" or "data/step-N/".
func (a *API) checkpointList(w http.ResponseWriter, r *http.Request) {
	var req api.CheckpointListRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	if req.Prefix != "" && req.Prefix != "manifests/" && !ckptDataDirRE.MatchString(req.Prefix) {
		api.WriteError(w, http.StatusBadRequest, fmt.Errorf("prefix must be \"\", \"manifests/\" or \"data/step-N/\", got %q", req.Prefix))
		return
	}
	_, b, code, err := a.ckptTarget(r.Context(), r.PathValue("fleet"))
	if err != nil {
		writeStoreError(w, code, err)
		return
	}
	objs, err := listStore(r.Context(), b, req.Prefix)
	if err != nil {
		writeStoreError(w, http.StatusBadGateway, fmt.Errorf("listing %q: %w", req.Prefix, err))
		return
	}
	api.WriteJSON(w, http.StatusOK, api.CheckpointListResponse{Objects: objs})
}

// checkpointDelete deletes keys of checkpoints older than the
// newest keep ones: a node can prune, never remove the latest.
func (a *API) checkpointDelete(w http.ResponseWriter, r *http.Request) {
	var req api.CheckpointDeleteRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	if len(req.Keys) == 0 || len(req.Keys) > maxCheckpointKeys {
		api.WriteError(w, http.StatusBadRequest, fmt.Errorf("keys: want 1..%d, got %d", maxCheckpointKeys, len(req.Keys)))
		return
	}
	steps := make([]int64, len(req.Keys))
	for i, k := range req.Keys {
		s, ok := ckptKeyStep(k)
		if !ok {
			api.WriteError(w, http.StatusBadRequest, fmt.Errorf("key %q is not a checkpoint key", k))
			return
		}
		steps[i] = s
	}
	c, b, code, err := a.ckptTarget(r.Context(), r.PathValue("fleet"))
	if err != nil {
		writeStoreError(w, code, err)
		return
	}
	objs, err := listStore(r.Context(), b, "manifests/")
	if err != nil {
		writeStoreError(w, http.StatusBadGateway, err)
		return
	}
	var manifests []int64
	for _, o := range objs {
		if m := ckptManifestRE.FindStringSubmatch(o.Key); m != nil {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			manifests = append(manifests, n)
		}
	}
	slices.Sort(manifests)
	slices.Reverse(manifests)
	if len(manifests) < c.Keep {
		api.WriteError(w, http.StatusForbidden, fmt.Errorf("the store holds %d checkpoints, keep = %d: nothing may be deleted", len(manifests), c.Keep))
		return
	}
	oldestKept := manifests[c.Keep-1]
	for i, s := range steps {
		if s >= oldestKept {
			api.WriteError(w, http.StatusForbidden, fmt.Errorf("key %q belongs to step %d, one of the newest %d checkpoints (or newer): not deleted", req.Keys[i], s, c.Keep))
			return
		}
	}
	for _, k := range req.Keys {
		if err := b.Delete(r.Context(), k); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			writeStoreError(w, http.StatusBadGateway, fmt.Errorf("deleting %s: %w", k, err))
			return
		}
	}
	api.WriteJSON(w, http.StatusOK, map[string]int{"deleted": len(req.Keys)})
}

// checkpointEventTypes maps agent event kinds to event log types.
var checkpointEventTypes = map[string]string{
	"uploaded": "checkpoint.uploaded", "upload-failed": "checkpoint.upload_failed",
	"restored": "checkpoint.restored", "restore-failed": "checkpoint.restore_failed",
	"corrupt": "checkpoint.corrupt", "pruned": "checkpoint.pruned",
}

// failureEventEvery rate-limits repeated identical failure events (the
// agent retries with backoff; status keeps the latest anyway).
const failureEventEvery = 5 * time.Minute

// maxCheckpointEvents bounds one report's events.
const maxCheckpointEvents = 200

// checkpointReport takes a node's checkpoint state and events.
func (a *API) checkpointReport(w http.ResponseWriter, r *http.Request) {
	var req api.CheckpointReport
	if !api.DecodeBody(w, r, &req) {
		return
	}
	if len(req.Events) > maxCheckpointEvents {
		api.WriteError(w, http.StatusBadRequest, fmt.Errorf("at most %d events per report", maxCheckpointEvents))
		return
	}
	fleetName, nodeID := r.PathValue("fleet"), r.PathValue("node")
	var log []state.Event
	var restores []int64
	a.ckpts.mu.Lock()
	f := a.ckpts.fleet(fleetName)
	f.nodes[nodeID] = req.Status
	for _, ev := range req.Events {
		typ, ok := checkpointEventTypes[ev.Kind]
		if !ok {
			continue
		}
		data := map[string]string{"step": strconv.FormatInt(ev.Step, 10)}
		var msg string
		switch ev.Kind {
		case "uploaded":
			if ev.Step >= f.last.Step {
				f.last = ev
			}
			if f.failure != nil && !ev.At.Before(f.failure.At) {
				f.failure, f.lastFailMsg = nil, ""
			}
			data["bytes"] = strconv.FormatInt(ev.Bytes, 10)
			msg = fmt.Sprintf("checkpoint step %d uploaded by %s: %s in %.1fs", ev.Step, nodeID, humanBytes(ev.Bytes), ev.Seconds)
			if ev.MiBps > 0 {
				msg += fmt.Sprintf(" (%.1f MiB/s)", ev.MiBps)
			}
			if ev.Detail != "" {
				msg += "; " + ev.Detail
			}
		case "restored":
			// A report the agent resent (its answer was lost) is the same
			// restore: charged once.
			if lr := f.lastRestore; lr == nil || lr.Node != nodeID || lr.Step != ev.Step || !lr.At.Equal(ev.At) {
				restores = append(restores, ev.Bytes)
			}
			f.lastRestore = &api.CheckpointRestore{Node: nodeID, Step: ev.Step, MiBps: ev.MiBps, At: ev.At}
			if f.failure != nil && f.failure.Kind != "upload-failed" && !ev.At.Before(f.failure.At) {
				f.failure, f.lastFailMsg = nil, ""
			}
			msg = fmt.Sprintf("%s restored checkpoint step %d before starting its workers: %s in %.1fs (%.1f MiB/s)", nodeID, ev.Step, humanBytes(ev.Bytes), ev.Seconds, ev.MiBps)
		case "pruned":
			msg = fmt.Sprintf("checkpoint step %d pruned from the store (%s)", ev.Step, ev.Detail)
		default: // failures
			e := ev
			f.failure, f.failNode = &e, nodeID
			data["error_kind"] = ev.ErrorKind
			what := map[string]string{"upload-failed": "checkpoint upload failed", "restore-failed": "checkpoint restore failed", "corrupt": "checkpoint in the store is corrupt"}[ev.Kind]
			msg = fmt.Sprintf("%s on %s (step %d, %s): %s", what, nodeID, ev.Step, ev.ErrorKind, ev.Detail)
			switch ev.Kind {
			case "upload-failed":
				msg += "; training goes on from the local checkpoint dir, nothing was deleted"
			case "corrupt":
				msg += "; the previous checkpoint is used"
			}
			// The same failure, retried (or met again by the next step's
			// upload): one event per failureEventEvery.
			key := nodeID + " " + ev.Kind + " " + ev.ErrorKind
			if ev.Kind == "upload-failed" && key == f.lastFailMsg && ev.At.Sub(f.lastFailEvent) < failureEventEvery {
				continue
			}
			f.lastFailMsg, f.lastFailEvent = key, ev.At
		}
		log = append(log, state.Event{Fleet: fleetName, Node: nodeID, Type: typ, Message: msg, Data: data})
	}
	a.ckpts.mu.Unlock()
	for _, e := range log {
		a.deps.AppendEvent(r.Context(), e)
	}
	for _, b := range restores {
		a.deps.CheckpointRestored(r.Context(), fleetName, nodeID, b)
	}
	api.WriteJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

func humanBytes(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// CheckpointStatus is a fleet's checkpoint view for status; nil without
// a checkpoint block.
func (a *API) CheckpointStatus(fleetName string, c *spec.Checkpoint, now time.Time) *api.CheckpointStatus {
	if c == nil {
		return nil
	}
	out := &api.CheckpointStatus{Dir: c.Dir, Store: redactStore(c.Store), Keep: c.Keep, Access: c.Access, LastStep: -1}
	a.ckpts.mu.Lock()
	defer a.ckpts.mu.Unlock()
	f, ok := a.ckpts.fleets[fleetName]
	if !ok {
		return out
	}
	if f.last.Step >= 0 {
		out.LastStep, out.LastAt, out.Bytes, out.UploadMiBps = f.last.Step, f.last.At, f.last.Bytes, f.last.MiBps
	}
	for _, n := range slices.Sorted(maps.Keys(f.nodes)) {
		st := f.nodes[n]
		// A node that restarted knows the store's newest from its listing.
		if st.LastStep > out.LastStep {
			out.LastStep, out.LastAt, out.Bytes = st.LastStep, st.LastAt, st.LastBytes
		}
		if st.UploadMiBps > 0 && out.UploadMiBps == 0 {
			out.UploadMiBps = st.UploadMiBps
		}
		if st.Uploading != nil && out.Uploading == nil {
			t := *st.Uploading
			t.Node = n
			out.Uploading = &t
		}
		if st.Restoring != nil && out.Restoring == nil {
			t := *st.Restoring
			t.Node = n
			out.Restoring = &t
		}
	}
	if f.lastRestore != nil {
		r := *f.lastRestore
		out.LastRestore = &r
		out.RestoreMiBps = r.MiBps
	}
	if !out.LastAt.IsZero() {
		// The time is the node's clock: a node ahead of the daemon's
		// would make a fresh checkpoint look like one from the future.
		out.AgeSeconds = max(0, now.Sub(out.LastAt).Seconds())
	}
	if f.failure != nil {
		out.Error, out.ErrorKind, out.ErrorNode, out.ErrorAt = f.failure.Detail, f.failure.ErrorKind, f.failNode, f.failure.At
	}
	return out
}

// CheckpointAlerts: a failing store is an alert until the next success.
func (a *API) CheckpointAlerts(fleetName string) []api.AlertInfo {
	a.ckpts.mu.Lock()
	defer a.ckpts.mu.Unlock()
	f, ok := a.ckpts.fleets[fleetName]
	if !ok || f.failure == nil {
		return nil
	}
	var msg string
	switch f.failure.Kind {
	case "upload-failed":
		msg = fmt.Sprintf("checkpoint upload of step %d failed (%s) on %s: %s. Training goes on from the local dir; nothing is deleted until uploads succeed", f.failure.Step, f.failure.ErrorKind, f.failNode, f.failure.Detail)
	case "corrupt":
		msg = fmt.Sprintf("checkpoint step %d in the store failed verification (%s); %s restored an older one", f.failure.Step, f.failure.Detail, f.failNode)
	default:
		msg = fmt.Sprintf("checkpoint restore failed (%s) on %s: %s; its workers started with what its dir had", f.failure.ErrorKind, f.failNode, f.failure.Detail)
	}
	return []api.AlertInfo{{Kind: AlertCheckpointStore, Subject: f.failNode, Message: msg}}
}

// CheckpointBytes is the size of a fleet's latest checkpoint, measured, or
// 0 when unknown (placement then uses the spec's size_gb).
func (a *API) CheckpointBytes(fleetName string) int64 {
	a.ckpts.mu.Lock()
	defer a.ckpts.mu.Unlock()
	if f, ok := a.ckpts.fleets[fleetName]; ok {
		b := f.last.Bytes
		for _, st := range f.nodes {
			if st.LastStep >= f.last.Step && st.LastBytes > 0 {
				b = max(b, st.LastBytes)
			}
		}
		return b
	}
	return 0
}

// ForgetCheckpoints drops a destroyed fleet's reports.
func (a *API) ForgetCheckpoints(fleetName string) {
	a.ckpts.mu.Lock()
	delete(a.ckpts.fleets, fleetName)
	a.ckpts.mu.Unlock()
}

// checkpointConfig is the agent's view of training.checkpoint.
func checkpointConfig(c *spec.Checkpoint) *api.CheckpointConfig {
	if c == nil {
		return nil
	}
	return &api.CheckpointConfig{Dir: c.Dir, Store: c.Store, Keep: c.Keep, Access: c.Access}
}

// RestoreMiBps is the throughput of a fleet's last checkpoint restore, or
// 0 when none was reported.
func (a *API) RestoreMiBps(fleetName string) float64 {
	a.ckpts.mu.Lock()
	defer a.ckpts.mu.Unlock()
	if f, ok := a.ckpts.fleets[fleetName]; ok && f.lastRestore != nil {
		return f.lastRestore.MiBps
	}
	return 0
}
