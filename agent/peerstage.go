package agent

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/agent/ckpt"
	"github.com/fleetd/fleetd/agentwire"
)

// Peer staging: a node that finished staging serves its copy to the
// fleet's other nodes; the daemon points a new node of the same zone at it
// (agentwire.PeerStaging) with a grant only the serving node can check: an
// HMAC keyed by the serving node's own token, which the daemon derives and
// the requester never sees (agentwire.PeerGrant).

// Peer routes on the serving agent.
const (
	peerListPath = "/v1/peer/stage/list"
	peerFilePath = "/v1/peer/stage/file"
)

// peerServer serves this node's finished staged copies.
type peerServer struct {
	token string // this node's token: the grants' key
	now   func() time.Time

	mu   sync.Mutex
	dirs map[string]string // mount path -> directory on disk
	url  string
}

// add makes a finished copy servable.
func (p *peerServer) add(mountPath, dir string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dirs == nil {
		p.dirs = map[string]string{}
	}
	p.dirs[mountPath] = dir
}

// start listens on addr (host:port; port 0 picks one) until ctx ends and
// returns the base URL peers use.
func (p *peerServer) start(ctx context.Context, addr string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.url != "" {
		return p.url, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("peer staging: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+peerListPath, p.list)
	mux.HandleFunc("GET "+peerFilePath, p.file)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	p.url = "http://" + ln.Addr().String()
	return p.url, nil
}

// authorize checks a request's grant and returns the staged directory it
// asks for.
func (p *peerServer) authorize(w http.ResponseWriter, r *http.Request) (string, bool) {
	g := agentwire.PeerGrant{Requester: r.Header.Get("X-Fleetd-Peer"), MAC: strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")}
	g.Expires, _ = strconv.ParseInt(r.Header.Get("X-Fleetd-Peer-Expires"), 10, 64)
	if g.Requester == "" || time.Unix(g.Expires, 0).Before(p.now()) || !hmac.Equal([]byte(g.MAC), []byte(agentwire.PeerMAC(p.token, g.Requester, g.Expires))) {
		http.Error(w, "forbidden: no valid peer grant", http.StatusForbidden)
		return "", false
	}
	p.mu.Lock()
	dir, ok := p.dirs[r.URL.Query().Get("path")]
	p.mu.Unlock()
	if !ok {
		http.Error(w, "no staged copy at that path", http.StatusNotFound)
		return "", false
	}
	return dir, true
}

func (p *peerServer) list(w http.ResponseWriter, r *http.Request) {
	dir, ok := p.authorize(w, r)
	if !ok {
		return
	}
	var objs []ckpt.Object
	err := filepath.WalkDir(dir, func(f string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, f)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !safeKey(key) || !de.Type().IsRegular() {
			return nil // the marker, parts, anything not a copied file
		}
		info, err := de.Info()
		if err != nil {
			return err
		}
		objs = append(objs, ckpt.Object{Key: key, Size: info.Size()})
		return nil
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(objs)
}

func (p *peerServer) file(w http.ResponseWriter, r *http.Request) {
	dir, ok := p.authorize(w, r)
	if !ok {
		return
	}
	key := r.URL.Query().Get("key")
	if !safeKey(key) {
		http.Error(w, "bad key", http.StatusBadRequest)
		return
	}
	http.ServeFile(w, r, filepath.Join(dir, filepath.FromSlash(key)))
}

// peerSource reads a peer's staged copy (a stageSource).
type peerSource struct {
	p  agentwire.PeerStaging
	mp string
	me string
	hc *http.Client
}

func (s peerSource) String() string { return "peer " + s.p.Node }

func (s peerSource) get(ctx context.Context, route string, q url.Values) (*http.Response, error) {
	q.Set("path", s.mp)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(s.p.URL, "/")+route+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.p.Grant.MAC)
	req.Header.Set("X-Fleetd-Peer", s.me)
	req.Header.Set("X-Fleetd-Peer-Expires", strconv.FormatInt(s.p.Grant.Expires, 10))
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("peer %s: %s: %s", s.p.Node, resp.Status, strings.TrimSpace(string(b)))
	}
	return resp, nil
}

func (s peerSource) List(ctx context.Context, prefix string) ([]ckpt.Object, error) {
	resp, err := s.get(ctx, peerListPath, url.Values{})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var objs []ckpt.Object
	if err := json.NewDecoder(io.LimitReader(resp.Body, 256<<20)).Decode(&objs); err != nil {
		return nil, fmt.Errorf("peer %s: list: %w", s.p.Node, err)
	}
	out := objs[:0]
	for _, o := range objs {
		if strings.HasPrefix(o.Key, prefix) {
			out = append(out, o)
		}
	}
	return out, nil
}

func (s peerSource) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	resp, err := s.get(ctx, peerFilePath, url.Values{"key": {key}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// peerFor asks the daemon for a same-zone peer with a finished copy of d.
func (e *elastic) peerFor(ctx context.Context, d agentwire.DataConfig) (stageSource, string, bool) {
	var p agentwire.PeerStaging
	err := e.dc.post(ctx, "staging/peer", agentwire.PeerStagingRequest{Source: d.Source, MountPath: d.MountPath}, &p)
	if err != nil {
		var se *statusError
		if errors.As(err, &se) && se.Code == http.StatusNotFound {
			// No peer, or the source is expected to cost less: the daemon says which.
			e.a.log.Info("copying from the source, not a peer", "why", se.Body)
		} else {
			e.a.log.Warn("asking the daemon for a staging peer failed; copying from the source", "err", err)
		}
		return nil, "", false
	}
	e.a.log.Info("staging from a peer in the zone", "peer", p.Node, "url", p.URL, "why", p.Reason)
	return peerSource{p: p, mp: d.MountPath, me: e.node, hc: &http.Client{}}, p.Node, true
}

// servePeer starts this node's peer server (once) on its fleet address
// and offers dir; the URL goes out with the final staging report.
func (e *elastic) servePeer(ctx context.Context, mountPath, dir string) string {
	e.peers.mu.Lock()
	e.peers.token, e.peers.now = e.a.opts.Config.Token, time.Now
	e.peers.mu.Unlock()
	e.peers.add(mountPath, dir)
	port := e.a.opts.PeerPort
	if p := e.trainingConfig().PeerPort; p > 0 {
		// The spec's port wins: the fleet's firewall rules name it.
		port = p
	}
	u, err := e.peers.start(ctx, net.JoinHostPort(e.id.Addr, strconv.Itoa(port)))
	if err != nil {
		e.a.log.Warn("cannot serve the staged copy to peers", "err", err)
		return ""
	}
	return u
}
