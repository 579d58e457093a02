package clientcache

import (
	"errors"
	"sync"
	"testing"
)

func TestGetBuildsOncePerKey(t *testing.T) {
	var c Cache[string, *int]
	builds := 0
	build := func() (*int, error) { builds++; n := builds; return &n, nil }
	a1, err1 := c.Get("a", build)
	a2, err2 := c.Get("a", build)
	b, err3 := c.Get("b", build)
	if err := errors.Join(err1, err2, err3); err != nil {
		t.Fatal(err)
	}
	if a1 != a2 || *a1 != 1 || *b != 2 || builds != 2 {
		t.Errorf("a %d then %d, b %d after %d builds; want one client per key, built once", *a1, *a2, *b, builds)
	}
}

func TestGetDoesNotKeepAFailure(t *testing.T) {
	var c Cache[string, string]
	boom := errors.New("no credentials")
	if _, err := c.Get("k", func() (string, error) { return "", boom }); !errors.Is(err, boom) {
		t.Fatalf("failed build: %v, want %v", err, boom)
	}
	got, err := c.Get("k", func() (string, error) { return "client", nil })
	if err != nil || got != "client" {
		t.Errorf("after a failure: %q, %v; want a new build", got, err)
	}
}

// TestRacingBuildsAgree: callers that both miss get the client stored
// first, whichever build finished later.
func TestRacingBuildsAgree(t *testing.T) {
	var c Cache[int, *int]
	start := make(chan struct{})
	got := make([]*int, 8)
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			cl, err := c.Get(0, func() (*int, error) { n := i; return &n, nil })
			if err != nil {
				t.Error(err)
			}
			got[i] = cl
		}()
	}
	close(start)
	wg.Wait()
	for i, cl := range got {
		if cl != got[0] {
			t.Fatalf("caller %d got client %d, caller 0 client %d", i, *cl, *got[0])
		}
	}
}
