package agentapi

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

func TestCheckpointKeyLayout(t *testing.T) {
	good := map[string]int64{
		"manifests/step-5.json":          5,
		"data/step-12/model.pt":          12,
		"data/step-12/optim/shard-0.bin": 12,
		"data/step-0/COMPLETE":           0,
	}
	for k, want := range good {
		if got, ok := ckptKeyStep(k); !ok || got != want {
			t.Errorf("%s: %d %v, want %d", k, got, ok, want)
		}
	}
	for _, k := range []string{
		"", "manifests/step-5", "manifests/step-x.json", "data/step-1", "data/step-1/", "data/step-1/../../etc/passwd",
		"data/step-1/a//b", "data/step-1//a", "data/step-1/./a", "other/step-1/a", "data/step-1/a\\b", "../manifests/step-1.json",
		"data/step-99999999999999999999/a",
	} {
		if _, ok := ckptKeyStep(k); ok {
			t.Errorf("%q accepted as a checkpoint key", k)
		}
	}
}

// TestGCSSignedURLV4 signs through the daemon's own path (the store URL
// opened by gocloud's gcsblob driver, its storage signer in V4) and
// verifies the result independently, from GCS's V4 signing rules and the
// service account's public key: canonical request, string to sign,
// RSA-SHA256.
func TestGCSSignedURLV4(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "sa.pem")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	const sa = "fleetd-daemon@proj.iam.gserviceaccount.com"
	store := "gs://ckpt-bucket/runs/bert?anonymous=true&access_id=" + url.QueryEscape(sa) + "&private_key_path=" + url.QueryEscape(keyFile)
	var r ckptRegistry
	b, err := r.bucket(context.Background(), store)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"manifests/step-1200.json", "data/step-1200/optim/shard 0.bin"}
	for _, method := range []string{"GET", "PUT"} {
		urls, err := signCheckpointURLs(context.Background(), b, store, method, keys, 15*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			verifyGCSV4(t, urls[k], method, "/ckpt-bucket/runs/bert/"+k, sa, &key.PublicKey)
		}
	}
}

// verifyGCSV4 checks a V4 signed URL (cloud.google.com/storage/docs/access-control/signing-urls-manually).
func verifyGCSV4(t *testing.T, raw, method, object, sa string, pub *rsa.PublicKey) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if u.Host != "storage.googleapis.com" || u.Path != object {
		t.Fatalf("%s signs %s%s, want storage.googleapis.com%s", method, u.Host, u.Path, object)
	}
	date := q.Get("X-Goog-Date")
	scope := date[:8] + "/auto/storage/goog4_request"
	if q.Get("X-Goog-Algorithm") != "GOOG4-RSA-SHA256" || q.Get("X-Goog-Credential") != sa+"/"+scope ||
		(q.Get("X-Goog-Expires") != "900" && q.Get("X-Goog-Expires") != "899") || q.Get("X-Goog-SignedHeaders") != "host" {
		t.Fatalf("query %v", q)
	}
	ts, err := time.Parse("20060102T150405Z", date)
	if err != nil || time.Since(ts) > time.Minute || time.Until(ts) > time.Minute {
		t.Fatalf("X-Goog-Date %q: %v", date, err)
	}
	sig, err := hex.DecodeString(q.Get("X-Goog-Signature"))
	if err != nil {
		t.Fatal(err)
	}
	q.Del("X-Goog-Signature")
	names := make([]string, 0, len(q))
	for k := range q {
		names = append(names, k)
	}
	sort.Strings(names)
	var cq []string
	for _, k := range names {
		cq = append(cq, uriEncode(k)+"="+uriEncode(q.Get(k)))
	}
	canonical := strings.Join([]string{method, u.EscapedPath(), strings.Join(cq, "&"), "host:" + u.Host + "\n", "host", "UNSIGNED-PAYLOAD"}, "\n")
	h := sha256.Sum256([]byte(canonical))
	toSign := strings.Join([]string{"GOOG4-RSA-SHA256", date, scope, hex.EncodeToString(h[:])}, "\n")
	d := sha256.Sum256([]byte(toSign))
	if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, d[:], sig); err != nil {
		t.Fatalf("%s %s: the signature does not verify with the service account's key: %v\ncanonical request:\n%s", method, object, err, canonical)
	}
	// A different method must not verify with the same signature.
	other := strings.Replace(canonical, method+"\n", "DELETE\n", 1)
	h = sha256.Sum256([]byte(other))
	d = sha256.Sum256([]byte(strings.Join([]string{"GOOG4-RSA-SHA256", date, scope, hex.EncodeToString(h[:])}, "\n")))
	if rsa.VerifyPKCS1v15(pub, crypto.SHA256, d[:], sig) == nil {
		t.Fatal("the signature also verifies for DELETE")
	}
}

// uriEncode is RFC 3986 percent-encoding of everything but unreserved characters.
func uriEncode(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
		} else {
			b.WriteString("%" + strings.ToUpper(hex.EncodeToString([]byte{c})))
		}
	}
	return b.String()
}
