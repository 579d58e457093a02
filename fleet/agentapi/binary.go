package agentapi

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/bootstrap"
)

// Serving agent binaries to many booting nodes at once (a fleet's start
// or a zone's replacement wave) without starving the API:
//
//   - conditional and partial requests (ETag = the sha256, If-None-Match,
//     Range, If-Range) through http.ServeContent, so a retried or resumed
//     download does not start over;
//   - gzip for clients that accept it (curl --compressed, in the
//     user-data): a Go binary shrinks by about half. Each binary is
//     compressed once, in the background, into the daemon's cache dir and
//     served from the file (sendfile, nothing held in memory); until it is
//     ready, and for Range requests, the plain file is served;
//   - at most MaxBinaryStreams downloads at a time: the rest wait for a
//     slot up to binaryQueueWait, then get 503 with Retry-After (the
//     user-data's curl retries).

// MaxBinaryStreams bounds concurrent agent downloads.
const MaxBinaryStreams = 64

// binaryQueueWait is how long a download waits for a slot.
const binaryQueueWait = 60 * time.Second

type binaryServer struct {
	log   *slog.Logger
	slots chan struct{}
	mu    sync.Mutex
	gz    map[string]*gzEntry // by sha256 of the plain binary
}

// gzEntry is one binary's compressed copy: path is set once ready.
type gzEntry struct {
	ready chan struct{}
	path  string
	size  int64
	err   error
}

func newBinaryServer(log *slog.Logger) binaryServer {
	return binaryServer{log: log, slots: make(chan struct{}, MaxBinaryStreams), gz: map[string]*gzEntry{}}
}

// gzipped returns the compressed copy of b when it is ready, and starts
// making it (once) in dir when it is not.
func (s *binaryServer) gzipped(b bootstrap.AgentBinary, dir string) (path string, ok bool) {
	if dir == "" {
		return "", false
	}
	s.mu.Lock()
	e, started := s.gz[b.SHA256]
	if !started {
		e = &gzEntry{ready: make(chan struct{})}
		s.gz[b.SHA256] = e
	}
	s.mu.Unlock()
	if !started {
		go s.compress(b, dir, e)
		return "", false
	}
	select {
	case <-e.ready:
		return e.path, e.err == nil
	default:
		return "", false
	}
}

// compress writes dir/<sha256>.gz from b (atomically: a temp file renamed
// into place), reusing one a previous run left with the same name.
func (s *binaryServer) compress(b bootstrap.AgentBinary, dir string, e *gzEntry) {
	defer close(e.ready)
	start := time.Now()
	dst := filepath.Join(dir, b.SHA256+".gz")
	e.path, e.err = dst, gzipFile(b.Path, dst)
	if e.err != nil {
		s.log.Warn("agent binary: cannot precompress; serving it uncompressed", "path", b.Path, "err", e.err)
		return
	}
	if st, err := os.Stat(dst); err == nil {
		e.size = st.Size()
	}
	s.log.Info("agent binary precompressed", "path", b.Path, "size", b.Size, "gzip_size", e.size, "took", time.Since(start).Round(time.Millisecond))
}

func gzipFile(src, dst string) (err error) {
	if _, err := os.Stat(dst); err == nil {
		return nil // named by the content's sha256: it cannot be stale
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("gzip cache: %w", err)
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("gzip %s: %w", src, err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".gz-*")
	if err != nil {
		return fmt.Errorf("gzip cache: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	zw, err := gzip.NewWriterLevel(tmp, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	if _, err := io.Copy(zw, in); err != nil {
		return fmt.Errorf("gzip %s: %w", src, err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("gzip %s: %w", src, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("gzip %s: %w", src, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("gzip cache: %w", err)
	}
	return nil
}

// acquire takes a download slot, waiting up to binaryQueueWait.
func (s *binaryServer) acquire(ctx context.Context) bool {
	select {
	case s.slots <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(binaryQueueWait)
	defer t.Stop()
	select {
	case s.slots <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

func (s *binaryServer) release() { <-s.slots }

// acceptsGzip reports whether an Accept-Encoding value allows gzip.
func acceptsGzip(h string) bool {
	for _, part := range strings.Split(h, ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(enc), "gzip") {
			continue
		}
		q := strings.ReplaceAll(params, " ", "")
		return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
	}
	return false
}

// WarmBinaryCache starts compressing the agent builds (not the full
// fleetd: that one only on demand, it takes seconds of CPU), so the first
// wave of nodes already gets them compressed.
func (a *API) WarmBinaryCache() {
	for _, b := range a.deps.AgentBinaries().All() {
		if b.Flavor != bootstrap.FlavorFull {
			a.bins.gzipped(b, a.deps.CacheDir())
		}
	}
}

// agentBinary serves the agent for the node's architecture and flavor
// (?arch=, "" is amd64; ?flavor=node for the node-store build;
// fleet/agentbinaries.go); its sha256 is in the user-data and checked
// (after decompression) before it is run.
func (a *API) agentBinary(w http.ResponseWriter, r *http.Request) {
	// Only a node of this deployment (or the admin) may download it: the
	// URL in user-data names the node, and its token must match.
	q := r.URL.Query()
	if err := a.AuthorizeNode(r, q.Get("fleet"), q.Get("node")); err != nil {
		writeAuthError(w, err)
		return
	}
	agents := a.deps.AgentBinaries()
	arch := bootstrap.NormalizeArch(q.Get("arch"))
	b, ok := agents.LookupFor(arch, q.Get("flavor") == string(bootstrap.FlavorNode))
	if !ok {
		api.WriteError(w, http.StatusNotFound, fmt.Errorf("%w; fix: %s", &bootstrap.NoAgentError{Arch: arch, Dirs: agents.Dirs}, bootstrap.AgentFix(arch, agents.Dirs)))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Fleetd-Sha256", b.SHA256)
	h.Set("Vary", "Accept-Encoding")
	etag := `"` + b.SHA256 + `"`
	// A revalidation costs no slot.
	if inm := r.Header.Get("If-None-Match"); inm != "" && (strings.Contains(inm, etag) || strings.Contains(inm, `"`+b.SHA256+`+gzip"`)) {
		h.Set("ETag", etag)
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if !a.bins.acquire(r.Context()) {
		h.Set("Retry-After", "5")
		api.WriteError(w, http.StatusServiceUnavailable, fmt.Errorf("%d agent downloads in progress; retry", MaxBinaryStreams))
		return
	}
	defer a.bins.release()
	path := b.Path
	if r.Header.Get("Range") == "" && acceptsGzip(r.Header.Get("Accept-Encoding")) {
		if gz, ok := a.bins.gzipped(b, a.deps.CacheDir()); ok {
			path, etag = gz, `"`+b.SHA256+`+gzip"`
			h.Set("Content-Encoding", "gzip")
		}
	}
	f, err := os.Open(path)
	if err != nil {
		h.Del("Content-Encoding")
		api.WriteError(w, http.StatusInternalServerError, err)
		return
	}
	defer f.Close()
	h.Set("ETag", etag)
	http.ServeContent(w, r, "", time.Time{}, f)
}
