package imds

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fleetd/fleetd/interruption"
)

// DefaultInterval is how often a Watcher polls. AWS advises 5 s and NTH
// polls every 2 s; IMDS is host-local and cheap, and with a 30–120 s notice
// window every second of detection latency is drain time, so we poll at 1 s.
const DefaultInterval = time.Second

// DefaultActionInterval is how often the spot interruption notice alone is
// polled between full polls. It is the notice fleetd acts on at once (an
// in-process job regroups within a fraction of a second of the agent
// seeing it), so its detection is most of the reaction time: 250 ms
// makes that 125 ms on average instead of 500 ms, for one extra local
// GET every 250 ms.
const DefaultActionInterval = 250 * time.Millisecond

// Metadata paths the watcher polls, relative to /latest/.
const (
	PathInstanceAction = "meta-data/spot/instance-action"
	PathRebalance      = "meta-data/events/recommendations/rebalance"
	PathScheduled      = "meta-data/events/maintenance/scheduled"
	PathInstanceID     = "meta-data/instance-id"
)

// Watcher polls IMDS for interruption notices and emits each distinct
// notice once. It is not safe for concurrent use; run one Run per Watcher.
type Watcher struct {
	Client *Client
	// Interval between polls of every notice; default DefaultInterval.
	Interval time.Duration
	// ActionInterval between polls of the spot interruption notice alone;
	// default DefaultActionInterval, never longer than Interval.
	ActionInterval time.Duration
	// Node is copied into every notice (fleetd's node id).
	Node string
	// Instance is copied into every notice; when empty it is read from
	// meta-data/instance-id on the first poll that can reach IMDS.
	Instance string
	// OnError, if set, receives every poll error; polling goes on.
	OnError func(error)

	seen map[string]bool
}

// Run polls until ctx is done, calling emit (from this goroutine) for each
// new notice. It returns nil when ctx is cancelled.
func (w *Watcher) Run(ctx context.Context, emit func(interruption.Notice)) error {
	if w.Client == nil {
		return errors.New("imds watcher: no client")
	}
	interval := w.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	fast := w.ActionInterval
	if fast <= 0 {
		fast = DefaultActionInterval
	}
	fast = min(fast, interval)
	t := time.NewTicker(fast)
	defer t.Stop()
	var full time.Time
	poll := func(ctx context.Context) ([]interruption.Notice, error) {
		if now := time.Now(); now.Sub(full) >= interval-fast/2 {
			full = now
			return w.Poll(ctx)
		}
		return w.pollAction(ctx)
	}
	return interruption.PollEvery(ctx, t.C, poll, emit, w.OnError)
}

// Poll reads every notice endpoint once and returns the notices not
// returned before. An endpoint that fails does not hide the others'
// notices; the errors are joined.
//
// Dedup: a spot action and a rebalance recommendation happen at most once in
// an instance's life, so they are emitted once per kind even if their time
// field changes between polls (mocks that recompute "now + 2 min" on every
// request made NTH re-handle the same ITN every poll, NTH#146). Scheduled
// events are emitted once per EventId.
func (w *Watcher) Poll(ctx context.Context) ([]interruption.Notice, error) {
	if w.seen == nil {
		w.seen = map[string]bool{}
	}
	var (
		out  []interruption.Notice
		errs []error
	)
	add := func(key string, n interruption.Notice) {
		if n, ok := w.first(key, n); ok {
			out = append(out, n)
		}
	}

	if w.Instance == "" {
		if b, err := w.Client.Get(ctx, PathInstanceID); err == nil {
			w.Instance = strings.TrimSpace(string(b))
		} else {
			errs = append(errs, err)
		}
	}

	if n, err := w.action(ctx); err != nil {
		errs = append(errs, err)
	} else if n != nil {
		add(string(interruption.SpotInterruption), *n)
	}

	if t, ok, err := read(ctx, w, PathRebalance, ParseRebalance); err != nil {
		errs = append(errs, err)
	} else if ok {
		add(string(interruption.Rebalance), RebalanceNotice(t))
	}

	// EC2 answers "[]" here when nothing is scheduled, but some IMDS
	// implementations answer 404; that means no events too, not an error
	// that Run would report on every poll.
	if evs, _, err := read(ctx, w, PathScheduled, ParseScheduledEvents); err != nil {
		errs = append(errs, err)
	} else {
		for _, ev := range evs {
			if ev.Active() {
				add("maintenance/"+ev.EventID, MaintenanceNotice(ev))
			}
		}
	}
	return out, errors.Join(errs...)
}

// pollAction reads the spot interruption notice alone, between full polls.
// Its errors are not reported: the next full poll, at most Interval away,
// reports the same failure, and reporting both would alternate two
// messages in the agent's deduplicated log.
func (w *Watcher) pollAction(ctx context.Context) ([]interruption.Notice, error) {
	key := string(interruption.SpotInterruption)
	if w.seen[key] || w.Instance == "" {
		// Seen already, or no full poll has read the instance id yet.
		return nil, nil
	}
	n, err := w.action(ctx)
	if err != nil || n == nil {
		return nil, nil
	}
	first, _ := w.first(key, *n) // not seen: checked above
	return []interruption.Notice{first}, nil
}

// first marks the notice of kind key seen and stamps it with the node and
// instance; false when a notice of that kind was returned before.
func (w *Watcher) first(key string, n interruption.Notice) (interruption.Notice, bool) {
	if w.seen[key] {
		return n, false
	}
	w.seen[key] = true
	n.Node, n.Instance = w.Node, w.Instance
	return n, true
}

// action reads spot/instance-action: nil without a notice.
func (w *Watcher) action(ctx context.Context) (*interruption.Notice, error) {
	a, ok, err := read(ctx, w, PathInstanceAction, ParseInstanceAction)
	if !ok {
		return nil, err
	}
	n := SpotNotice(a)
	return &n, nil
}

// read gets path and parses its body; ok is false without one (404) or
// when either step fails.
func read[T any](ctx context.Context, w *Watcher, path string, parse func([]byte) (T, error)) (v T, ok bool, err error) {
	body, err := w.get(ctx, path)
	if err != nil || body == nil {
		return v, false, err
	}
	v, err = parse(body)
	return v, err == nil, err
}

// get returns (nil, nil) on 404, the "nothing scheduled" answer.
func (w *Watcher) get(ctx context.Context, path string) ([]byte, error) {
	body, err := w.Client.Get(ctx, path)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("poll: %w", err)
	}
	return body, nil
}
