package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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
	keeper   *leaseKeeper
	// Rev is the creation revision of this term's election key; a later
	// leader's key has a higher one.
	Rev int64
	Key string
}

// Done is closed when the term is over: this server can no longer be sure
// its lease is alive.
func (t *Term) Done() <-chan struct{} { return t.keeper.done }

// Fence is the comparison every write of this term carries: the election
// key still exists with this term's revision. After the lease expires (or
// another server is elected), writes carrying it fail.
func (t *Term) Fence() []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(t.Key), "=", t.Rev)}
}

// Resign ends the term now (clean shutdown, or a term already lost), so
// another server takes over without waiting for the lease to expire.
func (t *Term) Resign(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	t.keeper.stop()
	_ = t.election.Resign(ctx)
	_ = t.session.Close()
}

// Campaign blocks until this server is the leader (or ctx ends, or its
// lease is lost while it waits) and returns its term.
func (e *Elector) Campaign(ctx context.Context) (*Term, error) {
	k, err := keepLease(ctx, e.cli, e.ttl)
	if err != nil {
		return nil, fmt.Errorf("election lease: %w", err)
	}
	// The session only carries the lease for the election; whether the
	// lease lives is the keeper's call (see leaseKeeper). Its own
	// keepalive stream is cancelled with the term.
	s, err := concurrency.NewSession(e.cli, concurrency.WithLease(k.id), concurrency.WithContext(k.ctx))
	if err != nil {
		k.revoke()
		return nil, fmt.Errorf("election session: %w", err)
	}
	el := concurrency.NewElection(s, e.prefix)
	val, _ := json.Marshal(e.self)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-k.done:
			cancel()
		case <-cctx.Done():
		}
	}()
	if err := el.Campaign(cctx, string(val)); err != nil {
		k.revoke()
		_ = s.Close()
		if ctx.Err() == nil && k.lost() {
			return nil, fmt.Errorf("campaign: the election lease lapsed while waiting: %w", err)
		}
		return nil, fmt.Errorf("campaign: %w", err)
	}
	t := &Term{session: s, election: el, keeper: k, Rev: el.Rev(), Key: el.Key()}
	if k.lost() {
		t.Resign(context.Background())
		return nil, errors.New("campaign: the election lease lapsed as leadership was won")
	}
	return t, nil
}

// leaseKeeper renews a lease with one bounded request at a time instead of
// clientv3's keepalive stream. The stream is bound to one connection: when
// the etcd member behind it stalls (a paused VM, a half-open partition),
// renewals hang until gRPC's transport keepalive gives up, at least 10 s,
// and a session with a few seconds' TTL lapses although the other members
// are fine. A bounded request that times out is simply sent again, and the
// client's balancer picks another member.
type leaseKeeper struct {
	cli *clientv3.Client
	id  clientv3.LeaseID
	ttl time.Duration
	// ctx lives as long as the keeper renews the lease.
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	mu sync.Mutex
	// deadline is when the lease may have expired on the etcd side: the
	// send time of the last acknowledged renewal plus its TTL (the server
	// counts from when it got the request, which is later).
	deadline time.Time
	expired  bool
}

func keepLease(ctx context.Context, cli *clientv3.Client, ttl time.Duration) (*leaseKeeper, error) {
	secs := int64(ttl / time.Second)
	if secs < 1 {
		secs = 1
	}
	sent := time.Now()
	gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
	resp, err := cli.Grant(gctx, secs)
	gcancel()
	if err != nil {
		return nil, err
	}
	kctx, cancel := context.WithCancel(context.Background())
	k := &leaseKeeper{
		cli: cli, id: resp.ID, ttl: time.Duration(resp.TTL) * time.Second,
		ctx: kctx, cancel: cancel, done: make(chan struct{}),
		deadline: sent.Add(time.Duration(resp.TTL) * time.Second),
	}
	go k.run()
	return k, nil
}

// run renews the lease about four times per TTL; each attempt may take a
// quarter of the TTL before the next is sent.
func (k *leaseKeeper) run() {
	defer k.end()
	every := k.ttl / 4
	if every < 100*time.Millisecond {
		every = 100 * time.Millisecond
	}
	for {
		k.mu.Lock()
		left := time.Until(k.deadline)
		k.mu.Unlock()
		if left <= 0 {
			if k.confirm(every) {
				continue
			}
			k.mu.Lock()
			k.expired = true
			k.mu.Unlock()
			return
		}
		sent := time.Now()
		actx, cancel := context.WithTimeout(k.ctx, min(every, left))
		resp, err := k.cli.KeepAliveOnce(actx, k.id)
		cancel()
		if k.ctx.Err() != nil {
			return
		}
		if err == nil && resp.TTL > 0 {
			k.mu.Lock()
			// A pause between send and now (SIGSTOP, GC) makes sent older,
			// never newer: the deadline stays on the safe side.
			k.deadline = sent.Add(time.Duration(resp.TTL) * time.Second)
			k.mu.Unlock()
		} else if errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0) {
			k.mu.Lock()
			k.expired = true
			k.mu.Unlock()
			return
		}
		if err == nil {
			select {
			case <-time.After(time.Until(sent.Add(every))):
			case <-k.ctx.Done():
				return
			}
		}
	}
}

// confirm asks etcd whether the lease still lives once renewals have not
// been acknowledged for a whole TTL. They fail while etcd elects a new raft
// leader (which extends every lease by its TTL) or while requests hang on
// a stalled member; giving up on the local count alone then cost a healthy
// leader its term, or a candidate its place in line. Two bounded attempts;
// an answer with time left resets the deadline from when it was asked.
// Writes stay fenced meanwhile, so acting a little past the count is safe.
func (k *leaseKeeper) confirm(every time.Duration) bool {
	for range 2 {
		sent := time.Now()
		ctx, cancel := context.WithTimeout(k.ctx, every)
		resp, err := k.cli.TimeToLive(ctx, k.id)
		cancel()
		if k.ctx.Err() != nil {
			return false
		}
		if err == nil {
			if resp.TTL <= 0 {
				return false
			}
			k.mu.Lock()
			k.deadline = sent.Add(time.Duration(resp.TTL) * time.Second)
			k.mu.Unlock()
			return true
		}
	}
	return false
}

// lost reports whether the lease lapsed (rather than being stopped).
func (k *leaseKeeper) lost() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.expired
}

func (k *leaseKeeper) end() {
	k.once.Do(func() {
		k.cancel()
		close(k.done)
	})
}

// stop ends renewals.
func (k *leaseKeeper) stop() {
	k.cancel()
	<-k.done
}

// revoke ends renewals and drops the lease (best effort), so a key this
// server no longer backs does not block the others until the TTL.
func (k *leaseKeeper) revoke() {
	k.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = k.cli.Revoke(ctx, k.id)
}

// ErrNoLeader: no server holds leadership now.
var ErrNoLeader = errors.New("no fleetd server is the leader now")

// Leader returns the current leader.
func (e *Elector) Leader(ctx context.Context) (Server, error) {
	s, _, err := e.LeaderLease(ctx)
	return s, err
}

// LeaderLease returns the current leader and the lease its term holds;
// opts are added to the read (clientv3.WithSerializable() answers from the
// local member, also while etcd has no raft leader).
func (e *Elector) LeaderLease(ctx context.Context, opts ...clientv3.OpOption) (Server, clientv3.LeaseID, error) {
	resp, err := e.cli.Get(ctx, e.prefix, append(clientv3.WithFirstCreate(), opts...)...)
	if err != nil {
		return Server{}, 0, fmt.Errorf("leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Server{}, 0, ErrNoLeader
	}
	var s Server
	if err := json.Unmarshal(resp.Kvs[0].Value, &s); err != nil {
		return Server{}, 0, fmt.Errorf("leader value: %w", err)
	}
	return s, clientv3.LeaseID(resp.Kvs[0].Lease), nil
}

// Depose ends the term held by lease now: its election key goes with the
// lease, the next campaigner wins, and the old term's fence refuses its
// writes from then on. For a leader known to be dead, so the others need
// not wait for its lease to run out. A lease already gone is no error.
func (e *Elector) Depose(ctx context.Context, lease clientv3.LeaseID) error {
	_, err := e.cli.Revoke(ctx, lease)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("depose: %w", err)
	}
	return nil
}
