package rendezvous

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
)

// FailoverTransport sends every request to one server of a list (the
// servers of a fleetd cluster: any of them answers, followers forward to
// the leader) and moves to the next when that server fails. A request
// whose connection could not even be made is retried on the next server
// at once (nothing was sent); any other transport error is returned — the
// caller's own retry goes to the next server. Agents and the CLI use it so
// that losing one server costs them at most one failed call.
type FailoverTransport struct {
	base    http.RoundTripper
	servers []*url.URL

	mu  sync.Mutex
	cur int
}

// NewFailoverTransport returns a transport over base for servers (base
// URLs; only scheme and host are used).
func NewFailoverTransport(base http.RoundTripper, servers []string) (*FailoverTransport, error) {
	if base == nil {
		base = http.DefaultTransport
	}
	if len(servers) == 0 {
		return nil, errors.New("failover: no servers")
	}
	f := &FailoverTransport{base: base}
	for _, s := range servers {
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("failover: server %q is not an http(s) URL", s)
		}
		f.servers = append(f.servers, u)
	}
	return f, nil
}

// Current is the server requests go to now.
func (f *FailoverTransport) Current() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.servers[f.cur].String()
}

func (f *FailoverTransport) pick() (int, *url.URL) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur, f.servers[f.cur]
}

// advance moves past server i unless another request already did.
func (f *FailoverTransport) advance(i int) {
	f.mu.Lock()
	if f.cur == i {
		f.cur = (i + 1) % len(f.servers)
	}
	f.mu.Unlock()
}

// RoundTrip implements http.RoundTripper.
func (f *FailoverTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var lastErr error
	for attempt := range len(f.servers) {
		i, s := f.pick()
		r := req.Clone(req.Context())
		r.URL.Scheme, r.URL.Host, r.Host = s.Scheme, s.Host, ""
		if attempt > 0 && req.Body != nil {
			if req.GetBody == nil {
				return nil, lastErr
			}
			body, err := req.GetBody()
			if err != nil {
				return nil, lastErr
			}
			r.Body = body
		}
		resp, err := f.base.RoundTrip(r)
		if err == nil {
			return resp, nil
		}
		lastErr = err
		f.advance(i)
		if !notSent(err) || req.Context().Err() != nil {
			return nil, err
		}
	}
	return nil, lastErr
}

// notSent reports a failure to connect: the request never left.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
