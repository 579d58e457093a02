package imdsfake

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

func newTestServer(t *testing.T) (*Server, *Clock, *httptest.Server) {
	t.Helper()
	clk := NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s := New(Identity{
		InstanceID: "i-0123456789abcdef0", InstanceType: "local.gpu1", AvailabilityZone: "local-a",
		Region: "local", LifeCycle: "spot", LocalIPv4: "127.0.10.7", AccountID: "000000000000", ImageID: "ami-local",
		PendingTime: clk.Now(),
	}, []byte("#cloud-config\n{}\n"))
	s.Now = clk.Now
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, clk, ts
}

func do(t *testing.T, method, url string, hdr map[string]string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func token(t *testing.T, base string, ttl int) string {
	t.Helper()
	code, body, hdr := do(t, http.MethodPut, base+"/latest/api/token", map[string]string{HeaderTokenTTL: strconv.Itoa(ttl)})
	if code != http.StatusOK {
		t.Fatalf("PUT token ttl=%d: HTTP %d", ttl, code)
	}
	if got := hdr.Get(HeaderTokenTTL); got != strconv.Itoa(ttl) {
		t.Fatalf("token TTL header = %q, want %d", got, ttl)
	}
	if body == "" {
		t.Fatal("empty token")
	}
	return body
}

func TestTokenRequest(t *testing.T) {
	_, _, ts := newTestServer(t)
	cases := []struct {
		name   string
		method string
		hdr    map[string]string
		want   int
	}{
		{"no ttl", http.MethodPut, nil, 400},
		{"ttl zero", http.MethodPut, map[string]string{HeaderTokenTTL: "0"}, 400},
		{"ttl negative", http.MethodPut, map[string]string{HeaderTokenTTL: "-5"}, 400},
		{"ttl too long", http.MethodPut, map[string]string{HeaderTokenTTL: "21601"}, 400},
		{"ttl not a number", http.MethodPut, map[string]string{HeaderTokenTTL: "1h"}, 400},
		{"ttl min", http.MethodPut, map[string]string{HeaderTokenTTL: "1"}, 200},
		{"ttl max", http.MethodPut, map[string]string{HeaderTokenTTL: "21600"}, 200},
		{"GET not allowed", http.MethodGet, map[string]string{HeaderTokenTTL: "60"}, 405},
		{"proxied", http.MethodPut, map[string]string{HeaderTokenTTL: "60", "X-Forwarded-For": "10.0.0.1"}, 403},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if code, _, _ := do(t, c.method, ts.URL+"/latest/api/token", c.hdr); code != c.want {
				t.Fatalf("HTTP %d, want %d", code, c.want)
			}
		})
	}
}

func TestTokenRequiredAndExpires(t *testing.T) {
	_, clk, ts := newTestServer(t)
	path := ts.URL + "/latest/meta-data/instance-id"
	tok := token(t, ts.URL, 10)

	if code, _, _ := do(t, http.MethodGet, path, nil); code != 401 {
		t.Fatalf("no token: HTTP %d, want 401", code)
	}
	if code, _, _ := do(t, http.MethodGet, path, map[string]string{HeaderToken: "bogus"}); code != 401 {
		t.Fatalf("unknown token: HTTP %d, want 401", code)
	}
	code, body, _ := do(t, http.MethodGet, path, map[string]string{HeaderToken: tok})
	if code != 200 || body != "i-0123456789abcdef0" {
		t.Fatalf("valid token: HTTP %d %q", code, body)
	}
	clk.Add(9 * time.Second)
	if code, _, _ := do(t, http.MethodGet, path, map[string]string{HeaderToken: tok}); code != 200 {
		t.Fatalf("token before expiry: HTTP %d, want 200", code)
	}
	clk.Add(time.Second)
	if code, _, _ := do(t, http.MethodGet, path, map[string]string{HeaderToken: tok}); code != 401 {
		t.Fatalf("expired token: HTTP %d, want 401", code)
	}
	if code, _, _ := do(t, http.MethodPost, path, map[string]string{HeaderToken: token(t, ts.URL, 10)}); code != 405 {
		t.Fatalf("POST: HTTP %d, want 405", code)
	}
}

func TestTokenTableIsBounded(t *testing.T) {
	s, _, _ := newTestServer(t)
	for i := 0; i < maxTokens+50; i++ {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPut, "/latest/api/token", nil)
		req.Header.Set(HeaderTokenTTL, "21600")
		s.ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Fatalf("PUT %d: HTTP %d", i, rec.Code)
		}
	}
	s.mu.Lock()
	n := len(s.tokens)
	s.mu.Unlock()
	if n > maxTokens {
		t.Fatalf("%d tokens held, want at most %d", n, maxTokens)
	}
}

func TestNoticeEndpoints(t *testing.T) {
	s, clk, ts := newTestServer(t)
	h := map[string]string{HeaderToken: token(t, ts.URL, 3600)}
	get := func(p string) (int, string) {
		code, body, _ := do(t, http.MethodGet, ts.URL+"/latest/"+p, h)
		return code, body
	}

	if code, _ := get("meta-data/spot/instance-action"); code != 404 {
		t.Fatalf("instance-action before notice: HTTP %d", code)
	}
	if code, _ := get("meta-data/events/recommendations/rebalance"); code != 404 {
		t.Fatalf("rebalance before notice: HTTP %d", code)
	}
	if code, body := get("meta-data/events/maintenance/scheduled"); code != 200 || body != "[]" {
		t.Fatalf("scheduled default: HTTP %d %q", code, body)
	}

	at := clk.Now().Add(2 * time.Minute)
	s.SetSpotAction("terminate", at)
	s.SetRebalance(clk.Now())
	s.SetScheduledEvents([]ScheduledEvent{{Code: "system-reboot", Description: "scheduled reboot", EventID: "instance-event-1", State: "active", NotBefore: at, NotAfter: at.Add(time.Hour)}})

	code, body := get("meta-data/spot/instance-action")
	var ia map[string]string
	if code != 200 || json.Unmarshal([]byte(body), &ia) != nil || ia["action"] != "terminate" || ia["time"] != "2026-03-01T12:02:00Z" {
		t.Fatalf("instance-action: HTTP %d %q", code, body)
	}
	code, body = get("meta-data/events/recommendations/rebalance")
	if code != 200 || json.Unmarshal([]byte(body), &ia) != nil || ia["noticeTime"] != "2026-03-01T12:00:00Z" {
		t.Fatalf("rebalance: HTTP %d %q", code, body)
	}
	code, body = get("meta-data/events/maintenance/scheduled")
	var evs []map[string]string
	if code != 200 || json.Unmarshal([]byte(body), &evs) != nil || len(evs) != 1 || evs[0]["NotBefore"] != "1 Mar 2026 12:02:00 GMT" || evs[0]["State"] != "active" {
		t.Fatalf("scheduled: HTTP %d %q", code, body)
	}
	s.ClearSpotAction()
	if code, _ := get("meta-data/spot/instance-action"); code != 404 {
		t.Fatalf("instance-action after clear: HTTP %d", code)
	}
}

func TestIdentityPaths(t *testing.T) {
	_, _, ts := newTestServer(t)
	h := map[string]string{HeaderToken: token(t, ts.URL, 60)}
	want := map[string]string{
		"meta-data/instance-id":                 "i-0123456789abcdef0",
		"meta-data/instance-type":               "local.gpu1",
		"meta-data/instance-life-cycle":         "spot",
		"meta-data/placement/availability-zone": "local-a",
		"meta-data/local-ipv4":                  "127.0.10.7",
		"user-data":                             "#cloud-config\n{}\n",
	}
	for p, w := range want {
		if code, body, _ := do(t, http.MethodGet, ts.URL+"/latest/"+p, h); code != 200 || body != w {
			t.Errorf("%s: HTTP %d %q, want %q", p, code, body, w)
		}
	}
	_, body, _ := do(t, http.MethodGet, ts.URL+"/latest/dynamic/instance-identity/document", h)
	var doc map[string]any
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatalf("identity document: %v: %q", err, body)
	}
	if doc["instanceId"] != "i-0123456789abcdef0" || doc["availabilityZone"] != "local-a" || doc["privateIp"] != "127.0.10.7" || doc["region"] != "local" {
		t.Fatalf("identity document: %v", doc)
	}
	if code, _, _ := do(t, http.MethodGet, ts.URL+"/latest/meta-data/no-such-thing", h); code != 404 {
		t.Fatalf("unknown path: HTTP %d", code)
	}
}

func TestServeOnListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Serve(ln, New(Identity{InstanceID: "i-1"}, nil))
	tok := token(t, l.URL, 60)
	if code, _, _ := do(t, http.MethodGet, l.URL+"/latest/user-data", map[string]string{HeaderToken: tok}); code != 404 {
		t.Fatalf("empty user-data: HTTP %d, want 404", code)
	}
	if err := l.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(l.URL + "/latest/meta-data/instance-id"); err == nil {
		t.Fatal("server still answering after Close")
	}
}
