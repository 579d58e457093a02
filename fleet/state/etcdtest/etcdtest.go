// Package etcdtest runs real etcd servers inside a test process: one member
// for store tests, or a cluster of several whose members can be stopped and
// restarted, for HA tests. Every member listens on 127.0.0.1 only, on ports
// picked at start, and keeps its data in a directory the caller owns.
//
// The servers run with etcd's default request limits (max-txn-ops 128,
// max-request-bytes 1.5 MiB) so tests hit the limits a default production
// etcd has, but without fsync: a member that is stopped and restarted keeps
// its data (the process does not crash), and tests stay fast.
package etcdtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/fleetd/fleetd/internal/freeport"
)

// readyTimeout bounds the wait for a cluster to elect a leader; a loaded
// 2-core CI machine needs a few seconds at most.
const readyTimeout = 30 * time.Second

// Cluster is a set of embedded etcd members that form one cluster.
type Cluster struct {
	Members []*Member
	dir     string
	ownDir  bool // dir was created by Start and is removed by Stop
}

// Member is one embedded etcd server. Its name, ports and data directory stay
// the same across Stop and Restart, as a real member's would.
type Member struct {
	Name      string
	Dir       string
	ClientURL url.URL
	PeerURL   url.URL

	initialCluster string
	token          string

	mu   sync.Mutex
	etcd *embed.Etcd
}

// StartCluster starts an n-member cluster with data under t.TempDir(), waits
// until it has a leader, and stops it when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c, err := start(n, t.TempDir(), false)
	if err != nil {
		t.Fatalf("start etcd cluster: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// Start starts an n-member cluster with data in a new temporary directory
// that Stop removes. For TestMain and other places without a testing.TB.
func Start(n int) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "fleetd-etcd-")
	if err != nil {
		return nil, err
	}
	c, err := start(n, dir, true)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

func start(n int, dir string, ownDir bool) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("cluster of %d members", n)
	}
	// A port picked free can be taken by another process before etcd binds
	// it (other test binaries run on this machine); retry with new ports.
	var err error
	for range 3 {
		var c *Cluster
		c, err = tryStart(n, dir, ownDir)
		if err == nil {
			return c, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, err
}

func tryStart(n int, dir string, ownDir bool) (*Cluster, error) {
	token := "fleetd-test-" + randHex(6)
	c := &Cluster{dir: dir, ownDir: ownDir}
	var peers []string
	for i := range n {
		cport, err := freeport.Pick()
		if err != nil {
			return nil, err
		}
		pport, err := freeport.Pick()
		if err != nil {
			return nil, err
		}
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)},
			PeerURL:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)},
			token:     token,
		}
		// A fresh directory per attempt: a failed start leaves a WAL behind.
		m.Dir = filepath.Join(dir, token, m.Name)
		peers = append(peers, m.Name+"="+m.PeerURL.String())
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.initialCluster = strings.Join(peers, ",")
	}
	// All members start before any waits: a member only becomes ready once
	// a quorum is up.
	for _, m := range c.Members {
		if err := m.launch(); err != nil {
			c.stopMembers()
			return nil, err
		}
	}
	for _, m := range c.Members {
		if err := m.waitReady(); err != nil {
			c.stopMembers()
			return nil, err
		}
	}
	return c, nil
}

func (m *Member) config() *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.Dir
	cfg.ListenClientUrls = []url.URL{m.ClientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.ClientURL}
	cfg.ListenPeerUrls = []url.URL{m.PeerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.PeerURL}
	cfg.InitialCluster = m.initialCluster
	cfg.InitialClusterToken = m.token
	// Half the default tick and election timeout: elections after a stop
	// finish sooner, while a busy 2-core machine still does not miss
	// heartbeats.
	cfg.TickMs = 50
	cfg.ElectionMs = 500
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	return cfg
}

func (m *Member) launch() error {
	e, err := embed.StartEtcd(m.config())
	if err != nil {
		return fmt.Errorf("start etcd member %s: %w", m.Name, err)
	}
	m.mu.Lock()
	m.etcd = e
	m.mu.Unlock()
	return nil
}

func (m *Member) waitReady() error {
	m.mu.Lock()
	e := m.etcd
	m.mu.Unlock()
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("etcd member %s: %w", m.Name, err)
	case <-time.After(readyTimeout):
		return fmt.Errorf("etcd member %s not ready after %s", m.Name, readyTimeout)
	}
}

// Endpoints are the client URLs of all members, running or not, as a
// client of a real cluster would be configured.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.Members))
	for i, m := range c.Members {
		out[i] = m.ClientURL.String()
	}
	return out
}

// Client returns a client of the whole cluster, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Leader returns the running member that is the raft leader, or nil if
// none knows itself to be leader right now.
func (c *Cluster) Leader() *Member {
	for _, m := range c.Members {
		m.mu.Lock()
		e := m.etcd
		m.mu.Unlock()
		if e != nil && e.Server.Leader() == e.Server.MemberID() {
			return m
		}
	}
	return nil
}

// Stop stops every running member and, for a cluster made by Start, removes
// its data directory.
func (c *Cluster) Stop() {
	c.stopMembers()
	if c.ownDir {
		_ = os.RemoveAll(c.dir)
	}
}

func (c *Cluster) stopMembers() {
	for _, m := range c.Members {
		m.Stop()
	}
}

// Stop stops the member (as a clean shutdown); its data stays. Stopping a
// stopped member is a no-op.
func (m *Member) Stop() {
	m.mu.Lock()
	e := m.etcd
	m.etcd = nil
	m.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Running reports whether the member is started.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd != nil
}

// Restart starts a stopped member again from its data directory, on the same
// ports, and waits until it has rejoined the cluster (which needs a quorum).
func (m *Member) Restart() error {
	if m.Running() {
		return errors.New("member " + m.Name + " is running")
	}
	if err := m.launch(); err != nil {
		return err
	}
	return m.waitReady()
}

// WaitLeader waits until some running member is leader.
func (c *Cluster) WaitLeader(ctx context.Context) (*Member, error) {
	for {
		if l := c.Leader(); l != nil {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no etcd leader: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

var shared struct {
	once sync.Once
	c    *Cluster
	err  error
}

// Shared returns a one-member cluster started on first use and shared by
// every test of the process; TestMain should call StopShared after m.Run.
// Tests sharing it must keep to their own key prefixes.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	shared.once.Do(func() { shared.c, shared.err = Start(1) })
	if shared.err != nil {
		t.Fatalf("start shared etcd: %v", shared.err)
	}
	return shared.c
}

// StopShared stops the shared cluster if it was started.
func StopShared() {
	if shared.c != nil {
		shared.c.Stop()
	}
}

// Prefix returns a key prefix no other caller in this process gets, for a
// test's store on a shared cluster.
func Prefix(name string) string {
	return "/test/" + strings.NewReplacer("/", "_", " ", "_").Replace(name) + "-" + randHex(4) + "/"
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}
