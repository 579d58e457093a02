// Package imds reads AWS EC2 instance metadata (IMDSv2) on the VM and
// turns spot instance-actions, rebalance recommendations and scheduled
// maintenance into interruption notices.
package imds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultBaseURL is the IMDS address on every EC2 instance.
const DefaultBaseURL = "http://169.254.169.254"

// Header names of the IMDSv2 token flow.
const (
	HeaderTokenTTL = "X-aws-ec2-metadata-token-ttl-seconds"
	HeaderToken    = "X-aws-ec2-metadata-token"
)

// MaxTokenTTL is the longest token lifetime IMDS grants (6 h).
const MaxTokenTTL = 21600 * time.Second

const (
	defaultTimeout  = 2 * time.Second
	defaultTokenTTL = time.Hour
	// refreshMargin: a token with less than this left is renewed before use,
	// so a request never goes out with a token that expires in flight.
	refreshMargin = 15 * time.Second
	maxBody       = 64 << 10
)

// ErrNotFound is returned (wrapped) for a 404: on IMDS that is the normal
// answer of the notice endpoints while nothing is scheduled.
var ErrNotFound = errors.New("imds: not found")

// StatusError is a non-2xx answer other than 404.
type StatusError struct {
	Path string
	Code int
	Body string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("imds: GET %s: HTTP %d: %s", e.Path, e.Code, e.Body)
}

// Client is an IMDSv2-only client. The zero value with BaseURL set is
// ready to use; it is safe for concurrent use. IMDSv1 is deliberately not
// supported: fleetd launches instances with v2 required.
type Client struct {
	// BaseURL is the IMDS root without /latest, e.g. DefaultBaseURL or a
	// local emulator's http://127.0.10.3:41234.
	BaseURL string
	// HTTPClient defaults to a client with a 2 s timeout (IMDS is local;
	// a slow answer means it is unreachable, e.g. a hop-limit problem).
	HTTPClient *http.Client
	// TokenTTL is the token lifetime requested; default 1 h, at most 6 h.
	TokenTTL time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time

	mu      sync.Mutex
	token   string
	expires time.Time
}

// NewClient returns a client for baseURL after checking it is an absolute
// http(s) URL.
func NewClient(baseURL string) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("imds: base URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("imds: base URL %q: want http://host[:port]", baseURL)
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/")}, nil
}

func (c *Client) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Client) httpClient() *http.Client {
	if c.HTTPClient != nil {
		return c.HTTPClient
	}
	return &http.Client{Timeout: defaultTimeout}
}

func (c *Client) ttl() time.Duration {
	switch {
	case c.TokenTTL <= 0:
		return defaultTokenTTL
	case c.TokenTTL > MaxTokenTTL:
		return MaxTokenTTL
	case c.TokenTTL < time.Second:
		return time.Second
	}
	return c.TokenTTL
}

// Get fetches /latest/<path>, e.g. "meta-data/instance-id". A 404 returns
// an error wrapping ErrNotFound. A 401 (token expired or revoked, e.g. after
// the IMDS restarted) drops the token and retries once with a fresh one.
func (c *Client) Get(ctx context.Context, path string) ([]byte, error) {
	path = strings.TrimLeft(path, "/")
	for attempt := 0; ; attempt++ {
		tok, err := c.Token(ctx)
		if err != nil {
			return nil, err
		}
		body, code, err := c.do(ctx, http.MethodGet, "/latest/"+path, http.Header{HeaderToken: {tok}})
		if err != nil {
			return nil, err
		}
		switch {
		case code == http.StatusOK:
			return body, nil
		case code == http.StatusNotFound:
			return nil, fmt.Errorf("%s: %w", path, ErrNotFound)
		case code == http.StatusUnauthorized && attempt == 0:
			c.dropToken(tok)
			continue
		}
		return nil, &StatusError{Path: path, Code: code, Body: snippet(body)}
	}
}

// Token returns a token valid for at least the refresh margin, fetching a
// new one with PUT /latest/api/token when needed.
func (c *Client) Token(ctx context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ttl := c.ttl()
	margin := refreshMargin
	if ttl < 4*refreshMargin {
		margin = ttl / 4
	}
	if c.token != "" && c.now().Add(margin).Before(c.expires) {
		return c.token, nil
	}
	start := c.now()
	secs := strconv.Itoa(int(ttl / time.Second))
	body, code, hdr, err := c.doHeader(ctx, http.MethodPut, "/latest/api/token", http.Header{HeaderTokenTTL: {secs}})
	if err != nil {
		return "", fmt.Errorf("imds: token: %w", err)
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("imds: token: %w", &StatusError{Path: "api/token", Code: code, Body: snippet(body)})
	}
	tok := strings.TrimSpace(string(body))
	if tok == "" {
		return "", errors.New("imds: token: empty token")
	}
	// Trust the granted TTL when IMDS echoes it; count from before the
	// request so clock skew can only make us refresh early.
	if granted, err := strconv.Atoi(hdr.Get(HeaderTokenTTL)); err == nil && granted > 0 {
		ttl = time.Duration(granted) * time.Second
	}
	c.token, c.expires = tok, start.Add(ttl)
	return tok, nil
}

func (c *Client) dropToken(tok string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token == tok {
		c.token = ""
	}
}

func (c *Client) do(ctx context.Context, method, path string, h http.Header) ([]byte, int, error) {
	body, code, _, err := c.doHeader(ctx, method, path, h)
	return body, code, err
}

func (c *Client) doHeader(ctx context.Context, method, path string, h http.Header) ([]byte, int, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.BaseURL, "/")+path, nil)
	if err != nil {
		return nil, 0, nil, err
	}
	for k, v := range h {
		for _, x := range v {
			req.Header.Add(k, x)
		}
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, 0, nil, fmt.Errorf("%s %s: reading body: %w", method, path, err)
	}
	if len(body) > maxBody {
		return nil, 0, nil, fmt.Errorf("%s %s: body larger than %d bytes", method, path, maxBody)
	}
	return body, resp.StatusCode, resp.Header, nil
}

func snippet(b []byte) string {
	const n = 200
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}
