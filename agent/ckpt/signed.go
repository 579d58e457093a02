package ckpt

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Signer is the daemon's half of a signed store: it holds the cloud
// credentials, signs URLs for exactly the keys asked (and only keys of
// the fleet's checkpoint layout), lists and deletes. The agent's daemon
// client implements it over the node API (docs/checkpoints.md).
type Signer interface {
	// Sign returns a URL per key for method (GET or PUT), valid until
	// the returned expiry.
	Sign(ctx context.Context, method string, keys []string) (map[string]string, time.Time, error)
	List(ctx context.Context, prefix string) ([]Object, error)
	Delete(ctx context.Context, keys []string) error
}

// SignedStore is a Store whose reads and writes go to URLs the daemon
// signed: the node needs no credentials for the store's cloud.
type SignedStore struct {
	signer Signer
	hc     *http.Client
	name   string
	// SendMD5 sends Content-MD5 with each PUT so the store verifies the
	// bytes (S3 does; a GCS V4 URL would have to sign the header).
	SendMD5 bool

	mu    sync.Mutex
	cache map[string]signedURL // method + " " + key
}

type signedURL struct {
	url     string
	expires time.Time
}

// signMargin: a URL that expires sooner than this is signed again.
const signMargin = time.Minute

// maxSignBatch bounds one Sign call.
const maxSignBatch = 500

// NewSignedStore returns a store on a daemon signer; hc does the
// transfers (nil: a client without timeouts, as transfers are long; ctx
// bounds them).
func NewSignedStore(signer Signer, hc *http.Client, name string) *SignedStore {
	if hc == nil {
		hc = &http.Client{}
	}
	return &SignedStore{signer: signer, hc: hc, name: name, cache: map[string]signedURL{}}
}

func (s *SignedStore) String() string { return s.name + " (signed URLs)" }

// Prepare signs URLs for many keys at once, ahead of a transfer.
func (s *SignedStore) Prepare(ctx context.Context, method string, keys []string) error {
	now := time.Now()
	var need []string
	s.mu.Lock()
	for _, k := range keys {
		if u, ok := s.cache[method+" "+k]; !ok || u.expires.Sub(now) < signMargin {
			need = append(need, k)
		}
	}
	s.mu.Unlock()
	for len(need) > 0 {
		batch := need[:min(len(need), maxSignBatch)]
		need = need[len(batch):]
		urls, exp, err := s.signer.Sign(ctx, method, batch)
		if err != nil {
			return s.signErr(method, batch[0], err)
		}
		s.mu.Lock()
		for _, k := range batch {
			u, ok := urls[k]
			if !ok {
				s.mu.Unlock()
				return &StoreError{Op: "sign " + method + " " + s.name, Key: k, Kind: KindFailed, Err: fmt.Errorf("the daemon signed no URL for it")}
			}
			s.cache[method+" "+k] = signedURL{url: u, expires: exp}
		}
		s.mu.Unlock()
	}
	return nil
}

func (s *SignedStore) signErr(method, key string, err error) error {
	if _, ok := err.(*StoreError); ok {
		return err
	}
	kind := KindFailed
	if k, ok := transportKind(err); ok {
		kind = k
	}
	return &StoreError{Op: "sign " + method + " " + s.name, Key: key, Kind: kind, Err: err}
}

func (s *SignedStore) url(ctx context.Context, method, key string) (string, error) {
	if err := s.Prepare(ctx, method, []string{key}); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cache[method+" "+key].url, nil
}

func (s *SignedStore) List(ctx context.Context, prefix string) ([]Object, error) {
	objs, err := s.signer.List(ctx, prefix)
	if err != nil {
		return nil, s.signErr("LIST", prefix, err)
	}
	return objs, nil
}

func (s *SignedStore) Delete(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	if err := s.signer.Delete(ctx, keys); err != nil {
		return s.signErr("DELETE", keys[0], err)
	}
	return nil
}

func (s *SignedStore) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	u, err := s.url(ctx, http.MethodGet, key)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, &StoreError{Op: "read " + s.name, Key: key, Kind: KindFailed, Err: err}
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, s.httpErr("read", key, 0, nil, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, s.httpErr("read", key, resp.StatusCode, resp.Body, nil)
	}
	return resp.Body, nil
}

func (s *SignedStore) Put(ctx context.Context, key string, r io.Reader, size int64, md5 []byte) error {
	u, err := s.url(ctx, http.MethodPut, key)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, io.NopCloser(r))
	if err != nil {
		return &StoreError{Op: "write " + s.name, Key: key, Kind: KindFailed, Err: err}
	}
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	if s.SendMD5 && md5 != nil {
		req.Header.Set("Content-MD5", base64.StdEncoding.EncodeToString(md5))
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return s.httpErr("write", key, 0, nil, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return s.httpErr("write", key, resp.StatusCode, resp.Body, nil)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	return nil
}

// httpErr classifies a failed transfer: S3 and GCS answer XML with a
// code (AccessDenied, NoSuchBucket, BadDigest, ...).
func (s *SignedStore) httpErr(op, key string, code int, body io.Reader, err error) error {
	if err != nil {
		kind := KindFailed
		if k, ok := transportKind(err); ok {
			kind = k
		}
		return &StoreError{Op: op + " " + s.name, Key: key, Kind: kind, Err: err}
	}
	var snippet string
	if body != nil {
		b, _ := io.ReadAll(io.LimitReader(body, 4096))
		snippet = xmlCode(string(b))
	}
	kind := KindFailed
	switch {
	case code == http.StatusForbidden || code == http.StatusUnauthorized:
		kind = KindDenied
	case code == http.StatusNotFound:
		kind = KindNotFound
	case snippet == "BadDigest" || snippet == "InvalidDigest":
		kind = KindCorrupt
	}
	msg := fmt.Sprintf("HTTP %d", code)
	if snippet != "" {
		msg += " " + snippet
	}
	return &StoreError{Op: op + " " + s.name, Key: key, Kind: kind, Err: fmt.Errorf("%s", msg)}
}

// xmlCode extracts <Code>...</Code> from an S3/GCS error body.
func xmlCode(body string) string {
	i := strings.Index(body, "<Code>")
	j := strings.Index(body, "</Code>")
	if i < 0 || j < i {
		return ""
	}
	return body[i+len("<Code>") : j]
}
