// Package gcemeta is the agent-side watcher of the GCE metadata server:
// it follows instance/preempted and instance/maintenance-event with
// hanging GETs (wait_for_change) and emits an interruption.Notice the
// moment either changes. Package fakemeta is a fake metadata server for
// tests.
package gcemeta

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Metadata server constants.
const (
	// DefaultBaseURL is the metadata server's v1 root. The link-local IP,
	// not metadata.google.internal, so no DNS is needed to read it.
	DefaultBaseURL = "http://169.254.169.254/computeMetadata/v1/"
	// EnvHost overrides the host (host:port), as in Google's own clients.
	EnvHost = "GCE_METADATA_HOST"
	// FlavorHeader must be "Google" on every request, and is on every
	// genuine response.
	FlavorHeader = "Metadata-Flavor"
	FlavorValue  = "Google"
)

// Keys the watcher reads, relative to the v1 root.
const (
	PathPreempted   = "instance/preempted"
	PathMaintenance = "instance/maintenance-event"
	PathID          = "instance/id"
	PathZone        = "instance/zone"
	PathName        = "instance/name"
)

// Errors of a Client.
var (
	ErrNotFound = errors.New("gcemeta: no such metadata key")
	// ErrNotMetadataServer: the answer lacked Metadata-Flavor: Google, so
	// it came from something else (a proxy, a captive portal).
	ErrNotMetadataServer = errors.New("gcemeta: response is not from a metadata server (no Metadata-Flavor: Google)")
)

// Value is a metadata value with its ETag.
type Value struct {
	Body []byte
	ETag string
}

// Client reads the metadata server.
type Client struct {
	// BaseURL is the v1 root, ending in "/".
	BaseURL string
	// HTTP is the client to use; it must not have an overall timeout
	// shorter than a hanging GET. Default: no proxy, 2 s dial timeout.
	HTTP *http.Client
	// GetTimeout bounds a plain GET. Default 5 s.
	GetTimeout time.Duration
}

// NewClient returns a client for baseURL; "" means $GCE_METADATA_HOST
// when set, else DefaultBaseURL.
func NewClient(baseURL string) *Client {
	if baseURL == "" {
		baseURL = DefaultBaseURL
		if h := os.Getenv(EnvHost); h != "" {
			baseURL = "http://" + h + "/computeMetadata/v1/"
		}
	}
	if !strings.HasSuffix(baseURL, "/") {
		baseURL += "/"
	}
	return &Client{BaseURL: baseURL}
}

var defaultHTTP = &http.Client{Transport: &http.Transport{
	Proxy:               nil, // the metadata server is link-local: never via a proxy
	DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
	MaxIdleConnsPerHost: 4,
	IdleConnTimeout:     90 * time.Second,
}}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

// Get reads a key.
func (c *Client) Get(ctx context.Context, path string) (Value, error) {
	t := c.GetTimeout
	if t <= 0 {
		t = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, t)
	defer cancel()
	return c.do(ctx, path, nil)
}

// Wait is a hanging GET: it returns when the key's ETag differs from
// lastETag (at once if it already does) or after timeout with the
// unchanged value. A lastETag of "" waits for the next change.
func (c *Client) Wait(ctx context.Context, path, lastETag string, timeout time.Duration) (Value, error) {
	q := url.Values{"wait_for_change": {"true"}}
	if lastETag != "" {
		q.Set("last_etag", lastETag)
	}
	if timeout > 0 {
		secs := int(timeout.Round(time.Second) / time.Second)
		q.Set("timeout_sec", strconv.Itoa(max(secs, 1)))
		// The server answers at timeout_sec; allow it time to.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout+10*time.Second)
		defer cancel()
	}
	return c.do(ctx, path, q)
}

func (c *Client) do(ctx context.Context, path string, q url.Values) (Value, error) {
	u := c.BaseURL + strings.TrimPrefix(path, "/")
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Value{}, fmt.Errorf("gcemeta: %w", err)
	}
	req.Header.Set(FlavorHeader, FlavorValue)
	resp, err := c.http().Do(req)
	if err != nil {
		return Value{}, fmt.Errorf("gcemeta: get %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Value{}, fmt.Errorf("gcemeta: read %s: %w", path, err)
	}
	if resp.Header.Get(FlavorHeader) != FlavorValue {
		return Value{}, fmt.Errorf("get %s: %w", path, ErrNotMetadataServer)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return Value{}, fmt.Errorf("get %s: %w", path, ErrNotFound)
	case resp.StatusCode != http.StatusOK:
		return Value{}, fmt.Errorf("gcemeta: get %s: HTTP %d: %s", path, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return Value{Body: body, ETag: resp.Header.Get("ETag")}, nil
}
