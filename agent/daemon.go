package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/internal/ctxtime"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/rendezvous"
)

// The daemon's agent API wire shapes, shared through agentwire (agent/
// must not import fleet/).
type (
	// TrainingConfig is what the agent runs, from the fleet's current spec.
	TrainingConfig   = agentwire.TrainingConfig
	registerRequest  = agentwire.RegisterRequest
	registerResponse = agentwire.RegisterResponse
	noticeRequest    = agentwire.NoticeRequest
	logsRequest      = agentwire.LogsRequest
	doneRequest      = agentwire.DoneRequest
)

// daemonRequestTimeout bounds one call of the agent API.
const daemonRequestTimeout = 15 * time.Second

// daemonClient calls the daemon's per-node agent API. One call is one
// attempt; callers decide how hard to retry (see retry).
type daemonClient struct {
	base, fleet, node, token string
	hc                       *http.Client
}

// statusError is a non-2xx answer of the daemon.
type statusError struct {
	Op   string
	Code int
	Body string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("daemon %s: HTTP %d: %s", e.Op, e.Code, e.Body)
}

// permanent reports whether retrying err cannot help: a request the daemon
// rejects as malformed or unauthorised stays rejected. Everything else
// (connection errors, 5xx, 404 while a restarted daemon loads its state)
// is worth another attempt.
func permanent(err error) bool {
	if errors.Is(err, errNoDrainedCall) {
		return true
	}
	var se *statusError
	if errors.As(err, &se) {
		switch se.Code {
		case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestEntityTooLarge,
			http.StatusUpgradeRequired: // this agent's version is outside the daemon's window
			return true
		}
		return false
	}
	var ae *rendezvous.APIError
	if errors.As(err, &ae) {
		switch ae.StatusCode {
		case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden:
			return true
		}
		return false
	}
	var cve *tls.CertificateVerificationError
	return errors.As(err, &cve) || errors.Is(err, errPinMismatch)
}

func (c *daemonClient) post(ctx context.Context, op string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("daemon %s: encode: %w", op, err)
	}
	ctx, cancel := context.WithTimeout(ctx, daemonRequestTimeout)
	defer cancel()
	u := c.base + "/v1/agent/" + url.PathEscape(c.fleet) + "/" + url.PathEscape(c.node) + "/" + op
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("daemon %s: %w", op, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("daemon %s: %w", op, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("daemon %s: read response: %w", op, err)
	}
	if resp.StatusCode/100 != 2 {
		return &statusError{Op: op, Code: resp.StatusCode, Body: snippet(rb)}
	}
	if out != nil {
		if err := json.Unmarshal(rb, out); err != nil {
			return fmt.Errorf("daemon %s: decode response: %w", op, err)
		}
	}
	return nil
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

func (c *daemonClient) register(ctx context.Context, req registerRequest) (registerResponse, error) {
	var r registerResponse
	err := c.post(ctx, "register", req, &r)
	return r, err
}

func (c *daemonClient) notice(ctx context.Context, n interruption.Notice) error {
	return c.post(ctx, "notice", noticeRequest{Kind: string(n.Kind), Deadline: n.Deadline, Source: n.Source, Detail: n.Detail, ID: n.ID}, nil)
}

// staging reports a data copy's progress (agent/stage.go).
func (c *daemonClient) staging(ctx context.Context, r agentwire.StagingReport) error {
	return c.post(ctx, "staging", r, nil)
}

func (c *daemonClient) logs(ctx context.Context, r logsRequest) error {
	return c.post(ctx, "logs", r, nil)
}

func (c *daemonClient) drained(ctx context.Context, r agentwire.DrainedRequest) error {
	return c.post(ctx, "drained", r, nil)
}

func (c *daemonClient) done(ctx context.Context, r doneRequest) error {
	return c.post(ctx, "done", r, nil)
}

// backoff is capped exponential backoff with jitter in [d/2, d]: thousands
// of agents reconnecting to a restarted daemon must not arrive in lockstep.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur < b.min {
		b.cur = b.min
	}
	d := b.cur/2 + rand.N(b.cur/2+1)
	b.cur = min(2*b.cur, b.max)
	return d
}

func (b *backoff) reset() { b.cur = b.min }

// retry calls f until it succeeds, fails permanently or ctx ends, sleeping
// with backoff between attempts and calling progress (rate-limited by the
// caller) with each failure.
func retry(ctx context.Context, b backoff, f func(context.Context) error, progress func(attempt int, err error)) error {
	for attempt := 1; ; attempt++ {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		}
		if permanent(err) {
			return err
		}
		if progress != nil {
			progress(attempt, err)
		}
		if err := ctxtime.Sleep(ctx, b.next()); err != nil {
			return err
		}
	}
}

var errPinMismatch = errors.New("tls: no certificate presented by the daemon matches the pinned CA fingerprint")

// NewHTTPClient returns the client the agent talks to the daemon with.
// https URLs need the pinned CA fingerprint ("sha256:<hex>" of the CA
// certificate's DER) unless the system roots should be trusted (no pin);
// plain http is refused except to loopback addresses, where only the
// local provider and development daemons live, because the node token
// would otherwise cross the network in clear text.
func NewHTTPClient(daemonURL, fingerprint string, others ...string) (*http.Client, error) {
	for _, s := range append([]string{daemonURL}, others...) {
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("daemon url: %w", err)
		}
		switch u.Scheme {
		case "https":
		case "http":
			if !isLoopbackHost(u.Hostname()) {
				return nil, fmt.Errorf("daemon url %q: plain http is only allowed to a loopback address; use https", s)
			}
		default:
			return nil, fmt.Errorf("daemon url %q: want http(s)", s)
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 8
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if fingerprint != "" {
		pin, err := ParseFingerprint(fingerprint)
		if err != nil {
			return nil, fmt.Errorf("ca_fingerprint: %w", err)
		}
		// The chain is verified by hand against the pinned CA, which the
		// daemon sends along with its certificate: the agent needs no CA
		// file and no public PKI. The TLS dial is ours so the check knows
		// the host dialled (ConnectionState has no name for an IP).
		dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		base := tr.TLSClientConfig
		tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			raw, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			cfg := base.Clone()
			cfg.ServerName = host // SNI; dropped by crypto/tls for IPs
			cfg.InsecureSkipVerify = true
			cfg.VerifyConnection = func(cs tls.ConnectionState) error { return verifyPinned(cs, pin, host) }
			c := tls.Client(raw, cfg)
			if err := c.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			return c, nil
		}
	}
	if len(others) == 0 {
		return &http.Client{Transport: tr}, nil
	}
	ft, err := rendezvous.NewFailoverTransport(tr, append([]string{daemonURL}, others...))
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: ft}, nil
}

// verifyPinned checks that the presented chain leads to a presented CA
// certificate whose sha256 is pin, and that the leaf is valid for host.
func verifyPinned(cs tls.ConnectionState, pin []byte, host string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: the daemon presented no certificate")
	}
	roots := x509.NewCertPool()
	found := false
	for _, c := range cs.PeerCertificates {
		sum := sha256.Sum256(c.Raw)
		if subtle.ConstantTimeCompare(sum[:], pin) == 1 && c.IsCA {
			roots.AddCert(c)
			found = true
		}
	}
	if !found {
		return errPinMismatch
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: host}); err != nil {
		return fmt.Errorf("tls: verify daemon certificate: %w", err)
	}
	return nil
}

// isLoopbackHost: localhost, 127/8, ::1, and the unspecified addresses a
// daemon listening on 0.0.0.0 advertises (dialling them reaches this host).
func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

// noticeQueue implements NoticeReporter for the daemon: ReportNotice only
// queues, and run delivers each notice in order, retrying until the daemon
// accepts it, so a notice seen while the daemon restarts is not lost.
type noticeQueue struct {
	ch      chan interruption.Notice
	dc      *daemonClient
	b       backoff
	onError func(interruption.Notice, int, error)
	onSent  func(interruption.Notice)
}

func newNoticeQueue(dc *daemonClient, b backoff) *noticeQueue {
	// A node sees a handful of notices in its life; 64 is plenty and a
	// full queue drops (and logs) rather than blocking the metadata watch.
	return &noticeQueue{ch: make(chan interruption.Notice, 64), dc: dc, b: b}
}

func (q *noticeQueue) ReportNotice(_ context.Context, n interruption.Notice) error {
	select {
	case q.ch <- n:
		return nil
	default:
		return errors.New("notice queue full")
	}
}

func (q *noticeQueue) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-q.ch:
			err := retry(ctx, q.b, func(ctx context.Context) error { return q.dc.notice(ctx, n) },
				func(attempt int, err error) {
					if q.onError != nil {
						q.onError(n, attempt, err)
					}
				})
			if err != nil {
				if q.onError != nil && ctx.Err() == nil {
					q.onError(n, -1, err)
				}
				continue
			}
			if q.onSent != nil {
				q.onSent(n)
			}
		}
	}
}

// reachability wraps the daemon client's transport and notices the daemon
// coming back: a response after connection errors (or 502/503/504, a
// daemon restarting behind a proxy or closing its services) calls onBack
// once. Every call counts, so even an outage shorter than a heartbeat
// interval is seen.
type reachability struct {
	base   http.RoundTripper
	down   atomic.Bool
	onBack func()
}

func withReachability(hc *http.Client, onBack func()) *http.Client {
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	c := *hc
	c.Transport = &reachability{base: base, onBack: onBack}
	return &c
}

func (r *reachability) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.base.RoundTrip(req)
	if err != nil {
		if !errors.Is(req.Context().Err(), context.Canceled) {
			r.down.Store(true) // our own cancellations say nothing about the daemon
		}
		return resp, err
	}
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		r.down.Store(true)
		return resp, nil
	}
	if r.down.Swap(false) && r.onBack != nil {
		r.onBack()
	}
	return resp, nil
}
