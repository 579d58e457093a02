package agent

import "time"

// How the master node notices its store: polled (about 90 µs of CPU a
// look), often while the other nodes may still be waiting for it, then
// slowly (a later report still teaches the rendezvous that this job's
// masters listen), for a bounded time.
const (
	listenPoll     = 10 * time.Millisecond
	listenPollSlow = 250 * time.Millisecond
	listenFastFor  = 2 * time.Second
	listenWatchFor = time.Minute
)

// reportListening runs on the master node (group rank 0) after its
// workers started: once a socket listens on the round's MASTER_PORT (rank
// 0's TCPStore is up), an immediate heartbeat tells the rendezvous, which
// wakes the other nodes' held-back workers (elastic.adopt). It gives up
// when the set stops or after listenWatchFor: a job that does not use
// MASTER_PORT never reports, and the others then wait Options.MasterListenWait.
func (e *elastic) reportListening(set *workerSet) {
	port := set.assign.MasterPort
	start := time.Now()
	for time.Since(start) < listenWatchFor && !set.stopping.Load() && set.running() {
		if portListening(port) {
			e.mu.Lock()
			current := e.hbRound == set.round
			if current {
				e.hbListen = set.round
			}
			e.mu.Unlock()
			if current {
				e.a.log.Info("the master's store listens", "round", set.round, "port", port,
					"after", time.Since(set.started).Round(time.Millisecond).String())
				select {
				case e.hbKick <- struct{}{}:
				default:
				}
			}
			return
		}
		if time.Since(start) < listenFastFor {
			time.Sleep(listenPoll)
		} else {
			time.Sleep(listenPollSlow)
		}
	}
}
