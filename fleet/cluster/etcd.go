package cluster

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
)

// memberStartTimeout bounds how long a member waits for its peers to form
// a quorum on start: the other servers may start a little later.
const memberStartTimeout = 2 * time.Minute

// Member is an etcd member running inside this fleetd server.
type Member struct{ e *embed.Etcd }

// StartMember starts this server's embedded etcd member and waits until it
// serves (its cluster has a quorum). A data dir from an earlier run is
// rejoined, not re-bootstrapped.
func StartMember(ctx context.Context, c *EmbeddedConfig) (*Member, error) {
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.DataDir
	peer, err := url.Parse(c.ListenPeer)
	if err != nil {
		return nil, err
	}
	client, err := url.Parse(c.ListenClient)
	if err != nil {
		return nil, err
	}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	if t := c.TLS; t != nil {
		// Peers and clients both authenticate with certificates from the
		// deployment's CA: a host that can reach the ports but holds no
		// such certificate can neither join raft nor read fleet state.
		info := transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.CAFile, ClientCertAuth: true}
		cfg.PeerTLSInfo, cfg.ClientTLSInfo = info, info
	}
	cfg.InitialCluster = c.initialCluster()
	cfg.InitialClusterToken = "fleetd"
	cfg.ClusterState = embed.ClusterStateFlagNew
	if c.InitialClusterState == "existing" {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	// One fleetd transaction is one etcd transaction: a reconcile pass
	// may launch or update hundreds of nodes at once.
	cfg.MaxTxnOps = 4096
	cfg.MaxRequestBytes = 16 << 20
	// A dead raft leader is replaced after the election timeout, and the new
	// one extends every lease by its full TTL: both add to fleetd's
	// failover. Half etcd's defaults (100 ms heartbeat, 1 s election) keep
	// a failover within about TTL + 1 s; members in one region have round
	// trips far below 50 ms.
	cfg.TickMs = 50
	cfg.ElectionMs = 500
	// etcd keeps every revision until compacted and refuses writes at its
	// quota; fleetd reads only the present, so an hour of history is plenty.
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "1h"
	cfg.LogLevel = "error"
	cfg.Logger = "zap"
	// Keep the member's own metrics/log noise out of fleetd's output.
	cfg.LogOutputs = []string{"stderr"}
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd %s: %w", c.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return &Member{e: e}, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd %s: %w", c.Name, err)
	case <-time.After(memberStartTimeout):
		e.Close()
		return nil, fmt.Errorf("embedded etcd %s: no quorum after %s: are the other members of initial_cluster running and reachable on their peer URLs?", c.Name, memberStartTimeout)
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	}
}

// Close stops the member.
func (m *Member) Close() {
	if m != nil && m.e != nil {
		m.e.Close()
	}
}

// Connect opens the etcd client of this server.
func Connect(ctx context.Context, c *Config) (*clientv3.Client, error) {
	tlsCfg, err := c.Etcd.clientTLS()
	if err != nil {
		return nil, err
	}
	if c.Embedded != nil {
		if tlsCfg, err = c.Embedded.clientTLS(); err != nil {
			return nil, err
		}
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, TLS: tlsCfg, Context: ctx,
		// Transport keepalives drop a connection to a dead member (gRPC
		// clamps the interval to at least 10 s); the election lease does not
		// rely on them (see leaseKeeper).
		DialKeepAliveTime: time.Second, DialKeepAliveTimeout: time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client %v: %w", c.Endpoints(), err)
	}
	return cli, nil
}
