package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/fleetd/fleetd/rendezvous"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client talks to a fleetd daemon.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
}

// ClientOptions configures a Client.
type ClientOptions struct {
	Token string
	// CAFingerprint pins the daemon's CA (sha256 of its DER, hex); when set
	// TLS is verified against the presented chain's root with that digest.
	CAFingerprint string
	// CACertPEM trusts this CA (alternative to the fingerprint).
	CACertPEM []byte
	Timeout   time.Duration
}

// NewClient returns a client for addr (host:port or URL; http:// is assumed
// when no scheme is given). A comma-separated list names the servers of a
// cluster: requests go to one, and move to the next when it cannot be
// reached.
func NewClient(addr string, opts ClientOptions) (*Client, error) {
	if strings.TrimSpace(addr) == "" {
		return nil, errors.New("no daemon address (use -addr or FLEETD_ADDR)")
	}
	var servers []string
	for _, a := range strings.Split(addr, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if !strings.Contains(a, "://") {
			a = "http://" + a
		}
		v, err := url.Parse(a)
		if err != nil {
			return nil, fmt.Errorf("daemon address %q: %w", a, err)
		}
		if v.Scheme != "http" && v.Scheme != "https" {
			return nil, fmt.Errorf("daemon address %q: scheme must be http or https", a)
		}
		servers = append(servers, a)
	}
	u, _ := url.Parse(servers[0])
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if u.Scheme == "https" {
		cfg, err := ClientTLSConfig(opts.CACertPEM, opts.CAFingerprint)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = cfg
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = 5 * time.Minute // long-polls set their own shorter waits
	}
	var rt http.RoundTripper = tr
	if len(servers) > 1 {
		ft, err := rendezvous.NewFailoverTransport(tr, servers)
		if err != nil {
			return nil, err
		}
		rt = ft
	}
	return &Client{base: u, token: opts.Token, http: &http.Client{Transport: rt, Timeout: timeout}}, nil
}

// ClientTLSConfig builds a TLS config that trusts caPEM and/or pins the CA
// fingerprint. With neither, the system roots are used.
func ClientTLSConfig(caPEM []byte, fingerprint string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(caPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, errors.New("CA certificate: no PEM certificate found")
		}
		cfg.RootCAs = pool
	}
	if fingerprint != "" {
		// Accept the forms people paste: hex, AB:CD:…, and "sha256:" + either
		// (the form in the agent's user-data).
		want := strings.ToLower(strings.TrimSpace(fingerprint))
		want = strings.ReplaceAll(strings.TrimPrefix(want, "sha256:"), ":", "")
		// The chain is checked by hand: the pinned CA is the trust anchor.
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: daemon presented no certificate")
			}
			pool := x509.NewCertPool()
			var found bool
			for _, c := range cs.PeerCertificates {
				sum := sha256.Sum256(c.Raw)
				if hex.EncodeToString(sum[:]) == want {
					pool.AddCert(c)
					found = true
				}
			}
			if !found {
				return fmt.Errorf("tls: daemon CA fingerprint does not match the pinned %s", want)
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: cs.ServerName})
			if err != nil {
				return fmt.Errorf("tls: verify daemon certificate: %w", err)
			}
			return nil
		}
	}
	return cfg, nil
}

// HTTPError is a non-2xx answer from the daemon.
type HTTPError struct {
	StatusCode int
	Body       Error
}

func (e *HTTPError) Error() string {
	msg := e.Body.Error
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	return fmt.Sprintf("daemon: %s (HTTP %d)", msg, e.StatusCode)
}

// IsNotFound reports whether err is a 404 from the daemon.
func IsNotFound(err error) bool {
	var he *HTTPError
	return errors.As(err, &he) && he.StatusCode == http.StatusNotFound
}

// Do performs a request with a JSON body (nil for none) and decodes the JSON
// answer into out (nil to discard).
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	u := *c.base
	u.Path = strings.TrimRight(u.Path, "/") + path
	if query != nil {
		u.RawQuery = query.Encode()
	}
	var rd *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	var req *http.Request
	var err error
	if rd != nil {
		req, err = http.NewRequestWithContext(ctx, method, u.String(), rd)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, u.String(), nil)
	}
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("daemon at %s: %w", c.base.Host, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		he := &HTTPError{StatusCode: resp.StatusCode}
		b, _ := ReadAllLimited(resp.Body, 4<<20)
		if json.Unmarshal(b, &he.Body) != nil {
			he.Body.Error = strings.TrimSpace(string(b))
		}
		return he
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode daemon response: %w", err)
	}
	return nil
}

// call is Do for a route answering with a T.
func call[T any](ctx context.Context, c *Client, method, path string, body any) (T, error) {
	var out T
	err := c.Do(ctx, method, path, nil, body, &out)
	return out, err
}

func (c *Client) Status(ctx context.Context) (Status, error) {
	return call[Status](ctx, c, http.MethodGet, "/v1/status", nil)
}

// Cluster asks the server the client talks to who answers and who leads.
func (c *Client) Cluster(ctx context.Context) (ClusterInfo, error) {
	return call[ClusterInfo](ctx, c, http.MethodGet, "/v1/cluster", nil)
}

func (c *Client) Plan(ctx context.Context, req ApplyRequest) (Plan, error) {
	return call[Plan](ctx, c, http.MethodPost, "/v1/plan", req)
}

func (c *Client) Apply(ctx context.Context, req ApplyRequest) (ApplyResponse, error) {
	return call[ApplyResponse](ctx, c, http.MethodPost, "/v1/fleets", req)
}

func (c *Client) Fleet(ctx context.Context, name string) (FleetDetail, error) {
	return call[FleetDetail](ctx, c, http.MethodGet, "/v1/fleets/"+url.PathEscape(name), nil)
}

func (c *Client) Destroy(ctx context.Context, name string) (FleetSummary, error) {
	return call[FleetSummary](ctx, c, http.MethodDelete, "/v1/fleets/"+url.PathEscape(name), nil)
}

// Projects returns the daemon's projects (GET /v1/projects).
func (c *Client) Projects(ctx context.Context) (ProjectsResponse, error) {
	return call[ProjectsResponse](ctx, c, http.MethodGet, "/v1/projects", nil)
}

// SetProject creates or replaces a project (PUT /v1/projects/{name}, admin).
func (c *Client) SetProject(ctx context.Context, name string, req ProjectRequest) (ProjectChanged, error) {
	return call[ProjectChanged](ctx, c, http.MethodPut, "/v1/projects/"+url.PathEscape(name), req)
}

// DeleteProject deletes a project (DELETE /v1/projects/{name}, admin).
func (c *Client) DeleteProject(ctx context.Context, name string) (ProjectChanged, error) {
	return call[ProjectChanged](ctx, c, http.MethodDelete, "/v1/projects/"+url.PathEscape(name), nil)
}

// Queue returns the fleets waiting to start (GET /v1/queue).
func (c *Client) Queue(ctx context.Context) (QueueResponse, error) {
	return call[QueueResponse](ctx, c, http.MethodGet, "/v1/queue", nil)
}

// Resume un-pauses a paused fleet.
func (c *Client) Resume(ctx context.Context, name string) error {
	return c.Do(ctx, http.MethodPost, "/v1/fleets/"+url.PathEscape(name)+"/resume", nil, nil, nil)
}

// Events returns events after since; with wait > 0 it long-polls.
func (c *Client) Events(ctx context.Context, since uint64, limit int, wait time.Duration) (EventsResponse, error) {
	q := url.Values{"since": {strconv.FormatUint(since, 10)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	var r EventsResponse
	return r, c.Do(ctx, http.MethodGet, "/v1/events", q, nil, &r)
}
