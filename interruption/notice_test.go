package interruption

import (
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
