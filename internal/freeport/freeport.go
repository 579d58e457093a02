// Package freeport picks TCP ports for another process (torch's store,
// moto, etcd, a daemon) to bind after the caller has let go of them. A
// port from bind(":0") comes from the kernel's ephemeral range, which
// outgoing connections draw their source ports from too, so it can be
// taken again before the child binds it (CI saw torch fail so). These
// ports are drawn at random from below that range and checked free on the
// wildcard address, which covers every loopback address.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the bottom of the range drawn from: above the well-known and
// the commonly configured service ports.
const lowest = 20000

// handed remembers the ports this process handed out lately, so that two
// picks in a row (etcd's client and peer ports, three servers' addresses)
// never give the same port before the first has been bound.
var handed = struct {
	sync.Mutex
	set  map[int]bool
	ring [1024]int // the order they were handed in; 0 is empty
	next int
}{set: map[int]bool{}}

// take reports whether base..base+n-1 were not handed out lately, and if
// so remembers them as handed now.
func take(base, n int) bool {
	handed.Lock()
	defer handed.Unlock()
	for p := base; p < base+n; p++ {
		if handed.set[p] {
			return false
		}
	}
	for p := base; p < base+n; p++ {
		delete(handed.set, handed.ring[handed.next])
		handed.ring[handed.next] = p
		handed.next = (handed.next + 1) % len(handed.ring)
		handed.set[p] = true
	}
	return true
}

// rangeFile holds the kernel's ephemeral range, "low<TAB>high".
var rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// Pick returns one port that was free on every address just now.
func Pick() (int, error) { return Span(1) }

// Span returns the first of n consecutive ports that were free on every
// address just now and that this process has not handed out lately.
func Span(n int) (int, error) {
	if n < 1 {
		return 0, fmt.Errorf("freeport: a span of %d ports", n)
	}
	hi := ephemeralLow() - n + 1 // exclusive: the whole span stays below the range
	if hi <= lowest {
		return 0, fmt.Errorf("freeport: no room for %d ports between %d and the ephemeral range at %d", n, lowest, hi+n-1)
	}
	// From a random start (so that concurrent callers rarely meet), every
	// base once: a free span is found if there is one.
	size := hi - lowest
	start := rand.IntN(size)
	for i := range size {
		if base := lowest + (start+i)%size; allFree(base, n) && take(base, n) {
			return base, nil
		}
	}
	return 0, fmt.Errorf("freeport: no %d consecutive free ports in [%d, %d)", n, lowest, hi+n-1)
}

// Addr is 127.0.0.1 with a port from Pick, as "127.0.0.1:port".
func Addr() (string, error) {
	p, err := Pick()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

func allFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// ephemeralLow is where the kernel's ephemeral ports begin; Linux's
// default when the file cannot be read (not Linux, or no /proc).
func ephemeralLow() int {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}
