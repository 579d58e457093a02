package gcemeta_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetd/fleetd/interruption/gcemeta"
	"github.com/fleetd/fleetd/interruption/gcemeta/fakemeta"
)

func TestClient(t *testing.T) {
	f := fakemeta.New(fakemeta.Options{InstanceID: "42", Zone: "us-east1-c", Name: "vm"})
	defer f.Close()
	c := gcemeta.NewClient(f.BaseURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	id, zone, name, err := c.Identity(ctx)
	if err != nil || id != "42" || zone != "us-east1-c" || name != "vm" {
		t.Fatalf("Identity: %q %q %q %v", id, zone, name, err)
	}
	if _, err := c.Get(ctx, "instance/no-such-key"); !errors.Is(err, gcemeta.ErrNotFound) {
		t.Errorf("Get of a missing key: %v, want ErrNotFound", err)
	}

	v, err := c.Get(ctx, gcemeta.PathPreempted)
	if err != nil || string(v.Body) != "FALSE" || v.ETag == "" {
		t.Fatalf("Get: %q %q %v", v.Body, v.ETag, err)
	}
	// A stale last_etag returns at once with the current value.
	f.Set(gcemeta.PathPreempted, "TRUE")
	start := time.Now()
	v2, err := c.Wait(ctx, gcemeta.PathPreempted, v.ETag, time.Minute)
	if err != nil || string(v2.Body) != "TRUE" || v2.ETag == v.ETag || time.Since(start) > 5*time.Second {
		t.Fatalf("Wait after a change: %q %v (%v)", v2.Body, err, time.Since(start))
	}
	// A current last_etag blocks until the change.
	go func() {
		time.Sleep(50 * time.Millisecond)
		f.Set(gcemeta.PathPreempted, "FALSE")
	}()
	v3, err := c.Wait(ctx, gcemeta.PathPreempted, v2.ETag, time.Minute)
	if err != nil || string(v3.Body) != "FALSE" {
		t.Fatalf("Wait for a change: %q %v", v3.Body, err)
	}
	// Without a change it returns the same value at timeout_sec.
	v4, err := c.Wait(ctx, gcemeta.PathPreempted, v3.ETag, time.Second)
	if err != nil || v4.ETag != v3.ETag {
		t.Fatalf("Wait that times out: %q %q %v", v4.Body, v4.ETag, err)
	}

	t.Setenv(gcemeta.EnvHost, f.Host)
	if got := gcemeta.NewClient("").BaseURL; got != f.BaseURL() {
		t.Errorf("NewClient with %s set: %q, want %q", gcemeta.EnvHost, got, f.BaseURL())
	}
}
