package fakemeta_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/fleetd/fleetd/interruption/gcemeta/fakemeta"
)

func TestFakeRequiresFlavor(t *testing.T) {
	f := fakemeta.New(fakemeta.Options{})
	defer f.Close()
	for _, tc := range []struct {
		header map[string]string
		want   int
	}{
		{nil, http.StatusForbidden},
		{map[string]string{"Metadata-Flavor": "google"}, http.StatusForbidden},
		{map[string]string{"Metadata-Flavor": "Google", "X-Forwarded-For": "10.0.0.1"}, http.StatusForbidden},
		{map[string]string{"Metadata-Flavor": "Google"}, http.StatusOK},
	} {
		req, _ := http.NewRequest(http.MethodGet, f.BaseURL()+"instance/id", nil)
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want || resp.Header.Get("Metadata-Flavor") != "Google" {
			t.Errorf("headers %v: HTTP %d flavor %q, want %d", tc.header, resp.StatusCode, resp.Header.Get("Metadata-Flavor"), tc.want)
		}
	}
}

// get reads url as a metadata client does; it is safe off the test goroutine.
func get(url string) (value, etag string, err error) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Metadata-Flavor", "Google")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("GET %s: HTTP %d %s", url, resp.StatusCode, b)
	}
	return string(b), resp.Header.Get("ETag"), nil
}

func TestHangingGet(t *testing.T) {
	f := fakemeta.New(fakemeta.Options{})
	defer f.Close()
	key := f.BaseURL() + "instance/preempted"
	v, etag, err := get(key)
	if err != nil || v != "FALSE" || etag == "" {
		t.Fatalf("GET: %q etag %q %v", v, etag, err)
	}
	// A differing last_etag returns at once.
	if v2, e2, err := get(key + "?wait_for_change=true&last_etag=stale"); err != nil || v2 != "FALSE" || e2 != etag {
		t.Errorf("stale last_etag: %q %q %v", v2, e2, err)
	}
	// The current one blocks until Set.
	got := make(chan string, 1)
	go func() {
		v, _, err := get(key + "?wait_for_change=true&timeout_sec=30&last_etag=" + etag)
		if err != nil {
			v = err.Error()
		}
		got <- v
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, w := f.Stats(); w == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the hanging GET never parked")
		}
	}
	select {
	case v := <-got:
		t.Fatalf("hanging GET returned %q before any change", v)
	default:
	}
	f.Set("instance/preempted", "TRUE")
	select {
	case v := <-got:
		if v != "TRUE" {
			t.Errorf("hanging GET returned %q, want TRUE", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("hanging GET not woken by Set")
	}
	// Close wakes hanging GETs instead of waiting out their timeout.
	go func() { _, _, _ = get(key + "?wait_for_change=true") }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, w := f.Stats(); w == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second hanging GET never parked")
		}
	}
	done := make(chan struct{})
	go func() { f.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for a hanging GET")
	}
}
