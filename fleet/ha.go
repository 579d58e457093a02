package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/cluster"
	"github.com/fleetd/fleetd/fleet/state"
)

// clusterState is this server's part in an HA cluster: its etcd member
// (when embedded), client, elector and current term of leadership.
type clusterState struct {
	cfg     *cluster.Config
	member  *cluster.Member
	cli     *clientv3.Client
	elector *cluster.Elector
	log     *slog.Logger

	// campaigning is set once Run starts: before it, writes are the
	// server's own bootstrap (identity, secrets) and carry no fence.
	campaigning atomic.Bool
	term        atomic.Pointer[cluster.Term]

	leaderMu  sync.Mutex
	leader    cluster.Server
	leaderAt  time.Time
	servers   []string
	serversAt time.Time
}

// neverTrue is a comparison no key satisfies: the fence of a server that
// holds no term, so none of its writes applies.
func (c *clusterState) neverTrue() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(c.cfg.Prefix+"leader/none"), "=", -1)
}

// fence is what every store write carries (state.EtcdOptions.Fence).
func (c *clusterState) fence() []clientv3.Cmp {
	if !c.campaigning.Load() {
		return nil
	}
	if t := c.term.Load(); t != nil {
		return t.Fence()
	}
	return []clientv3.Cmp{c.neverTrue()}
}

// isLeader reports whether this server holds a live term.
func (c *clusterState) isLeader() bool {
	if c == nil {
		return true
	}
	t := c.term.Load()
	if t == nil {
		return false
	}
	select {
	case <-t.Done():
		return false
	default:
		return true
	}
}

// currentLeader is the leader as etcd says, cached for a second (every
// forwarded request asks).
func (c *clusterState) currentLeader(ctx context.Context) (cluster.Server, error) {
	c.leaderMu.Lock()
	defer c.leaderMu.Unlock()
	if time.Since(c.leaderAt) < time.Second && c.leader.URL != "" {
		return c.leader, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	s, err := c.elector.Leader(ctx)
	if err != nil {
		return cluster.Server{}, err
	}
	c.leader, c.leaderAt = s, time.Now()
	return s, nil
}

func (c *clusterState) close() {
	if c == nil {
		return
	}
	if c.cli != nil {
		c.cli.Close()
	}
	c.member.Close()
}

// openCluster starts this server's etcd member (embedded_etcd), connects
// and opens the state on etcd. The store's writes are fenced by the term
// this server holds once it campaigns.
func openCluster(ctx context.Context, cfg Config, log *slog.Logger, now func() time.Time) (*clusterState, Store, error) {
	c := &clusterState{cfg: cfg.Cluster, log: log}
	if e := cfg.Cluster.Embedded; e != nil {
		log.Info("starting embedded etcd member", "name", e.Name, "peer", e.ListenPeer, "client", e.ListenClient, "data_dir", e.DataDir)
		m, err := cluster.StartMember(ctx, e)
		if err != nil {
			return nil, nil, err
		}
		c.member = m
	}
	cli, err := cluster.Connect(ctx, cfg.Cluster)
	if err != nil {
		c.close()
		return nil, nil, err
	}
	c.cli = cli
	st, err := state.OpenEtcd(ctx, cli, state.EtcdOptions{Prefix: cfg.Cluster.Prefix + "state/", Fence: c.fence, Now: now})
	if err != nil {
		c.close()
		return nil, nil, fmt.Errorf("state on etcd: %w", err)
	}
	return c, st, nil
}

// lead campaigns for leadership until ctx ends. While this server leads,
// it runs the leader's work (reconcilers, interruption intake, rendezvous
// events) under a context that ends with the term; a lost term stops that
// work at once, and writes already carry the old term's fence, so nothing
// a deposed leader still tries applies.
func (d *Daemon) lead(ctx context.Context, self cluster.Server) {
	c := d.cl
	c.elector = cluster.NewElector(c.cli, c.cfg.Prefix, c.cfg.TTL(), self)
	if err := c.register(ctx, self); err != nil {
		d.log.Warn("cluster: register this server", "err", err)
	}
	c.campaigning.Store(true)
	for ctx.Err() == nil {
		// Rounds change only on the leader: a follower's rendezvous service
		// would run its timers on members it never hears from and try to
		// save rounds its fence refuses. Closing may wait for a save in
		// flight, so it does not hold up the campaign.
		d.rdzv.stop()
		term, err := c.elector.Campaign(ctx)
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("campaign for leadership failed; retrying", "err", err)
				time.Sleep(time.Second)
			}
			continue
		}
		d.log.Info("this server is the leader", "server", self.Name, "term", term.Rev)
		// What the previous leader did is in the store, not here: reload
		// the rendezvous rounds (and, in establishLeadership, the fleets'
		// runtimes) before acting.
		if err := d.rdzv.loadRendezvous(ctx); err != nil {
			d.log.Error("leader: reload rendezvous; resigning", "err", err)
			term.Resign(context.Background())
			continue
		}
		c.term.Store(term)
		duties := d.establishLeadership(ctx)
		select {
		case <-term.Done():
			d.log.Warn("leadership lost: stopping the leader's work", "server", self.Name, "term", term.Rev)
		case <-ctx.Done():
		}
		// A clean shutdown saves the runtimes' accounting in this term
		// (its fence still holds), then hands over at once instead of
		// after the TTL. A lost term saves nothing: its writes would be
		// refused, and the next leader starts from the store.
		shutdown := ctx.Err() != nil
		d.revokeLeadership(duties, shutdown)
		// Resign either way: after a loss the lease may still be alive on
		// etcd's side (this server only stopped being sure of it), and
		// the next leader need not wait for it to expire.
		c.term.Store(nil)
		term.Resign(context.Background())
		if shutdown {
			return
		}
	}
}

// register records this server's URL under servers/, so the leader can
// hand every server's address to agents (they fail over on their own).
// Entries stay until removed: the set of servers is configuration.
func (c *clusterState) register(ctx context.Context, self cluster.Server) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := c.cli.Put(ctx, c.cfg.Prefix+"servers/"+self.Name, self.URL)
	return err
}

// otherServers are the URLs of the cluster's other servers, for agents;
// nil for a single server.
func (d *Daemon) otherServers() []string {
	if d.cl == nil {
		return nil
	}
	c := d.cl
	c.leaderMu.Lock()
	defer c.leaderMu.Unlock()
	if time.Since(c.serversAt) < 10*time.Second {
		return c.servers
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := c.cli.Get(ctx, c.cfg.Prefix+"servers/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return c.servers // the last known list
	}
	var out []string
	self := d.URL()
	for _, kv := range resp.Kvs {
		if u := string(kv.Value); u != self {
			out = append(out, u)
		}
	}
	c.servers, c.serversAt = out, time.Now()
	return out
}

// forwardedByHeader names the follower that forwarded a request, so the
// leader's status can say which server the user asked.
const forwardedByHeader = "Fleetd-Forwarded-By"

type forwardedByKey struct{}

// clusterInfo serves GET /v1/cluster on every server: who answers, who leads.
func (d *Daemon) clusterInfo(w http.ResponseWriter, r *http.Request) {
	if d.cl == nil {
		api.WriteError(w, http.StatusNotFound, errors.New("this server is not part of a cluster"))
		return
	}
	info := api.ClusterInfo{Server: d.cl.cfg.Name, IsLeader: d.cl.isLeader()}
	if d.cl.elector != nil {
		if l, err := d.cl.currentLeader(r.Context()); err == nil {
			info.Leader, info.LeaderURL = l.Name, l.URL
		}
	}
	api.WriteJSON(w, http.StatusOK, info)
}

// localPaths are answered by every server itself: its health, and which
// server leads.
var localPaths = map[string]bool{"/healthz": true, "/v1/cluster": true}

// followerReadHeader marks an answer a follower gave from etcd itself
// because no leader could be reached.
const followerReadHeader = "Fleetd-Follower-Read"

// followerReadable reports whether a follower may answer r from the shared
// state when no leader can be reached: the read-only views of fleets,
// events, projects and the queue (use, spend and waiting fleets as
// stored). Everything else (writes, agent and rendezvous calls, offerings,
// which would start provider plugins) waits for a leader.
func followerReadable(r *http.Request) bool {
	if r.Method != http.MethodGet {
		return false
	}
	p := r.URL.Path
	if p == "/v1/status" || p == "/v1/fleets" || p == "/v1/events" || p == "/v1/projects" || p == "/v1/queue" {
		return true
	}
	rest, ok := strings.CutPrefix(p, "/v1/fleets/")
	return ok && rest != "" && !strings.Contains(rest, "/")
}

// clusterHandler serves h on the leader; a follower forwards every other
// request to the leader (API writes, agent and rendezvous calls, and
// reads, so every answer comes from the one server whose in-memory state —
// rendezvous rounds, recoveries — is current).
func (d *Daemon) clusterHandler(h http.Handler) http.Handler {
	if d.cl == nil {
		return h
	}
	var proxies sync.Map // leader URL → *httputil.ReverseProxy
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.cl.isLeader() || localPaths[r.URL.Path] {
			if fb := r.Header.Get(forwardedByHeader); fb != "" {
				r = r.WithContext(context.WithValue(r.Context(), forwardedByKey{}, fb))
			}
			h.ServeHTTP(w, r)
			return
		}
		// With no leader to ask, status, fleets and events are still
		// answered from etcd, marked as such: an operator can see the
		// fleets during an election or while the leader is unreachable.
		// Live details (rendezvous rounds, alerts) are left out; they live
		// in the leader's memory.
		local := func(why string) {
			w.Header().Set(followerReadHeader, "no leader reachable ("+why+"): answered by follower "+d.cl.cfg.Name+" from etcd, without live rendezvous details")
			h.ServeHTTP(w, r)
		}
		leader, err := d.cl.currentLeader(r.Context())
		if err != nil && followerReadable(r) && errors.Is(err, cluster.ErrNoLeader) {
			local("an election is under way")
			return
		}
		if err != nil {
			w.Header().Set("Retry-After", "1")
			code := http.StatusServiceUnavailable
			msg := "no fleetd server leads right now (an election is under way); retry"
			if !errors.Is(err, cluster.ErrNoLeader) {
				msg = "cannot reach etcd to find the leader: " + err.Error()
			}
			http.Error(w, msg, code)
			return
		}
		p, ok := proxies.Load(leader.URL)
		if !ok {
			u, err := url.Parse(leader.URL)
			if err != nil {
				http.Error(w, "leader URL "+leader.URL+": "+err.Error(), http.StatusBadGateway)
				return
			}
			rp := httputil.NewSingleHostReverseProxy(u)
			// Long-polls and event streams pass through as they come.
			rp.FlushInterval = -1
			rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
				if followerReadable(r) && r.Context().Err() == nil {
					w.Header().Set(followerReadHeader, "leader "+leader.Name+" unreachable ("+err.Error()+"): answered by follower "+d.cl.cfg.Name+" from etcd, without live rendezvous details")
					h.ServeHTTP(w, r)
					return
				}
				w.Header().Set("Retry-After", "1")
				http.Error(w, "forwarding to the leader "+leader.Name+" failed: "+err.Error(), http.StatusBadGateway)
			}
			p, _ = proxies.LoadOrStore(leader.URL, rp)
		}
		r.Header.Set(forwardedByHeader, d.cl.cfg.Name)
		p.(*httputil.ReverseProxy).ServeHTTP(w, r)
	})
}
