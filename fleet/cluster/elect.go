package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Server is one fleetd server as the election sees it.
type Server struct {
	Name string `json:"name"`
	// URL is where the server's API listens; followers forward to the
	// leader's.
	URL string `json:"url"`
}

// Elector campaigns for leadership on behalf of this server.
type Elector struct {
	cli    *clientv3.Client
	prefix string
	ttl    time.Duration
	self   Server
}

// NewElector returns an elector for self under prefix.
func NewElector(cli *clientv3.Client, prefix string, ttl time.Duration, self Server) *Elector {
	return &Elector{cli: cli, prefix: prefix + "leader/", ttl: ttl, self: self}
}

// Term is one period of leadership. It ends when the session's lease is
// lost (this server could not renew it within the TTL: a pause, a
// partition, a dead etcd quorum) or when Resign is called.
type Term struct {
	session  *concurrency.Session
	election *concurrency.Election
	// Rev is the creation revision of this term's election key; a later
	// leader's key has a higher one.
	Rev int64
	Key string
}

// Done is closed when the term is over.
func (t *Term) Done() <-chan struct{} { return t.session.Done() }

// Fence is the comparison every write of this term carries: the election
// key still exists with this term's revision. After the lease expires (or
// another server is elected), writes carrying it fail.
func (t *Term) Fence() []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(t.Key), "=", t.Rev)}
}

// Resign ends the term now (clean shutdown), so another server takes over
// without waiting for the TTL.
func (t *Term) Resign(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_ = t.election.Resign(ctx)
	_ = t.session.Close()
}

// Campaign blocks until this server is the leader (or ctx ends) and
// returns its term.
func (e *Elector) Campaign(ctx context.Context) (*Term, error) {
	s, err := concurrency.NewSession(e.cli, concurrency.WithTTL(int(e.ttl/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("election session: %w", err)
	}
	el := concurrency.NewElection(s, e.prefix)
	val, _ := json.Marshal(e.self)
	if err := el.Campaign(ctx, string(val)); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("campaign: %w", err)
	}
	return &Term{session: s, election: el, Rev: el.Rev(), Key: el.Key()}, nil
}

// ErrNoLeader: no server holds leadership now.
var ErrNoLeader = errors.New("no fleetd server is the leader now")

// Leader returns the current leader.
func (e *Elector) Leader(ctx context.Context) (Server, error) {
	resp, err := e.cli.Get(ctx, e.prefix, clientv3.WithFirstCreate()...)
	if err != nil {
		return Server{}, fmt.Errorf("leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Server{}, ErrNoLeader
	}
	var s Server
	if err := json.Unmarshal(resp.Kvs[0].Value, &s); err != nil {
		return Server{}, fmt.Errorf("leader value: %w", err)
	}
	return s, nil
}
