package agentapi

import (
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/api"
)

func TestMeasuredRates(t *testing.T) {
	r := measuredRates([]api.StagingReport{
		{From: "bucket", Done: true, Bytes: 10, RateBps: 100},
		{From: "bucket", Done: true, Bytes: 10, RateBps: 300},
		{From: "node-2", Done: true, Bytes: 10, RateBps: 50},
		{From: "bucket", Done: false, Bytes: 5, RateBps: 1e9},                     // still copying
		{From: "node-3", Done: true, Bytes: 10, RateBps: 1e9, Error: "peer gone"}, // failed
		{From: "bucket", Done: true, Bytes: 0, RateBps: 1e9},                      // empty
	})
	if r.bucketN != 2 || r.bucketBps != 200 || r.peerN != 1 || r.peerBps != 50 {
		t.Fatalf("rates %+v, want bucket 200 B/s over 2, peer 50 over 1", r)
	}
}

func TestPreferPeer(t *testing.T) {
	const size = 100e9 // 100 GB
	for _, c := range []struct {
		name        string
		perHour     float64
		perGB       float64
		rates       copyRates
		peer        bool
		whyContains []string
	}{
		{"nothing measured: the planning rates favour the peer", 10, 0, copyRates{}, true, []string{"(assumed)"}},
		{"the source in the region measured faster and free: the source", 10, 0,
			copyRates{bucketBps: 2e9, bucketN: 2, peerBps: 0.5e9, peerN: 1}, false, []string{"500.0 MB/s (measured)", "2.00 GB/s (measured)"}},
		{"the source faster but across clouds: the transfer outweighs the node's time", 10, 0.09,
			copyRates{bucketBps: 2e9, bucketN: 1, peerBps: 0.5e9, peerN: 1}, true, []string{"$0.090/GB"}},
		{"a dear node and a slow peer: its time outweighs a small transfer price", 400, 0.01,
			copyRates{bucketBps: 2e9, bucketN: 1, peerBps: 0.2e9, peerN: 1}, false, nil},
		{"equal rates and free: the peer (it spares the source)", 10, 0,
			copyRates{bucketBps: 1e9, bucketN: 1, peerBps: 1e9, peerN: 1}, true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			peer, why := preferPeer(size, c.perHour, c.perGB, c.rates)
			if peer != c.peer {
				t.Errorf("peer %v, want %v: %s", peer, c.peer, why)
			}
			for _, w := range c.whyContains {
				if !strings.Contains(why, w) {
					t.Errorf("reason %q lacks %q", why, w)
				}
			}
		})
	}
}
