package rendezvous

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/internal/freeport"
)

func TestFailoverTransport(t *testing.T) {
	var got []string
	srv := func(name string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got = append(got, name+":"+string(b))
			io.WriteString(w, name)
		}))
		t.Cleanup(s.Close)
		return s
	}
	// A port nothing listens on: connections are refused. From freeport:
	// a closed ":0" port can be handed to the servers below.
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + addr
	b, c := srv("b"), srv("c")
	tr, err := NewFailoverTransport(nil, []string{dead, b.URL, c.URL})
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: tr}
	// The URL's own host is replaced by the current server.
	resp, err := hc.Post(dead+"/v1/x", "text/plain", strings.NewReader("hello"))
	if err != nil {
		t.Fatalf("a dead first server must fail over to the next: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "b" || len(got) != 1 || got[0] != "b:hello" {
		t.Fatalf("answered by %q, server log %v; want b with the body resent", body, got)
	}
	if tr.Current() != b.URL {
		t.Errorf("current %s, want %s (it stays on the server that answered)", tr.Current(), b.URL)
	}
	b.Close()
	resp, err = hc.Get(dead + "/v1/y")
	if err != nil {
		t.Fatalf("after b died: %v", err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "c" {
		t.Errorf("answered by %q, want c", body)
	}
	c.Close()
	if _, err := hc.Get(dead + "/v1/z"); err == nil {
		t.Error("every server dead: want an error")
	}
	if _, err := NewFailoverTransport(nil, []string{"ftp://x"}); err == nil {
		t.Error("a non-http server URL is accepted")
	}
}
