package gcemeta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fleetd/fleetd/internal/ctxtime"
	"github.com/fleetd/fleetd/interruption"
)

// Defaults of a Watcher.
const (
	// DefaultWaitTimeout is timeout_sec of each hanging GET: long enough to
	// keep requests rare, short enough to notice a dead connection.
	DefaultWaitTimeout = 60 * time.Second
	DefaultMinBackoff  = time.Second
	DefaultMaxBackoff  = 30 * time.Second
	// PreemptionLead: a preempted Spot VM gets 30 s from ACPI soft-off to
	// hard-off.
	PreemptionLead = 30 * time.Second
	// MaintenanceLead: maintenance-event changes 60 s before the event.
	MaintenanceLead = 60 * time.Second
	// Source names the notices' channel.
	Source = "gce-metadata"
)

// Watcher follows instance/preempted and instance/maintenance-event and
// emits a Preempted notice (deadline now+30 s) and a Maintenance notice
// (deadline now+60 s), each at most once. Run one Run per Watcher.
type Watcher struct {
	Client *Client
	// Node is copied into every notice (fleetd's node id).
	Node string
	// Instance is copied into every notice; when empty it is read from
	// instance/zone and instance/name as "ZONE/NAME", the gcp provider's
	// instance id.
	Instance string
	// WaitTimeout is timeout_sec of the hanging GETs; default DefaultWaitTimeout.
	WaitTimeout time.Duration
	// MinBackoff and MaxBackoff bound the exponential back-off after an
	// error; defaults DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// OnError, if set, receives every error (from the watching goroutines,
	// serialised); watching goes on.
	OnError func(error)
	// Now is the clock for deadlines; default time.Now.
	Now func() time.Time

	mu       sync.Mutex
	instance string
}

// Run watches until ctx is done, calling emit from this goroutine for
// each notice. It returns nil when ctx is cancelled.
func (w *Watcher) Run(ctx context.Context, emit func(interruption.Notice)) error {
	if w.Client == nil {
		return errors.New("gcemeta watcher: no client")
	}
	ctx, cancel := context.WithCancel(ctx)
	notices := make(chan interruption.Notice)
	errs := make(chan error)
	var wg sync.WaitGroup
	wg.Go(func() { w.watch(ctx, PathPreempted, w.preempted, notices, errs) })
	wg.Go(func() { w.watch(ctx, PathMaintenance, w.maintenance, notices, errs) })
	defer func() { cancel(); wg.Wait() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-notices:
			emit(n)
		case err := <-errs:
			if w.OnError != nil {
				w.OnError(err)
			}
		}
	}
}

// watch follows one key: a plain GET for the current value and ETag, then
// hanging GETs with last_etag, so a change between two requests is never
// missed. judge returns the notice the value calls for, if any; after
// sending one the key is done.
func (w *Watcher) watch(ctx context.Context, path string, judge func(context.Context, []byte) (*interruption.Notice, error), notices chan<- interruption.Notice, errs chan<- error) {
	minB, maxB := w.MinBackoff, w.MaxBackoff
	if minB <= 0 {
		minB = DefaultMinBackoff
	}
	if maxB < minB {
		maxB = max(DefaultMaxBackoff, minB)
	}
	timeout := w.WaitTimeout
	if timeout <= 0 {
		timeout = DefaultWaitTimeout
	}
	report := func(err error) {
		select {
		case errs <- err:
		case <-ctx.Done():
		}
	}
	backoff := minB
	etag := ""
	for ctx.Err() == nil {
		var (
			v   Value
			err error
		)
		if etag == "" {
			v, err = w.Client.Get(ctx, path)
		} else {
			v, err = w.Client.Wait(ctx, path, etag, timeout)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			report(err)
			if ctxtime.Sleep(ctx, backoff) != nil {
				return
			}
			backoff = min(2*backoff, maxB)
			continue
		}
		backoff = minB
		if v.ETag == "" {
			// Without an ETag a hanging GET cannot say "after this value":
			// poll instead, gently.
			if ctxtime.Sleep(ctx, minB) != nil {
				return
			}
		}
		changed := v.ETag != etag || etag == ""
		etag = v.ETag
		if !changed {
			continue // timeout_sec passed without a change
		}
		n, err := judge(ctx, v.Body)
		if err != nil {
			report(err)
			continue
		}
		if n != nil {
			select {
			case notices <- *n:
			case <-ctx.Done():
			}
			return
		}
	}
}

func (w *Watcher) preempted(ctx context.Context, body []byte) (*interruption.Notice, error) {
	p, err := ParsePreempted(body)
	if err != nil || !p {
		return nil, err
	}
	return &interruption.Notice{
		Node: w.Node, Instance: w.instanceID(ctx), Kind: interruption.Preempted,
		Deadline: w.now().Add(PreemptionLead), Source: Source,
		Detail: PathPreempted + "=TRUE", ID: "gce-metadata:preempted",
	}, nil
}

func (w *Watcher) maintenance(ctx context.Context, body []byte) (*interruption.Notice, error) {
	e, err := ParseMaintenanceEvent(body)
	if err != nil || !e.Pending() {
		return nil, err
	}
	return &interruption.Notice{
		Node: w.Node, Instance: w.instanceID(ctx), Kind: interruption.Maintenance,
		Deadline: w.now().Add(MaintenanceLead), Source: Source,
		Detail: PathMaintenance + "=" + string(e), ID: "gce-metadata:maintenance-event:" + string(e),
	}, nil
}

func (w *Watcher) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
}

// instanceID returns Instance, or "ZONE/NAME" read from the metadata
// server (remembered once read; "" while it cannot be read, which must
// not delay a notice: the node id identifies it too).
func (w *Watcher) instanceID(ctx context.Context) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.Instance != "" {
		return w.Instance
	}
	if w.instance != "" {
		return w.instance
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	zv, err := w.Client.Get(ctx, PathZone)
	if err != nil {
		return ""
	}
	nv, err := w.Client.Get(ctx, PathName)
	if err != nil {
		return ""
	}
	zone, err1 := ParseZone(zv.Body)
	name, err2 := ParseName(nv.Body)
	if err1 != nil || err2 != nil {
		return ""
	}
	w.instance = zone + "/" + name
	return w.instance
}

// Identity reads the instance's id, zone and name.
func (c *Client) Identity(ctx context.Context) (id, zone, name string, err error) {
	iv, err := c.Get(ctx, PathID)
	if err != nil {
		return "", "", "", err
	}
	zv, err := c.Get(ctx, PathZone)
	if err != nil {
		return "", "", "", err
	}
	nv, err := c.Get(ctx, PathName)
	if err != nil {
		return "", "", "", err
	}
	if zone, err = ParseZone(zv.Body); err != nil {
		return "", "", "", err
	}
	if name, err = ParseName(nv.Body); err != nil {
		return "", "", "", err
	}
	id, err = value(iv.Body)
	if err != nil || id == "" {
		return "", "", "", fmt.Errorf("gcemeta: bad instance/id %q", iv.Body)
	}
	return id, zone, name, nil
}
