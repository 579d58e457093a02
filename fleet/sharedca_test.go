package fleet

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/cluster"
	"github.com/fleetd/fleetd/internal/freeport"
)

func loopbackURL(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + addr
}

// soloCluster starts a cluster test (skipped with -short): the test's
// context (60 s), the config of server "a", which starts a one-member
// embedded etcd cluster on loopback, and the client URL other servers
// join it by.
func soloCluster(t *testing.T) (ctx context.Context, a *cluster.Config, client string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts an etcd member")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	peer, client := loopbackURL(t), loopbackURL(t)
	return ctx, &cluster.Config{Embedded: &cluster.EmbeddedConfig{Name: "a", ListenPeer: peer, ListenClient: client, InitialCluster: map[string]string{"a": peer}}}, client
}

// newClusterServer makes (but does not run) cluster server name on the
// data dir dir, closed at cleanup; withTLS generates its certificates.
// opts give the providers, their schema and the projects.
func newClusterServer(ctx context.Context, t *testing.T, name, dir string, cl *cluster.Config, withTLS bool, opts Options) *Daemon {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Projects = opts.Config.Projects // the one part of opts.Config a test sets
	cfg.Listen, cfg.DataDir, cfg.TokenFile, cfg.Cluster = "127.0.0.1:0", dir, filepath.Join(dir, "token"), cl
	if withTLS {
		cfg.TLS = &TLSConfig{}
	}
	if err := cfg.Finish(); err != nil {
		t.Fatal(err)
	}
	opts.Config, opts.Version, opts.Logger = cfg, "test", slog.New(slog.DiscardHandler)
	d, err := New(ctx, opts)
	if err != nil {
		t.Fatalf("server %s: %v", name, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestClusterSharesOneCA: two servers of a cluster with tls {} (generated
// certificates) issue their server certificates from one CA, so an agent
// or CLI that pins it reaches either server. The second server adopts the
// first's CA although it had its own in its data dir.
func TestClusterSharesOneCA(t *testing.T) {
	ctx, solo, client := soloCluster(t)
	dirA := t.TempDir()
	a := newClusterServer(ctx, t, "a", dirA, solo, true, Options{})
	// b had a CA of its own from an earlier single-server life.
	dirB := t.TempDir()
	own, err := loadOrCreateCA(dirB)
	if err != nil {
		t.Fatal(err)
	}
	if own.Fingerprint == a.CA().Fingerprint {
		t.Fatal("two fresh CAs with one fingerprint")
	}
	b := newClusterServer(ctx, t, "b", dirB, &cluster.Config{Name: "b", Etcd: &cluster.EtcdConfig{Endpoints: []string{client}}}, true, Options{})

	if a.CA().Fingerprint != b.CA().Fingerprint {
		t.Fatalf("servers pin different CAs: %s and %s", a.CA().Fingerprint, b.CA().Fingerprint)
	}
	pemA, _ := os.ReadFile(filepath.Join(dirA, "ca.pem"))
	pemB, _ := os.ReadFile(filepath.Join(dirB, "ca.pem"))
	if !bytes.Equal(pemA, pemB) {
		t.Error("b's data_dir/ca.pem is not the cluster's CA")
	}
	// One pinned CA reaches both servers over TLS.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemA)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	for name, d := range map[string]*Daemon{"a": a, "b": b} {
		if err := d.Listen(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = d.Run(ctx) }()
		resp, err := hc.Get(d.URL() + "/healthz")
		if err != nil {
			t.Fatalf("server %s with the shared CA pinned: %v", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("server %s /healthz: HTTP %d", name, resp.StatusCode)
		}
	}
}
