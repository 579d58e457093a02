package freeport

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestSpanIsFreeAndBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	for _, n := range []int{1, 8} {
		base, err := Span(n)
		if err != nil {
			t.Fatal(err)
		}
		if base < lowest || base+n > low {
			t.Fatalf("span of %d at %d: outside [%d, %d)", n, base, lowest, low)
		}
		for p := base; p < base+n; p++ {
			l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
			if err != nil {
				t.Fatalf("span of %d at %d: port %d: %v", n, base, p, err)
			}
			l.Close()
		}
	}
}

// forgetHanded clears what this process handed out, as if it had just
// started.
func forgetHanded(t *testing.T) {
	t.Helper()
	handed.Lock()
	defer handed.Unlock()
	handed.set, handed.ring, handed.next = map[int]bool{}, [1024]int{}, 0
}

// fakeRange makes the ephemeral range start at low for the test.
func fakeRange(t *testing.T, low int) {
	f := filepath.Join(t.TempDir(), "range")
	if err := os.WriteFile(f, []byte(strconv.Itoa(low)+"\t60999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := rangeFile
	rangeFile = f
	t.Cleanup(func() { rangeFile = old })
	if got := ephemeralLow(); got != low {
		t.Fatalf("ephemeralLow %d, want %d", got, low)
	}
}

// TestSpanFindsTheOnlyFreeSpan: with every port of a small range taken
// but two adjacent ones, Span(2) returns those, every time, and Span(3)
// finds none.
func TestSpanFindsTheOnlyFreeSpan(t *testing.T) {
	top := lowest + 64
	fakeRange(t, top)
	held := map[int]net.Listener{}
	for p := lowest; p < top; p++ {
		if l, err := net.Listen("tcp", ":"+strconv.Itoa(p)); err == nil {
			held[p] = l // a port someone else holds is taken all the same
		}
	}
	t.Cleanup(func() {
		for _, l := range held {
			l.Close()
		}
	})
	want := -1
	for p := lowest + 10; p+1 < top; p++ {
		if held[p] != nil && held[p+1] != nil {
			want = p
			break
		}
	}
	if want < 0 {
		t.Fatalf("could not hold two adjacent ports in [%d, %d)", lowest, top)
	}
	held[want].Close()
	held[want+1].Close()
	delete(held, want)
	delete(held, want+1)
	forgetHanded(t)
	if base, err := Span(2); err != nil || base != want {
		t.Fatalf("Span(2) = %d, %v; want %d (the only free span)", base, err, want)
	}
	// Handed out and not bound yet: not handed out again.
	if base, err := Span(2); err == nil || !strings.Contains(err.Error(), "no 2 consecutive free ports") {
		t.Errorf("second Span(2) = %d, %v; want none (the only free span was just handed out)", base, err)
	}
	forgetHanded(t)
	if base, err := Span(3); err == nil || !strings.Contains(err.Error(), "no 3 consecutive free ports") {
		t.Errorf("Span(3) = %d, %v; want no span", base, err)
	}
}

func TestSpanErrors(t *testing.T) {
	if _, err := Span(0); err == nil {
		t.Error("Span(0): no error")
	}
	fakeRange(t, lowest)
	if _, err := Span(1); err == nil || !strings.Contains(err.Error(), "no room") {
		t.Errorf("ephemeral range from %d: %v, want no room", lowest, err)
	}
}

// TestPicksInARowDiffer: ports handed out lately are not handed out
// again, though nobody has bound them yet (random draws from ~12,000
// ports would repeat within 1,000 picks almost surely).
func TestPicksInARowDiffer(t *testing.T) {
	seen := map[int]bool{}
	for i := range 1000 {
		p, err := Pick()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("pick %d: port %d handed out twice", i, p)
		}
		seen[p] = true
	}
}
