package failscript

import (
	"slices"
	"testing"
)

func TestQueue(t *testing.T) {
	var q Queue[string]
	q.Fail(2, "a")
	q.Fail(1, "b")
	var got []string
	for range 4 {
		if e, ok := q.Serve(); ok {
			got = append(got, e)
		} else {
			got = append(got, "-")
		}
	}
	if want := []string{"a", "a", "b", "-"}; !slices.Equal(got, want) {
		t.Errorf("served %v, want %v", got, want)
	}
	q.Fail(3, "c")
	q.Recover()
	if e, ok := q.Serve(); ok {
		t.Errorf("served %q after Recover, want no failure", e)
	}
	if n := q.Calls(); n != 5 {
		t.Errorf("%d calls counted, want 5 (failed ones included)", n)
	}
}
