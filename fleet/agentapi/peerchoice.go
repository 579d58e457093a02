package agentapi

import (
	"fmt"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/placement"
)

// copyRates are the copy rates a fleet's nodes measured for one staged
// source, in bytes per second: from the source itself and from peers
// (the mean of their finished copies); 0 when none was measured.
type copyRates struct {
	bucketBps, peerBps float64
	bucketN, peerN     int
}

// measuredRates averages the finished, successful copies of reports by
// where they came from.
func measuredRates(reports []api.StagingReport) copyRates {
	var r copyRates
	for _, s := range reports {
		if !s.Done || s.Error != "" || s.Bytes <= 0 || !(s.RateBps > 0) {
			continue
		}
		if s.From == "bucket" || s.From == "" {
			r.bucketBps += s.RateBps
			r.bucketN++
		} else {
			r.peerBps += s.RateBps
			r.peerN++
		}
	}
	if r.bucketN > 0 {
		r.bucketBps /= float64(r.bucketN)
	}
	if r.peerN > 0 {
		r.peerBps /= float64(r.peerN)
	}
	return r
}

// copyCost is what copying bytes at bps costs a node paid perHour while
// it copies (it joins only with the data on disk), plus perGB for the
// transfer.
func copyCost(bytes, bps, perHour, perGB float64) (usd, seconds float64) {
	seconds = bytes / bps
	return perHour*seconds/3600 + perGB*bytes/1e9, seconds
}

// preferPeer decides whether a replacement copies a staged dataset of
// bytes from a peer of its zone (no transfer charge) or from the source
// (perGB from where it lives to the node's region), by the expected cost
// of each copy at the rates the fleet measured (placement's planning
// rates where it measured none). Ties go to the peer, which also spares
// the source. It says why, with the figures.
func preferPeer(bytes, perHour, perGB float64, r copyRates) (bool, string) {
	bb, pb := r.bucketBps, r.peerBps
	bSrc, pSrc := "measured", "measured"
	if !(bb > 0) {
		bb, bSrc = placement.BucketStageGBps*1e9, "assumed"
	}
	if !(pb > 0) {
		pb, pSrc = placement.PeerStageGBps*1e9, "assumed"
	}
	bUSD, bSec := copyCost(bytes, bb, perHour, perGB)
	pUSD, pSec := copyCost(bytes, pb, perHour, 0)
	why := fmt.Sprintf("peer %s at %s/s (%s), %s, $%.4f; source %s at %s/s (%s), %s, $%.4f",
		gb(bytes), gb(pb), pSrc, secs(pSec), pUSD, gb(bytes), gb(bb), bSrc, secs(bSec), bUSD)
	if perGB > 0 {
		why += fmt.Sprintf(" with $%.3f/GB transfer", perGB)
	}
	return pUSD <= bUSD, why
}

// gb is decimal (GB, MB), unlike humanBytes: the rates and transfer
// prices it stands beside are per decimal GB.
func gb(b float64) string {
	switch {
	case b >= 1e9:
		return fmt.Sprintf("%.2f GB", b/1e9)
	case b >= 1e6:
		return fmt.Sprintf("%.1f MB", b/1e6)
	}
	return fmt.Sprintf("%.0f kB", b/1e3)
}

func secs(s float64) string { return fmt.Sprintf("%.1f s", s) }
