package interruption

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestKeyIgnoresSourceAndDetails(t *testing.T) {
	a := Notice{Node: "n1", Instance: "i-1", Kind: SpotInterruption, Deadline: time.Unix(100, 0), Source: "aws-imds", ID: "x"}
	b := Notice{Node: "n1", Kind: SpotInterruption, Deadline: time.Unix(130, 0), Source: "aws-sqs", ID: "y", Detail: "other"}
	if a.Key() != b.Key() {
		t.Fatalf("same node+kind from two sources: keys %q != %q", a.Key(), b.Key())
	}
	c := a
	c.Kind = Rebalance
	if a.Key() == c.Key() {
		t.Fatalf("different kinds share key %q", a.Key())
	}
	d := a
	d.Node = "n2"
	if a.Key() == d.Key() {
		t.Fatalf("different nodes share key %q", a.Key())
	}
	// Without a node the instance identifies it, and cannot collide with a
	// node of the same name.
	e := Notice{Instance: "n1", Kind: SpotInterruption}
	if e.Key() == a.Key() {
		t.Fatalf("instance-only key collides with node key %q", a.Key())
	}
}

func TestParseKind(t *testing.T) {
	for _, k := range Kinds() {
		got, err := ParseKind(string(k))
		if err != nil || got != k {
			t.Errorf("ParseKind(%q) = %q, %v", k, got, err)
		}
	}
	for _, bad := range []string{"", "spot", "SPOT-INTERRUPTION", "terminated"} {
		if _, err := ParseKind(bad); err == nil {
			t.Errorf("ParseKind(%q): no error", bad)
		}
	}
	if Rebalance.Terminal() || !SpotInterruption.Terminal() || !Lost.Terminal() || Kind("x").Terminal() {
		t.Error("Terminal() wrong")
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		n  Notice
		ok bool
	}{
		{Notice{Node: "n", Kind: Lost, Source: "poll"}, true},
		{Notice{Instance: "i-1", Kind: Preempted, Source: "gce"}, true},
		{Notice{Kind: Lost, Source: "poll"}, false},
		{Notice{Node: "n", Kind: "nope", Source: "poll"}, false},
		{Notice{Node: "n", Kind: Lost}, false},
	}
	for i, c := range cases {
		if err := c.n.Validate(); (err == nil) != c.ok {
			t.Errorf("case %d: Validate() = %v, want ok=%v", i, err, c.ok)
		}
	}
}

// PollEvery polls at once and on each tick, emits every notice, reports
// errors, and stops when the context ends (an error of the poll that the
// cancellation cut short is not reported).
func TestPollEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	tick := make(chan time.Time)
	boom := errors.New("boom")
	polls := []func() ([]Notice, error){
		func() ([]Notice, error) { return []Notice{{Node: "a"}, {Node: "b"}}, nil },
		func() ([]Notice, error) { return []Notice{{Node: "c"}}, boom },
		func() ([]Notice, error) { cancel(); return nil, context.Canceled },
	}
	n := 0
	poll := func(context.Context) ([]Notice, error) {
		p := polls[n]
		n++
		return p()
	}
	var emitted []string
	var reported []error
	done := make(chan error)
	go func() {
		done <- PollEvery(ctx, tick, poll, func(x Notice) { emitted = append(emitted, x.Node) }, func(err error) { reported = append(reported, err) })
	}()
	tick <- time.Time{} // the first poll ran at once; these two start the others
	tick <- time.Time{}
	if err := <-done; err != nil { // the third poll ended the context
		t.Fatalf("PollEvery = %v, want nil when the context ends", err)
	}
	if n != 3 || len(emitted) != 3 || emitted[0] != "a" || emitted[2] != "c" {
		t.Errorf("%d polls emitted %v, want 3 polls emitting a, b, c", n, emitted)
	}
	if len(reported) != 1 || !errors.Is(reported[0], boom) {
		t.Errorf("reported %v, want only boom", reported)
	}
}
