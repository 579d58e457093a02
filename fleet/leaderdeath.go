package fleet

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fleetd/fleetd/fleet/cluster"
)

// A dead leader holds its term until its lease runs out: the session TTL,
// plus etcd's election timeout when the raft leader died with it (a new
// raft leader extends every lease). Its followers can tell sooner: a
// server whose process is gone refuses connections on its API port.
// Refusal, not a timeout: a paused or partitioned leader times out and
// keeps its term until its lease says otherwise.
const (
	leaderProbeEvery = 500 * time.Millisecond
	// leaderRefusedFor is how long the leader's port must refuse before a
	// follower deposes it: three probes in a row, so one refused connect
	// (a full accept queue) is not enough.
	leaderRefusedFor = time.Second
)

// leaderDeathProbe tracks one leader term's reachability as one follower
// sees it. A leader is deposed only after this follower has reached it in
// the same term: with an advertise_url the followers cannot reach (a
// misconfiguration), it is never deposed on refusals alone.
type leaderDeathProbe struct {
	lease        clientv3.LeaseID
	reached      bool
	refusedSince time.Time
}

// observe records one probe of the leader holding lease and reports
// whether the leader is to be deposed now.
func (p *leaderDeathProbe) observe(lease clientv3.LeaseID, reachable, refused bool, now time.Time) bool {
	if lease != p.lease {
		*p = leaderDeathProbe{lease: lease}
	}
	switch {
	case reachable:
		p.reached, p.refusedSince = true, time.Time{}
	case refused && p.reached:
		if p.refusedSince.IsZero() {
			p.refusedSince = now
		}
		return now.Sub(p.refusedSince) >= leaderRefusedFor
	default:
		p.refusedSince = time.Time{}
	}
	return false
}

// watchLeaderDeath runs on every server of a cluster: while another server
// leads, it probes that leader's API port and deposes it once the port
// has refused connections for leaderRefusedFor. The term's fence keeps
// this safe even if the refusal was wrong: a deposed leader that is alive
// finds its lease gone at its next renewal, and its writes fail meanwhile.
func (d *Daemon) watchLeaderDeath(ctx context.Context, self cluster.Server) {
	c := d.cl
	el := cluster.NewElector(c.cli, c.cfg.Prefix, c.cfg.TTL(), self)
	t := time.NewTicker(leaderProbeEvery)
	defer t.Stop()
	var p leaderDeathProbe
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if c.isLeader() {
			p = leaderDeathProbe{}
			continue
		}
		// A serializable read: when the leader's server took etcd's raft
		// leader with it, etcd elects another for a second or so, and the
		// probe goes on meanwhile (the depose then waits for the new one).
		gctx, cancel := context.WithTimeout(ctx, time.Second)
		leader, lease, err := el.LeaderLease(gctx, clientv3.WithSerializable())
		cancel()
		if err != nil {
			continue // keep what this term's probes saw
		}
		if leader.Name == self.Name || leader.URL == "" {
			p = leaderDeathProbe{}
			continue
		}
		reachable, refused := probePort(ctx, leader.URL)
		was := p
		if was.lease != lease {
			was = leaderDeathProbe{}
		}
		depose := p.observe(lease, reachable, refused, time.Now())
		if p.reached != was.reached || p.refusedSince.IsZero() != was.refusedSince.IsZero() {
			d.log.Debug("leader probe", "leader", leader.Name, "url", leader.URL, "reached", p.reached, "refusing", !p.refusedSince.IsZero())
		}
		if !depose {
			continue
		}
		d.log.Warn("the leader's API refuses connections: its process is gone; ending its term now instead of after its lease runs out",
			"leader", leader.Name, "url", leader.URL, "refused_for", leaderRefusedFor)
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = el.Depose(dctx, lease)
		cancel()
		if err != nil {
			// etcd may be electing a raft leader (the dead server's member
			// may have been it): try again at the next probe.
			d.log.Warn("depose the dead leader; retrying", "leader", leader.Name, "err", err)
			continue
		}
		p = leaderDeathProbe{}
	}
}

// probePort connects to the host and port of rawURL: reachable when the
// connection opens, refused when the host answered that nothing listens.
func probePort(ctx context.Context, rawURL string) (reachable, refused bool) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return false, false
	}
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", host)
	if err != nil {
		return false, errors.Is(err, syscall.ECONNREFUSED)
	}
	defer conn.Close()
	if u.Scheme == "https" {
		// Complete the handshake, or the leader logs every probe as a
		// failed one. Nothing is sent over it and nothing read back, so
		// the certificate need not be checked: the probe asks only
		// whether a TLS server answers on the port.
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // liveness only, see above
		if err := tc.HandshakeContext(dctx); err != nil {
			return false, false
		}
		tc.Close()
	}
	return true, false
}
