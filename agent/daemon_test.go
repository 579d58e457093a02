package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	key, der := issue(t, &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}, nil)
	cert, _ := x509.ParseCertificate(der)
	return testCA{cert: cert, key: key}
}

// issue makes a P-256 key and a certificate for it from tmpl, valid from
// an hour ago to an hour ahead and signed by signer (nil: self-signed).
func issue(t *testing.T, tmpl *x509.Certificate, signer *testCA) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	parent, parentKey := tmpl, key
	if signer != nil {
		parent, parentKey = signer.cert, signer.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func (ca testCA) pin() string {
	sum := sha256.Sum256(ca.cert.Raw)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// serve starts a TLS server on 127.0.0.1 whose certificate ca issued for
// ips; withCA sends the CA along, as the daemon does.
func (ca testCA) serve(t *testing.T, ips []net.IP, withCA bool) *httptest.Server {
	t.Helper()
	key, der := issue(t, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "fleetd"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: ips}, &ca)
	chain := [][]byte{der}
	if withCA {
		chain = append(chain, ca.cert.Raw)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: chain, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func TestNewHTTPClientPinsTheDaemonCA(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	loop := []net.IP{net.ParseIP("127.0.0.1")}
	good := ca.serve(t, loop, true)
	noCA := ca.serve(t, loop, false)
	wrongHost := ca.serve(t, []net.IP{net.ParseIP("10.9.9.9")}, true)
	leafSum := sha256.Sum256(good.Certificate().Raw)

	tests := []struct {
		name, url, pin string
		wantErr        string // substring; empty: the request succeeds
	}{
		{name: "pinned CA", url: good.URL, pin: ca.pin()},
		{name: "pin with colons", url: good.URL, pin: strings.ToUpper(colons(ca.pin()))},
		{name: "another CA", url: good.URL, pin: other.pin(), wantErr: "pinned CA fingerprint"},
		{name: "leaf pinned instead of the CA", url: good.URL, pin: "sha256:" + hex.EncodeToString(leafSum[:]), wantErr: "pinned CA fingerprint"},
		{name: "CA not presented", url: noCA.URL, pin: ca.pin(), wantErr: "pinned CA fingerprint"},
		{name: "certificate for another host", url: wrongHost.URL, pin: ca.pin(), wantErr: "verify daemon certificate"},
		{name: "no pin: system roots", url: good.URL, wantErr: "certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hc, err := NewHTTPClient(tt.url, tt.pin)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := hc.Get(tt.url)
			if err == nil {
				resp.Body.Close()
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("GET: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("GET: %v, want an error with %q", err, tt.wantErr)
			}
			if tt.wantErr == "pinned CA fingerprint" && !permanent(err) {
				t.Errorf("a pin mismatch must not be retried: %v", err)
			}
		})
	}
}

func colons(pin string) string {
	h := strings.TrimPrefix(pin, "sha256:")
	var parts []string
	for i := 0; i < len(h); i += 2 {
		parts = append(parts, h[i:i+2])
	}
	return "sha256:" + strings.Join(parts, ":")
}

func TestNewHTTPClientRefusesPlainHTTPOffLoopback(t *testing.T) {
	for url, ok := range map[string]bool{
		"http://127.0.0.1:8080":   true,
		"http://127.0.10.3:8080":  true,
		"http://localhost:8080":   true,
		"http://[::1]:8080":       true,
		"http://0.0.0.0:7777":     true,
		"http://10.0.0.5:8080":    false,
		"http://fleetd.internal/": false,
		"https://10.0.0.5:8443":   true,
		"ftp://127.0.0.1/":        false,
	} {
		_, err := NewHTTPClient(url, "")
		if (err == nil) != ok {
			t.Errorf("NewHTTPClient(%s): %v, want ok=%v", url, err, ok)
		}
	}
	if _, err := NewHTTPClient("https://10.0.0.5", "sha256:abcd"); err == nil {
		t.Error("a short fingerprint was accepted")
	}
}

func TestLogShipperBatchesAndDropsOldestWhileDown(t *testing.T) {
	var mu sync.Mutex
	var got []logsRequest
	down := true
	s := newLogShipper(func(_ context.Context, r logsRequest) error {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return errors.New("daemon down")
		}
		got = append(got, r)
		return nil
	})
	var dropped int
	s.onError = func(_ error, d int) { dropped = d }
	for i := range shipBuffer + 500 {
		s.add(3, i%2, "line "+itoa(i))
	}
	s.flush(context.Background())
	if dropped == 0 {
		t.Fatal("no lines dropped with the buffer over its bound and the daemon down")
	}
	mu.Lock()
	down = false
	mu.Unlock()
	s.add(4, 0, "after")
	s.flush(context.Background())
	total := 0
	var last string
	for _, r := range got {
		if len(r.Lines) > 4*shipBatch {
			t.Errorf("a request carried %d lines", len(r.Lines))
		}
		total += len(r.Lines)
		last = r.Lines[len(r.Lines)-1]
	}
	if total > shipBuffer || total < shipBuffer/2 {
		t.Errorf("shipped %d lines after the outage, want at most the buffer (%d)", total, shipBuffer)
	}
	if last != "after" || got[len(got)-1].Round != 4 {
		t.Errorf("last line %q of round %d, want the newest line last", last, got[len(got)-1].Round)
	}
	if first := got[0].Lines[0]; first == "line 0" {
		t.Error("the oldest line survived; the newest should have been kept")
	}
}
