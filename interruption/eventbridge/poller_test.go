package eventbridge_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/interruption/eventbridge"
	"github.com/fleetd/fleetd/providers/aws/fakesqs"
)

const queue = "fleetd-interruptions"

// newQueue starts a fake SQS endpoint with the queue and returns the real
// SDK client pointed at it (SDK retries off, so the poller sees errors).
func newQueue(t *testing.T) (*fakesqs.Server, *sqs.Client, string) {
	t.Helper()
	fake, url := fakesqs.StartT(t, queue)
	return fake, fakesqs.NewClient(url), url
}

// recorder is a Handler that knows some instances and can fail on demand.
type recorder struct {
	mu     sync.Mutex
	known  map[string]bool
	events []eventbridge.Event
	failN  map[string]int // event id → failures left
}

func (r *recorder) handle(_ context.Context, ev eventbridge.Event) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	if r.failN[ev.ID] > 0 {
		r.failN[ev.ID]--
		return false, errors.New("state store unavailable")
	}
	for _, id := range ev.Instances {
		if r.known[id] {
			return true, nil
		}
	}
	return false, nil
}

func (r *recorder) snapshot() []eventbridge.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]eventbridge.Event(nil), r.events...)
}

// start runs the poller until the test ends and checks it stops promptly.
func start(t *testing.T, p *eventbridge.Poller) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context was cancelled")
		}
	})
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, 10*time.Millisecond, what, cond)
}

func TestPollerEventKinds(t *testing.T) {
	fake, client, _ := newQueue(t)
	rec := &recorder{known: map[string]bool{"i-0b662ef9931388ba0": true, "i-0abcdef1234567890": true, "i-0c773f0a042499cb1": true}}
	p := &eventbridge.Poller{Client: client, Queue: queue, Handler: rec.handle, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}

	bodies := []string{
		string(readEvent(t, "spot-interruption.json")),
		string(readEvent(t, "spot-interruption.json")), // EventBridge delivers at least once
		string(readEvent(t, "rebalance.json")),
		string(readEvent(t, "state-change-terminated.json")),
		string(readEvent(t, "health-scheduled-change.json")),
		string(readEvent(t, "spot-interruption-hibernate.json")),
		// Another cluster's instance: ignored, and still deleted.
		strings.ReplaceAll(string(readEvent(t, "rebalance.json")), "i-0b662ef9931388ba0", "i-0eeeeeeeeeeeeeeee"),
		string(readEvent(t, "state-change-running.json")), // not a notice
		"this is not an EventBridge event",                // unparseable
	}
	for _, b := range bodies {
		if _, err := fake.Send(queue, b); err != nil {
			t.Fatal(err)
		}
	}
	start(t, p)
	waitFor(t, "the queue to drain", func() bool {
		v, f := fake.Counts(queue)
		return v+f == 0 && p.Stats().Received == uint64(len(bodies))
	})

	want := eventbridge.Stats{Received: 9, Handled: 6, Ignored: 2, Unparseable: 1, Errors: 0}
	if got := p.Stats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	kinds := map[string][]interruption.Kind{} // event id → kinds seen
	for _, ev := range rec.snapshot() {
		kinds[ev.ID] = append(kinds[ev.ID], ev.Kind)
	}
	for id, want := range map[string][]interruption.Kind{
		"1e5527d7-bb36-4607-3370-4164db56a40e": {interruption.SpotInterruption, interruption.SpotInterruption}, // the duplicate, same id
		"5d2e1b9a-7c1f-4f0e-9b6a-2a8e1c3d4e5f": {interruption.Rebalance, interruption.Rebalance},               // known and unknown instance
		"9c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f": {interruption.Lost},
		"7bf73129-1428-4cd3-a780-95db273d1602": {interruption.Maintenance},
		"2f6638e8-cc47-4718-4481-5275ec67b51f": {interruption.SpotInterruption},
	} {
		if got := kinds[id]; len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
			t.Errorf("event %s: kinds %v, want %v", id, got, want)
		}
	}
	if len(kinds) != 5 {
		t.Errorf("handler saw %d distinct events, want 5 (ignored and unparseable ones never reach it)", len(kinds))
	}
	// The poller asks SQS the way NTH and Karpenter do.
	req := fake.LastRequest("ReceiveMessage")
	if req["MaxNumberOfMessages"] != float64(10) || req["WaitTimeSeconds"] != float64(20) || req["VisibilityTimeout"] != float64(20) {
		t.Errorf("ReceiveMessage request %v, want 10 messages, 20 s wait, 20 s visibility", req)
	}
	if fake.Calls("GetQueueUrl") != 1 {
		t.Errorf("GetQueueUrl called %d times, want 1", fake.Calls("GetQueueUrl"))
	}
}

func TestPollerHandlerErrorRedelivers(t *testing.T) {
	fake, client, base := newQueue(t)
	body := readEvent(t, "spot-interruption.json")
	ev, err := eventbridge.Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{known: map[string]bool{ev.Instances[0]: true}, failN: map[string]int{ev.ID: 1}}
	p := &eventbridge.Poller{
		Client: client, Queue: fake.QueueURL(base, queue), Handler: rec.handle,
		VisibilityTimeout: time.Second, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	}
	if _, err := fake.Send(queue, string(body)); err != nil {
		t.Fatal(err)
	}
	start(t, p)
	waitFor(t, "the first, failing delivery", func() bool { return p.Stats().Errors == 1 })
	if v, f := fake.Counts(queue); v+f != 1 {
		t.Fatalf("message gone after a handler error (visible %d, in flight %d)", v, f)
	}
	waitFor(t, "the redelivery", func() bool { return p.Stats().Handled == 1 })
	waitFor(t, "the delete", func() bool { v, f := fake.Counts(queue); return v+f == 0 })
	evs := rec.snapshot()
	if len(evs) != 2 || evs[0].ID != evs[1].ID {
		t.Errorf("handler saw %d events, want the same event twice", len(evs))
	}
	if got := p.Stats(); got.Received != 2 || got.Errors != 1 || got.Handled != 1 {
		t.Errorf("stats %+v", got)
	}
	if fake.Calls("GetQueueUrl") != 0 {
		t.Error("a queue URL was looked up")
	}
}

func TestPollerBacksOffOnSQSErrors(t *testing.T) {
	fake, client, _ := newQueue(t)
	fake.FailNext("ReceiveMessage", "InternalError", 3)
	rec := &recorder{known: map[string]bool{"i-0b662ef9931388ba0": true}}
	p := &eventbridge.Poller{Client: client, Queue: queue, Handler: rec.handle, MinBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}
	if _, err := fake.Send(queue, string(readEvent(t, "rebalance.json"))); err != nil {
		t.Fatal(err)
	}
	start(t, p)
	waitFor(t, "the event after the errors", func() bool { return p.Stats().Handled == 1 })
	if got := p.Stats().Errors; got != 3 {
		t.Errorf("errors %d, want 3", got)
	}
}

func TestPollerMissingQueue(t *testing.T) {
	_, client, _ := newQueue(t)
	p := &eventbridge.Poller{Client: client, Queue: "no-such-queue", Handler: (&recorder{}).handle}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := p.Run(ctx)
	var missing *types.QueueDoesNotExist
	if !errors.As(err, &missing) {
		t.Errorf("Run on a missing queue: %v, want QueueDoesNotExist", err)
	}
	if err := (&eventbridge.Poller{}).Run(ctx); err == nil {
		t.Error("Run without client and handler succeeded")
	}
}
