package rendezvous

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleetd/internal/ctxtime"
)

// Client is the agents' side of the rendezvous API. Every call retries
// with exponential backoff on connection errors and 429/502/503/504 (the
// daemon may be restarting) until its context ends; other HTTP errors are
// returned at once as *APIError.
type Client struct {
	base  string
	token string
	hc    *http.Client

	// MinBackoff and MaxBackoff bound retry delays; 200ms and 10s when zero.
	MinBackoff, MaxBackoff time.Duration
	// RequestTimeout bounds one attempt of join, heartbeat and leave (and
	// is added to WatchWait for a watch); 15s when zero.
	RequestTimeout time.Duration
	// WatchWait is how long one long-poll waits at the daemon; 30s when
	// zero, and at most half the http.Client's own Timeout.
	WatchWait time.Duration
}

// NewClient returns a client for the daemon at baseURL (e.g.
// "https://10.0.0.1:8443") with a per-node bearer token. httpClient nil
// means http.DefaultClient.
func NewClient(baseURL, token string, httpClient *http.Client) *Client {
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), token: token, hc: httpClient}
}

// NewSession returns a random agent session id for JoinRequest.Session.
func NewSession() string {
	var b [12]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// APIError is an HTTP error answer from the daemon.
type APIError struct {
	StatusCode int
	Code       string
	Message    string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("rendezvous: HTTP %d %s: %s", e.StatusCode, e.Code, e.Message)
}

// Is lets callers match errors.Is(err, ErrUnknownFleet) and friends.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrUnknownFleet:
		return e.Code == CodeUnknownFleet
	case ErrUnauthenticated:
		return e.StatusCode == http.StatusUnauthorized
	case ErrForbidden:
		return e.StatusCode == http.StatusForbidden
	case ErrClosed:
		return e.Code == CodeUnavailable
	}
	return false
}

// Join joins the fleet's rendezvous and returns the node's view.
func (c *Client) Join(ctx context.Context, fleet string, req JoinRequest) (View, error) {
	var v View
	err := c.do(ctx, http.MethodPost, fleet, "join", nil, req, &v, c.requestTimeout())
	return v, err
}

// Heartbeat keeps the node alive and reports its workers.
func (c *Client) Heartbeat(ctx context.Context, fleet string, req HeartbeatRequest) (HeartbeatResponse, error) {
	var r HeartbeatResponse
	err := c.do(ctx, http.MethodPost, fleet, "heartbeat", nil, req, &r, c.requestTimeout())
	return r, err
}

// Leave removes the node gracefully.
func (c *Client) Leave(ctx context.Context, fleet, node string) error {
	return c.do(ctx, http.MethodPost, fleet, "leave", nil, LeaveRequest{NodeID: node}, nil, c.requestTimeout())
}

// Watch long-polls until the node's view Differs from last (the view the
// agent acts on; the zero View returns the current view at once) and
// returns it. It only returns early when ctx ends, so an agent's loop is
//
//	for v := joined; ; { v, err = c.Watch(ctx, fleet, node, v); … act on v … }
func (c *Client) Watch(ctx context.Context, fleet, node string, last View) (View, error) {
	wait := c.watchWait()
	q := url.Values{"node": {node}, "after": {strconv.Itoa(last.Round)}, "wait": {wait.String()}}
	if last.State != "" {
		q.Set("state", string(last.State))
	}
	q.Set("listening", strconv.FormatBool(last.MasterListening))
	for {
		start := time.Now()
		var v View
		if err := c.do(ctx, http.MethodGet, fleet, "watch", q, nil, &v, wait+c.requestTimeout()); err != nil {
			return View{}, err
		}
		if v.Differs(last) {
			return v, nil
		}
		// The daemon answers an unchanged view only when the wait is over;
		// should it ever answer early, do not spin.
		if time.Since(start) < wait/2 {
			if err := ctxtime.Sleep(ctx, c.minBackoff()); err != nil {
				return View{}, fmt.Errorf("rendezvous watch: %w", err)
			}
		}
	}
}

func (c *Client) minBackoff() time.Duration {
	if c.MinBackoff > 0 {
		return c.MinBackoff
	}
	return 200 * time.Millisecond
}

func (c *Client) maxBackoff() time.Duration {
	if c.MaxBackoff > 0 {
		return max(c.MaxBackoff, c.minBackoff())
	}
	return max(10*time.Second, c.minBackoff())
}

func (c *Client) requestTimeout() time.Duration {
	if c.RequestTimeout > 0 {
		return c.RequestTimeout
	}
	return 15 * time.Second
}

func (c *Client) watchWait() time.Duration {
	w := c.WatchWait
	if w <= 0 {
		w = DefaultWatchWait
	}
	w = min(w, MaxWatchWait)
	if t := c.hc.Timeout; t > 0 && w > t/2 {
		w = t / 2
	}
	return w
}

func (c *Client) do(ctx context.Context, method, fleet, op string, query url.Values, body, out any, timeout time.Duration) error {
	if !strings.HasPrefix(c.base, "http://") && !strings.HasPrefix(c.base, "https://") {
		return fmt.Errorf("rendezvous: daemon URL %q must start with http:// or https://", c.base)
	}
	u := c.base + "/v1/rendezvous/" + url.PathEscape(fleet) + "/" + op
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return fmt.Errorf("rendezvous %s: encode: %w", op, err)
		}
	}
	delay := c.minBackoff()
	for {
		retry, err := c.attempt(ctx, method, u, payload, out, timeout)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("rendezvous %s: %w (last error: %v)", op, ctx.Err(), err)
		}
		if !retry {
			return fmt.Errorf("rendezvous %s: %w", op, err)
		}
		// Full jitter in [delay/2, delay]: thousands of agents reconnecting
		// to a restarted daemon must not arrive in lockstep.
		d := delay/2 + rand.N(delay/2+1)
		if serr := ctxtime.Sleep(ctx, d); serr != nil {
			return fmt.Errorf("rendezvous %s: %w (last error: %v)", op, serr, err)
		}
		delay = min(2*delay, c.maxBackoff())
	}
}

// attempt makes one request and says whether a failure is worth a retry.
func (c *Client) attempt(ctx context.Context, method, u string, payload []byte, out any, timeout time.Duration) (retry bool, err error) {
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(actx, method, u, rd)
	if err != nil {
		return false, err
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return retryable(err), err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return true, fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode/100 == 2 {
		if out == nil || resp.StatusCode == http.StatusNoContent {
			return false, nil
		}
		if err := json.Unmarshal(b, out); err != nil {
			return false, fmt.Errorf("decode response: %w", err)
		}
		return false, nil
	}
	apiErr := &APIError{StatusCode: resp.StatusCode, Message: strings.TrimSpace(string(b))}
	var eb ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error != "" {
		apiErr.Code, apiErr.Message = eb.Code, eb.Error
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true, apiErr
	}
	return false, apiErr
}

// retryable: everything but a certificate the agent must not trust.
func retryable(err error) bool {
	var cve *tls.CertificateVerificationError
	var uae x509.UnknownAuthorityError
	var he x509.HostnameError
	var cie x509.CertificateInvalidError
	return !errors.As(err, &cve) && !errors.As(err, &uae) && !errors.As(err, &he) && !errors.As(err, &cie)
}
