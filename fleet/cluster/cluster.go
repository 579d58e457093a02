// Package cluster runs fleetd as several servers on etcd: the daemon
// config's `cluster` block, an embedded etcd member per server when the
// deployment brings its own, the client, and the election that makes one
// server the leader. Only the leader runs reconcilers, interruption intake,
// the rendezvous service and provider plugins; every write it makes is
// fenced by its election key (Term.Fence), so a deposed leader that is
// still running cannot write or launch.
package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Defaults.
const (
	DefaultSessionTTL = 3 * time.Second
	DefaultPrefix     = "/fleetd/"
)

// Config is the `cluster` block of daemon.hcl. Exactly one of Etcd and
// Embedded is set.
type Config struct {
	// Name identifies this server in the election (and in `fleetd status`);
	// default: the embedded member's name, else the host name.
	Name string `hcl:"name,optional"`
	// SessionTTL bounds failover: a leader that stops renewing its session
	// loses leadership this long after its last renewal. Default 3s.
	SessionTTL string `hcl:"session_ttl,optional"`
	// Prefix is where fleetd's keys live in etcd; default "/fleetd/".
	Prefix   string          `hcl:"prefix,optional"`
	Etcd     *EtcdConfig     `hcl:"etcd,block"`
	Embedded *EmbeddedConfig `hcl:"embedded_etcd,block"`

	sessionTTL time.Duration
}

// EtcdConfig points at an etcd cluster the user already runs.
type EtcdConfig struct {
	Endpoints []string `hcl:"endpoints"`
	TLS       *TLS     `hcl:"tls,block"`
}

// TLS is client TLS to etcd (CA to verify the members, and a client
// certificate when the cluster requires one).
type TLS struct {
	CAFile   string `hcl:"ca_file,optional"`
	CertFile string `hcl:"cert_file,optional"`
	KeyFile  string `hcl:"key_file,optional"`
}

// EmbeddedConfig runs an etcd member inside this fleetd server, so three
// VMs running `fleetd serve` are the whole deployment.
type EmbeddedConfig struct {
	// Name is this member's name in InitialCluster.
	Name string `hcl:"name"`
	// ListenPeer is the peer URL (members talk raft there), e.g.
	// "http://10.0.1.5:2380".
	ListenPeer string `hcl:"listen_peer"`
	// ListenClient is the client URL; default the peer host on port 2379.
	ListenClient string `hcl:"listen_client,optional"`
	// InitialCluster maps every member's name to its peer URL.
	InitialCluster map[string]string `hcl:"initial_cluster"`
	// DataDir is the member's data directory; default data_dir/etcd.
	DataDir string `hcl:"data_dir,optional"`
	// ClientEndpoints are every member's client URL, for the client this
	// server uses (default: this member's client URL only).
	ClientEndpoints []string `hcl:"client_endpoints,optional"`
	// TLS secures the member's peer and client listeners with one
	// certificate per server (server and client auth, SANs for its peer
	// and client hosts) signed by the deployment's CA; members and clients
	// must present certificates signed by it. Every URL is then https.
	TLS *TLS `hcl:"tls,block"`
	// InitialClusterState is "new" (default: the members bootstrap the
	// cluster together) or "existing" (this member replaces a lost one and
	// joins a running cluster after `etcdctl member add`).
	InitialClusterState string `hcl:"initial_cluster_state,optional"`
}

// Finish validates c and fills defaults; base is the config file's
// directory (relative paths), dataDir the daemon's data_dir.
func (c *Config) Finish(base, dataDir string) error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if (c.Etcd == nil) == (c.Embedded == nil) {
		bad("cluster: set exactly one of etcd {} (an existing cluster) and embedded_etcd {} (a member in this server)")
	}
	c.sessionTTL = DefaultSessionTTL
	if c.SessionTTL != "" {
		d, err := time.ParseDuration(c.SessionTTL)
		if err != nil || d < time.Second || d%time.Second != 0 {
			bad("cluster: session_ttl %q: want whole seconds ≥ 1s (etcd leases are in seconds)", c.SessionTTL)
		} else {
			c.sessionTTL = d
		}
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if !strings.HasPrefix(c.Prefix, "/") || !strings.HasSuffix(c.Prefix, "/") {
		bad("cluster: prefix %q must start and end with /", c.Prefix)
	}
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) || base == "" {
			return p
		}
		return filepath.Join(base, p)
	}
	if e := c.Etcd; e != nil {
		if len(e.Endpoints) == 0 {
			bad("cluster.etcd: endpoints: at least one etcd client URL is required")
		}
		for _, ep := range e.Endpoints {
			if err := checkURL(ep); err != nil {
				bad("cluster.etcd: endpoints: %v", err)
			}
		}
		if t := e.TLS; t != nil {
			t.CAFile, t.CertFile, t.KeyFile = abs(t.CAFile), abs(t.CertFile), abs(t.KeyFile)
			if (t.CertFile == "") != (t.KeyFile == "") {
				bad("cluster.etcd.tls: cert_file and key_file go together")
			}
		}
	}
	if e := c.Embedded; e != nil {
		if e.Name == "" {
			bad("cluster.embedded_etcd: name is required")
		}
		if err := checkURL(e.ListenPeer); err != nil {
			bad("cluster.embedded_etcd: listen_peer: %v", err)
		}
		if e.ListenClient == "" && e.ListenPeer != "" {
			if u, err := url.Parse(e.ListenPeer); err == nil {
				e.ListenClient = u.Scheme + "://" + u.Hostname() + ":2379"
			}
		}
		if err := checkURL(e.ListenClient); err != nil {
			bad("cluster.embedded_etcd: listen_client: %v", err)
		}
		if len(e.InitialCluster) == 0 {
			bad("cluster.embedded_etcd: initial_cluster: name every member with its peer URL")
		} else if peer, ok := e.InitialCluster[e.Name]; !ok {
			bad("cluster.embedded_etcd: initial_cluster has no member %q (this server's name)", e.Name)
		} else if peer != e.ListenPeer {
			bad("cluster.embedded_etcd: initial_cluster[%q] = %q but listen_peer = %q", e.Name, peer, e.ListenPeer)
		}
		for n, u := range e.InitialCluster {
			if err := checkURL(u); err != nil {
				bad("cluster.embedded_etcd: initial_cluster[%q]: %v", n, err)
			}
		}
		if e.DataDir == "" && dataDir != "" {
			e.DataDir = filepath.Join(dataDir, "etcd")
		}
		e.DataDir = abs(e.DataDir)
		if len(e.ClientEndpoints) == 0 {
			e.ClientEndpoints = []string{e.ListenClient}
		}
		if t := e.TLS; t != nil {
			t.CAFile, t.CertFile, t.KeyFile = abs(t.CAFile), abs(t.CertFile), abs(t.KeyFile)
			if t.CAFile == "" || t.CertFile == "" || t.KeyFile == "" {
				bad("cluster.embedded_etcd.tls: ca_file, cert_file and key_file are all required (members verify each other)")
			}
			urls := map[string]string{"listen_peer": e.ListenPeer, "listen_client": e.ListenClient}
			for n, u := range e.InitialCluster {
				urls[fmt.Sprintf("initial_cluster[%q]", n)] = u
			}
			for i, u := range e.ClientEndpoints {
				urls[fmt.Sprintf("client_endpoints[%d]", i)] = u
			}
			keys := make([]string, 0, len(urls))
			for k := range urls {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if !strings.HasPrefix(urls[k], "https://") {
					bad("cluster.embedded_etcd: %s %q: with tls {}, every member URL is https://", k, urls[k])
				}
			}
		}
		switch e.InitialClusterState {
		case "":
			e.InitialClusterState = "new"
		case "new", "existing":
		default:
			bad("cluster.embedded_etcd: initial_cluster_state %q: want \"new\" or \"existing\"", e.InitialClusterState)
		}
		if c.Name == "" {
			c.Name = e.Name
		}
	}
	if c.Name == "" {
		c.Name, _ = os.Hostname()
	}
	return errors.Join(errs...)
}

func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL", s)
	}
	return nil
}

// TTL is the parsed session TTL.
func (c *Config) TTL() time.Duration {
	if c.sessionTTL == 0 {
		return DefaultSessionTTL
	}
	return c.sessionTTL
}

// Endpoints are the etcd client URLs this server connects to.
func (c *Config) Endpoints() []string {
	if c.Etcd != nil {
		return c.Etcd.Endpoints
	}
	if c.Embedded != nil {
		return c.Embedded.ClientEndpoints
	}
	return nil
}

// initialCluster renders InitialCluster as etcd's "a=URL,b=URL".
func (e *EmbeddedConfig) initialCluster() string {
	names := make([]string, 0, len(e.InitialCluster))
	for n := range e.InitialCluster {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, n+"="+e.InitialCluster[n])
	}
	return strings.Join(parts, ",")
}

// clientTLS builds the client's TLS config, or nil without a tls block.
func (e *EtcdConfig) clientTLS() (*tls.Config, error) {
	if e == nil || e.TLS == nil {
		return nil, nil
	}
	return e.TLS.config("cluster.etcd.tls")
}

// config is the client side of t: the CA verifies the members, the
// certificate (if any) is presented to them.
func (t *TLS) config(where string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no certificate in %s", where, t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// clientTLS is how this server's client reaches the members: with the
// member's own certificate (it carries client auth too) and the CA.
func (e *EmbeddedConfig) clientTLS() (*tls.Config, error) {
	if e == nil || e.TLS == nil {
		return nil, nil
	}
	return e.TLS.config("cluster.embedded_etcd.tls")
}
