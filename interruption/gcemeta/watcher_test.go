package gcemeta_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/interruption/gcemeta"
	"github.com/fleetd/fleetd/interruption/gcemeta/fakemeta"
)

// run starts a watcher against fake and collects its notices and errors.
type run struct {
	mu      sync.Mutex
	notices []interruption.Notice
	errs    []error
	got     chan struct{} // receives once per notice
	done    chan error
	cancel  context.CancelFunc
}

func start(t *testing.T, w *gcemeta.Watcher) *run {
	t.Helper()
	r := &run{got: make(chan struct{}, 16), done: make(chan error, 1)}
	w.OnError = func(err error) { r.mu.Lock(); r.errs = append(r.errs, err); r.mu.Unlock() }
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		r.done <- w.Run(ctx, func(n interruption.Notice) {
			r.mu.Lock()
			r.notices = append(r.notices, n)
			r.mu.Unlock()
			r.got <- struct{}{}
		})
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *run) stop(t *testing.T) {
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			t.Errorf("Run: %v", err)
		}
		if ok {
			close(r.done)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func (r *run) snapshot() ([]interruption.Notice, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]interruption.Notice(nil), r.notices...), append([]error(nil), r.errs...)
}

// waitHanging waits until n hanging GETs are parked on the fake.
func waitHanging(t *testing.T, f *fakemeta.Server, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if _, w := f.Stats(); w >= n {
			return
		}
	}
	t.Fatalf("the watcher never parked %d hanging GETs", n)
}

func TestWatcherReactsToPreemption(t *testing.T) {
	f := fakemeta.New(fakemeta.Options{Zone: "europe-west4-b", Name: "node-7-abc", Spot: true})
	defer f.Close()
	w := &gcemeta.Watcher{Client: gcemeta.NewClient(f.BaseURL()), Node: "node-7"}
	r := start(t, w)
	waitHanging(t, f, 2)

	before := time.Now()
	f.Set(gcemeta.PathPreempted, "TRUE")
	select {
	case <-r.got:
	case <-time.After(time.Second): // generous: the hanging GET returns at once
		t.Fatal("no notice within 1 s of instance/preempted turning TRUE")
	}
	after := time.Now()
	notices, errs := r.snapshot()
	n := notices[0]
	if n.Kind != interruption.Preempted || n.Node != "node-7" || n.Instance != "europe-west4-b/node-7-abc" || n.Source != "gce-metadata" || n.Validate() != nil {
		t.Errorf("notice %+v", n)
	}
	if n.Deadline.Before(before.Add(30*time.Second)) || n.Deadline.After(after.Add(30*time.Second)) {
		t.Errorf("deadline %v, want 30 s after the change (%v..%v)", n.Deadline, before, after)
	}

	f.Set(gcemeta.PathMaintenance, string(gcemeta.TerminateOnHostMaintenance))
	select {
	case <-r.got:
	case <-time.After(time.Second):
		t.Fatal("no maintenance notice")
	}
	// Flapping values do not repeat either notice.
	f.Set(gcemeta.PathPreempted, "FALSE")
	f.Set(gcemeta.PathPreempted, "TRUE")
	f.Set(gcemeta.PathMaintenance, "NONE")
	f.Set(gcemeta.PathMaintenance, string(gcemeta.MigrateOnHostMaintenance))
	time.Sleep(100 * time.Millisecond)
	notices, errs = r.snapshot()
	if len(notices) != 2 || notices[1].Kind != interruption.Maintenance || notices[1].Detail != "instance/maintenance-event=TERMINATE_ON_HOST_MAINTENANCE" {
		t.Errorf("notices %+v, want one preempted and one maintenance", notices)
	}
	if len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
}

func TestWatcherSeesEarlierPreemption(t *testing.T) {
	f := fakemeta.New(fakemeta.Options{})
	defer f.Close()
	f.Set(gcemeta.PathPreempted, "TRUE")
	r := start(t, &gcemeta.Watcher{Client: gcemeta.NewClient(f.BaseURL()), Instance: "given/id"})
	select {
	case <-r.got:
	case <-time.After(5 * time.Second):
		t.Fatal("no notice for a VM preempted before the watcher started")
	}
	notices, _ := r.snapshot()
	if notices[0].Instance != "given/id" || notices[0].Kind != interruption.Preempted {
		t.Errorf("notice %+v", notices[0])
	}
}

func TestWatcherBacksOffAndRecovers(t *testing.T) {
	f := fakemeta.New(fakemeta.Options{})
	defer f.Close()
	f.FailNext(6, http.StatusServiceUnavailable)
	r := start(t, &gcemeta.Watcher{Client: gcemeta.NewClient(f.BaseURL()), MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	waitHanging(t, f, 2)
	f.Set(gcemeta.PathPreempted, "TRUE")
	select {
	case <-r.got:
	case <-time.After(5 * time.Second):
		t.Fatal("no notice after the server recovered")
	}
	_, errs := r.snapshot()
	if len(errs) != 6 {
		t.Errorf("%d errors reported, want the 6 failed requests: %v", len(errs), errs)
	}
}

func TestWatcherRejectsImpostor(t *testing.T) {
	f := fakemeta.New(fakemeta.Options{})
	defer f.Close()
	f.OmitFlavor(true)
	f.Set(gcemeta.PathPreempted, "TRUE")
	r := start(t, &gcemeta.Watcher{Client: gcemeta.NewClient(f.BaseURL()), MinBackoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	time.Sleep(100 * time.Millisecond)
	notices, errs := r.snapshot()
	if len(notices) != 0 {
		t.Errorf("notices %+v from a server without Metadata-Flavor", notices)
	}
	if len(errs) == 0 || !errors.Is(errs[0], gcemeta.ErrNotMetadataServer) {
		t.Errorf("errors %v, want ErrNotMetadataServer", errs)
	}
}

func TestWatcherNeedsClient(t *testing.T) {
	if err := (&gcemeta.Watcher{}).Run(context.Background(), func(interruption.Notice) {}); err == nil {
		t.Error("Run without a client: nil error")
	}
}
