package fleet

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
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is the daemon's own certificate authority. Agents pin its fingerprint
// (carried in their user-data), so no public PKI is needed.
type CA struct {
	CertPEM     []byte
	Fingerprint string // sha256 of the DER certificate, hex
	cert        *x509.Certificate
	key         *ecdsa.PrivateKey
}

// loadOrCreateCA reads ca.pem/ca-key.pem from dir or creates them (0600).
func loadOrCreateCA(dir string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	certPEM, err1 := os.ReadFile(certPath)
	keyPEM, err2 := os.ReadFile(keyPath)
	if err1 == nil && err2 == nil {
		return parseCA(certPEM, keyPEM)
	}
	if !errors.Is(err1, os.ErrNotExist) && err1 != nil {
		return nil, fmt.Errorf("read CA: %w", err1)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(),
		Subject:               pkix.Name{CommonName: "fleetd CA", Organization: []string{"fleetd"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA: %w", err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(certPath, certPEM, 0o600); err != nil {
		return nil, err
	}
	return parseCA(certPEM, keyPEM)
}

func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("CA files are not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CA key: %w", err)
	}
	sum := sha256.Sum256(cert.Raw)
	return &CA{CertPEM: certPEM, Fingerprint: hex.EncodeToString(sum[:]), cert: cert, key: key}, nil
}

// ServerCert issues a fresh server certificate for hosts (IPs or DNS names).
// It is regenerated at every start, so changing hosts needs no migration.
func (ca *CA) ServerCert(hosts []string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: randSerial(),
		Subject:      pkix.Name{CommonName: "fleetd"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range append([]string{"localhost", "127.0.0.1", "::1"}, hosts...) {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("issue server certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key}, nil
}

func randSerial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// writeFileAtomic writes via a temp file + rename so a crash never leaves a
// half-written key or token behind.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// sharedCA is the CA of a cluster: every server issues its own server
// certificate from the same CA, so agents and the CLI pin one fingerprint
// whichever server they reach. The first server to start offers its local
// CA (or a new one); the others adopt the shared one and write it to their
// data dir, where `-ca-cert data_dir/ca.pem` finds it.
func (d *Daemon) sharedCA(ctx context.Context) (*CA, error) {
	v, err := sharedSecret(ctx, d.store, "tls_ca", func() (string, error) {
		local, err := loadOrCreateCA(d.cfg.DataDir)
		if err != nil {
			return "", err
		}
		kb, err := x509.MarshalECPrivateKey(local.key)
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(caPEM{Cert: string(local.CertPEM), Key: string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))})
		return string(b), err
	})
	if err != nil {
		return nil, fmt.Errorf("shared CA: %w", err)
	}
	var pair caPEM
	if err := json.Unmarshal([]byte(v), &pair); err != nil {
		return nil, fmt.Errorf("shared CA: %w", err)
	}
	ca, err := parseCA([]byte(pair.Cert), []byte(pair.Key))
	if err != nil {
		return nil, fmt.Errorf("shared CA: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(d.cfg.DataDir, "ca-key.pem"), []byte(pair.Key), 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(filepath.Join(d.cfg.DataDir, "ca.pem"), []byte(pair.Cert), 0o600); err != nil {
		return nil, err
	}
	return ca, nil
}

// caPEM is the shared CA as stored in the cluster's state (meta tls_ca),
// as secret as the admin token next to it.
type caPEM struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}
