package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fleetd/fleetd/internal/freeport"
)

func freePort(t *testing.T) int {
	t.Helper()
	p, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigFinish(t *testing.T) {
	peer := "http://127.0.0.1:2380"
	cases := []struct {
		name string
		cfg  Config
		err  string
	}{
		{"existing etcd", Config{Etcd: &EtcdConfig{Endpoints: []string{"https://etcd-1:2379"}}}, ""},
		{"embedded", Config{Embedded: &EmbeddedConfig{Name: "a", ListenPeer: peer, InitialCluster: map[string]string{"a": peer, "b": "http://127.0.0.2:2380"}}}, ""},
		{"neither", Config{}, "exactly one of"},
		{"both", Config{Etcd: &EtcdConfig{Endpoints: []string{"http://x:2379"}}, Embedded: &EmbeddedConfig{Name: "a", ListenPeer: peer, InitialCluster: map[string]string{"a": peer}}}, "exactly one of"},
		{"no endpoints", Config{Etcd: &EtcdConfig{}}, "at least one etcd client URL"},
		{"bad ttl", Config{SessionTTL: "1500ms", Etcd: &EtcdConfig{Endpoints: []string{"http://x:2379"}}}, "whole seconds"},
		{"self missing from initial_cluster", Config{Embedded: &EmbeddedConfig{Name: "c", ListenPeer: peer, InitialCluster: map[string]string{"a": peer}}}, `no member "c"`},
		{"peer mismatch", Config{Embedded: &EmbeddedConfig{Name: "a", ListenPeer: peer, InitialCluster: map[string]string{"a": "http://127.0.0.9:2380"}}}, "but listen_peer"},
		{"bad prefix", Config{Prefix: "fleetd", Etcd: &EtcdConfig{Endpoints: []string{"http://x:2379"}}}, "must start and end with /"},
		{"tls on http", Config{Embedded: &EmbeddedConfig{Name: "a", ListenPeer: peer, InitialCluster: map[string]string{"a": peer}, TLS: &TLS{CAFile: "ca", CertFile: "c", KeyFile: "k"}}}, "every member URL is https://"},
		{"tls incomplete", Config{Embedded: &EmbeddedConfig{Name: "a", ListenPeer: "https://127.0.0.1:2380", InitialCluster: map[string]string{"a": "https://127.0.0.1:2380"}, TLS: &TLS{CAFile: "ca"}}}, "are all required"},
		{"bad cluster state", Config{Embedded: &EmbeddedConfig{Name: "a", ListenPeer: peer, InitialCluster: map[string]string{"a": peer}, InitialClusterState: "old"}}, "initial_cluster_state"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Finish("", "/var/lib/fleetd")
			if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Finish: %v, want error containing %q", err, tc.err)
			}
		})
	}
	c := Config{Embedded: &EmbeddedConfig{Name: "a", ListenPeer: peer, InitialCluster: map[string]string{"a": peer}}}
	if err := c.Finish("", "/var/lib/fleetd"); err != nil {
		t.Fatal(err)
	}
	if c.Name != "a" || c.Embedded.ListenClient != "http://127.0.0.1:2379" || c.Embedded.DataDir != "/var/lib/fleetd/etcd" || c.TTL() != DefaultSessionTTL || c.Prefix != DefaultPrefix {
		t.Errorf("defaults: %+v %+v", c, *c.Embedded)
	}
}

// startCluster starts n embedded members on loopback (with TLS when pki
// is set) and returns their configs (with client endpoints of all
// members) and members.
func startCluster(t *testing.T, n int, pki *TLS) ([]*Config, []*Member) {
	t.Helper()
	// A port picked free can be taken by another test binary before etcd
	// binds it: start again on new ports.
	var err error
	for range 3 {
		var cfgs []*Config
		var members []*Member
		cfgs, members, err = tryStartCluster(t, n, pki)
		if err == nil {
			t.Cleanup(func() {
				for _, m := range members {
					m.Close()
				}
			})
			return cfgs, members
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
		t.Logf("start again on new ports: %v", err)
	}
	t.Fatal(err)
	return nil, nil
}

func tryStartCluster(t *testing.T, n int, pki *TLS) ([]*Config, []*Member, error) {
	scheme := "http"
	if pki != nil {
		scheme = "https"
	}
	initial := map[string]string{}
	var clients []string
	embeds := make([]*EmbeddedConfig, n)
	for i := range n {
		name := fmt.Sprintf("m%d", i)
		peer := fmt.Sprintf("%s://127.0.0.1:%d", scheme, freePort(t))
		client := fmt.Sprintf("%s://127.0.0.1:%d", scheme, freePort(t))
		initial[name] = peer
		clients = append(clients, client)
		embeds[i] = &EmbeddedConfig{Name: name, ListenPeer: peer, ListenClient: client, DataDir: t.TempDir(), TLS: pki}
	}
	cfgs := make([]*Config, n)
	members := make([]*Member, n)
	errc := make(chan error, n)
	for i, e := range embeds {
		e.InitialCluster = initial
		e.ClientEndpoints = clients
		cfgs[i] = &Config{SessionTTL: "2s", Embedded: e}
		if err := cfgs[i].Finish("", ""); err != nil {
			return nil, nil, err
		}
		go func() {
			m, err := StartMember(t.Context(), e)
			members[i] = m
			errc <- err
		}()
	}
	var first error
	for range n {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		for _, m := range members {
			if m != nil {
				m.Close()
			}
		}
		return nil, nil, first
	}
	return cfgs, members, nil
}

// TestElectionAndFencing: three servers on a real three-member etcd; one
// leads; when its session lapses (its client dies, as on a SIGKILL or a
// long pause) another takes over within about the TTL, and the old term's
// fence refuses writes.
func TestElectionAndFencing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member etcd")
	}
	cfgs, _ := startCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type cand struct {
		cli  *clientv3.Client
		el   *Elector
		term chan *Term
	}
	cands := make([]*cand, 3)
	for i, c := range cfgs {
		cli, err := Connect(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		cands[i] = &cand{cli: cli, el: NewElector(cli, c.Prefix, c.TTL(), Server{Name: c.Name, URL: "http://srv-" + c.Name}), term: make(chan *Term, 1)}
		go func() {
			term, err := cands[i].el.Campaign(ctx)
			if err == nil {
				cands[i].term <- term
			}
		}()
	}
	first, firstTerm := -1, (*Term)(nil)
	select {
	case firstTerm = <-cands[0].term:
		first = 0
	case firstTerm = <-cands[1].term:
		first = 1
	case firstTerm = <-cands[2].term:
		first = 2
	case <-ctx.Done():
		t.Fatal("no leader elected")
	}
	time.Sleep(300 * time.Millisecond)
	for i, c := range cands {
		if i != first && len(c.term) != 0 {
			t.Fatalf("two leaders: %d and %d", first, i)
		}
	}
	other := cands[(first+1)%3]
	leader, err := other.el.Leader(ctx)
	if err != nil || leader.Name != cfgs[first].Name {
		t.Fatalf("Leader() from a follower = %+v, %v; want %s", leader, err, cfgs[first].Name)
	}
	fenced := func(term *Term, key string) error {
		resp, err := other.cli.Txn(ctx).If(term.Fence()...).Then(clientv3.OpPut(key, "x")).Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			return fmt.Errorf("fenced")
		}
		return nil
	}
	if err := fenced(firstTerm, "/fleetd/test/a"); err != nil {
		t.Fatalf("write in the leader's term: %v", err)
	}

	// The leader's process dies: its client goes, its lease is not renewed.
	start := time.Now()
	cands[first].cli.Close()
	var second *Term
	for i, c := range cands {
		if i == first {
			continue
		}
		select {
		case second = <-c.term:
		case <-time.After(0):
		}
		if second != nil {
			break
		}
	}
	for second == nil {
		select {
		case second = <-cands[(first+1)%3].term:
		case second = <-cands[(first+2)%3].term:
		case <-ctx.Done():
			t.Fatal("no new leader after the first died")
		}
	}
	t.Logf("failover: new leader acting %.2fs after the old one's client died (session TTL %s)", time.Since(start).Seconds(), cfgs[0].TTL())
	if second.Rev <= firstTerm.Rev {
		t.Errorf("new term revision %d not after the old %d", second.Rev, firstTerm.Rev)
	}
	if err := fenced(firstTerm, "/fleetd/test/b"); err == nil {
		t.Error("a write fenced by the deposed leader's term succeeded")
	}
	if err := fenced(second, "/fleetd/test/c"); err != nil {
		t.Errorf("write in the new term: %v", err)
	}
	second.Resign(ctx)
	select {
	case <-second.Done():
	case <-time.After(5 * time.Second):
		t.Error("term not done after Resign")
	}
}

// stallProxy forwards TCP to an etcd member and can stop moving bytes while
// keeping every connection open: what a client sees when the member's VM is
// paused or a partition drops packets without resets.
type stallProxy struct {
	ln      net.Listener
	mu      sync.Mutex
	stalled bool
	resume  chan struct{}
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, resume: make(chan struct{})}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go p.pipe(c, u)
			go p.pipe(u, c)
		}
	}()
	return p
}

func (p *stallProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *stallProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			wait := p.resume
			stalled := p.stalled
			p.mu.Unlock()
			if stalled {
				<-wait
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) stall(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on == p.stalled {
		return
	}
	p.stalled = on
	if !on {
		close(p.resume)
		p.resume = make(chan struct{})
	}
}

// TestTermSurvivesStalledMember: the leader's client reaches etcd through
// two members; each in turn stalls for several TTLs. The other member
// serves renewals, so the term must not end. (With clientv3's keepalive
// stream the renewal hung on whichever member carried it and the term
// lapsed; seen as a flaky leader change in TestHAThreeServers.)
func TestTermSurvivesStalledMember(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member etcd")
	}
	cfgs, _ := startCluster(t, 3, nil)
	eps := cfgs[0].Embedded.ClientEndpoints
	pa := newStallProxy(t, strings.TrimPrefix(eps[0], "http://"))
	pb := newStallProxy(t, strings.TrimPrefix(eps[1], "http://"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{pa.url(), pb.url()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	el := NewElector(cli, cfgs[0].Prefix, cfgs[0].TTL(), Server{Name: "solo"})
	term, err := el.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*stallProxy{pa, pb} {
		p.stall(true)
		select {
		case <-term.Done():
			p.stall(false)
			t.Fatalf("the term ended while one of two members was stalled (TTL %s)", cfgs[0].TTL())
		case <-time.After(3 * cfgs[0].TTL()):
		}
		p.stall(false)
	}
	// Both stalled: nothing can renew the lease, so the term must end
	// within about the TTL, before etcd would let another server lead.
	pa.stall(true)
	pb.stall(true)
	start := time.Now()
	select {
	case <-term.Done():
		t.Logf("term ended %.2fs after every member stalled (TTL %s)", time.Since(start).Seconds(), cfgs[0].TTL())
	case <-time.After(2 * cfgs[0].TTL()):
		t.Error("the term outlived its lease with every member stalled")
	}
	pa.stall(false)
	pb.stall(false)
}

// writeTestPKI writes a CA and one certificate for 127.0.0.1 with server
// and client auth (what each server's member presents on both sides).
func writeTestPKI(t *testing.T) *TLS {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleetd test etcd CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "member"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return &TLS{CAFile: write("ca.pem", "CERTIFICATE", caDER), CertFile: write("member.pem", "CERTIFICATE", der), KeyFile: write("member-key.pem", "EC PRIVATE KEY", keyDER)}
}

// TestEmbeddedTLS: three members with tls {} talk raft and serve clients
// over mutual TLS; an election runs on it; a client without a certificate
// from the CA is refused.
func TestEmbeddedTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member etcd")
	}
	pki := writeTestPKI(t)
	cfgs, _ := startCluster(t, 3, pki)
	clients := cfgs[0].Embedded.ClientEndpoints
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := Connect(ctx, cfgs[1])
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "/fleetd/tls-test", "x"); err != nil {
		t.Fatalf("put over TLS: %v", err)
	}
	term, err := NewElector(cli, cfgs[1].Prefix, cfgs[1].TTL(), Server{Name: "m1"}).Campaign(ctx)
	if err != nil {
		t.Fatalf("campaign over TLS: %v", err)
	}
	term.Resign(ctx)

	// The CA but no client certificate: the members refuse the handshake.
	anon, err := (&TLS{CAFile: pki.CAFile}).config("test")
	if err != nil {
		t.Fatal(err)
	}
	bare, err := clientv3.New(clientv3.Config{Endpoints: clients, TLS: anon, DialTimeout: 2 * time.Second})
	if err == nil {
		defer bare.Close()
		actx, acancel := context.WithTimeout(ctx, 3*time.Second)
		_, err = bare.Get(actx, "/fleetd/tls-test")
		acancel()
	}
	if err == nil {
		t.Error("a client without a certificate from the CA read the members' state")
	}
}
