package imds

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers/local/imdsfake"
)

func TestPollEmitsEachNoticeOnce(t *testing.T) {
	f := newFake(t)
	w := &Watcher{Client: f.client(t, time.Hour), Node: "node-1"}
	s := f.server()

	got, err := w.Poll(t.Context())
	if err != nil || len(got) != 0 {
		t.Fatalf("quiet IMDS: %v, %v", got, err)
	}

	at := f.clk.Now().Add(2 * time.Minute)
	s.SetSpotAction("terminate", at)
	s.SetRebalance(f.clk.Now())
	s.SetScheduledEvents([]imdsfake.ScheduledEvent{
		{Code: "instance-retirement", EventID: "ev-1", State: "active", NotBefore: at, NotAfter: at.Add(time.Hour)},
		{Code: "system-reboot", EventID: "ev-old", State: "completed", NotBefore: at, NotAfter: at},
	})
	got, err = w.Poll(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[interruption.Kind]interruption.Notice{}
	for _, n := range got {
		kinds[n.Kind] = n
	}
	if len(got) != 3 || len(kinds) != 3 {
		t.Fatalf("want spot, rebalance and one active maintenance notice, got %+v", got)
	}
	spot := kinds[interruption.SpotInterruption]
	if spot.Node != "node-1" || spot.Instance != "i-0abc" || !spot.Deadline.Equal(at) || spot.Source != Source {
		t.Fatalf("spot notice %+v", spot)
	}
	if m := kinds[interruption.Maintenance]; m.ID != "ev-1" || !m.Deadline.Equal(at) {
		t.Fatalf("maintenance notice %+v", m)
	}

	// Same state, and a spot time that moves (as some mocks do): nothing new.
	s.SetSpotAction("terminate", at.Add(time.Second))
	if got, err = w.Poll(t.Context()); err != nil || len(got) != 0 {
		t.Fatalf("second poll: %+v, %v", got, err)
	}
	// A new scheduled event is new.
	s.SetScheduledEvents([]imdsfake.ScheduledEvent{{Code: "system-reboot", EventID: "ev-2", State: "active", NotBefore: at, NotAfter: at}})
	if got, err = w.Poll(t.Context()); err != nil || len(got) != 1 || got[0].ID != "ev-2" {
		t.Fatalf("new event: %+v, %v", got, err)
	}
}

func TestPollReportsMalformedBodiesButKeepsOthers(t *testing.T) {
	// IMDS that serves a broken instance-action but a valid rebalance.
	inner := imdsfake.New(imdsfake.Identity{InstanceID: "i-1"}, nil)
	inner.SetRebalance(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/latest/"+PathInstanceAction {
			_, _ = w.Write([]byte(`{"action":`))
			return
		}
		inner.ServeHTTP(w, r)
	}))
	defer ts.Close()
	c, _ := NewClient(ts.URL)
	w := &Watcher{Client: c}
	got, err := w.Poll(t.Context())
	if err == nil {
		t.Fatal("malformed instance-action not reported")
	}
	if len(got) != 1 || got[0].Kind != interruption.Rebalance {
		t.Fatalf("got %+v, want the rebalance notice despite the error", got)
	}
}

func TestRunSeesInjectedNotice(t *testing.T) {
	f := newFake(t)
	c := f.client(t, time.Hour)
	c.Now = nil // real time: Run uses a real ticker
	f.server().Now = nil
	w := &Watcher{Client: c, Interval: 50 * time.Millisecond, Node: "n"}
	var errs []error
	w.OnError = func(err error) { errs = append(errs, err) }

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	notices := make(chan interruption.Notice, 4)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, func(n interruption.Notice) { notices <- n }) }()

	time.Sleep(120 * time.Millisecond) // let a few quiet polls happen first
	f.server().SetSpotAction("terminate", time.Now().Add(2*time.Minute))
	select {
	case n := <-notices:
		if n.Kind != interruption.SpotInterruption {
			t.Fatalf("got %+v", n)
		}
	case <-time.After(5 * time.Second): // generous: the interval is 50 ms
		t.Fatal("notice not seen")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v", err)
	}
	select {
	case n := <-notices:
		t.Fatalf("notice emitted twice: %+v", n)
	default:
	}
	if len(errs) != 0 {
		t.Fatalf("poll errors: %v", errs)
	}
	if err := (&Watcher{}).Run(t.Context(), nil); err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("Run without client: %v", err)
	}
}

// TestRunPollsSpotActionBetweenFullPolls: the spot notice is read every
// ActionInterval, the other notices only every Interval. With an hour's
// Interval, a spot notice injected after the first poll is seen; a
// rebalance recommendation is not.
func TestRunPollsSpotActionBetweenFullPolls(t *testing.T) {
	f := newFake(t)
	c := f.client(t, time.Hour)
	c.Now = nil
	f.server().Now = nil
	w := &Watcher{Client: c, Interval: time.Hour, ActionInterval: 20 * time.Millisecond, Node: "n"}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	notices := make(chan interruption.Notice, 4)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, func(n interruption.Notice) { notices <- n }) }()
	time.Sleep(100 * time.Millisecond) // the first, full poll is done
	f.server().SetRebalance(time.Now())
	f.server().SetSpotAction("terminate", time.Now().Add(2*time.Minute))
	select {
	case n := <-notices:
		if n.Kind != interruption.SpotInterruption || n.Node != "n" || n.Instance == "" {
			t.Fatalf("got %+v, want the spot notice with node and instance", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("spot notice not seen between full polls")
	}
	time.Sleep(100 * time.Millisecond)
	cancel()
	<-done
	select {
	case n := <-notices:
		t.Fatalf("%s notice seen before the next full poll, or the spot notice twice", n.Kind)
	default:
	}
}

func TestPollScheduledEventsAnswers(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 30, 0, 0, time.UTC)
	event := `[{"Code":"system-reboot","Description":"scheduled reboot","EventId":"ev-9","NotBefore":"` +
		at.Format(MaintenanceTimeLayout) + `","NotAfter":"` + at.Add(time.Hour).Format(MaintenanceTimeLayout) + `","State":"active"}]`
	cases := []struct {
		name    string
		status  int
		body    string
		notices int
		wantErr bool
	}{
		{"empty list", http.StatusOK, "[]", 0, false},
		{"one active event", http.StatusOK, event, 1, false},
		// Some IMDS implementations answer 404 instead of "[]".
		{"404 means no events", http.StatusNotFound, "<html><h1>404 - Not Found</h1></html>", 0, false},
		{"500 is an error", http.StatusInternalServerError, "internal error", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inner := imdsfake.New(imdsfake.Identity{InstanceID: "i-1"}, nil)
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/latest/"+PathScheduled {
					w.WriteHeader(tc.status)
					_, _ = w.Write([]byte(tc.body))
					return
				}
				inner.ServeHTTP(w, r)
			}))
			defer ts.Close()
			c, err := NewClient(ts.URL)
			if err != nil {
				t.Fatal(err)
			}

			w := &Watcher{Client: c}
			got, err := w.Poll(t.Context())
			if (err != nil) != tc.wantErr || len(got) != tc.notices {
				t.Fatalf("Poll = %d notices, %v; want %d, error %v", len(got), err, tc.notices, tc.wantErr)
			}
			var se *StatusError
			if tc.wantErr && (!errors.As(err, &se) || se.Code != tc.status) {
				t.Fatalf("Poll error %v, want a StatusError with HTTP %d", err, tc.status)
			}

			// Run reports every poll's error to OnError, which the agent
			// logs: a 404 must give it nothing to report, poll after poll.
			var reported atomic.Int32
			rw := &Watcher{Client: c, Interval: 5 * time.Millisecond, OnError: func(error) { reported.Add(1) }}
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Millisecond)
			defer cancel()
			if err := rw.Run(ctx, func(interruption.Notice) {}); err != nil {
				t.Fatal(err)
			}
			if n := reported.Load(); (n > 0) != tc.wantErr {
				t.Fatalf("Run reported %d errors, want errors: %v", n, tc.wantErr)
			}
		})
	}
}
