package ckpt

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"gocloud.dev/blob"
	"gocloud.dev/blob/s3blob"

	"github.com/fleetd/fleetd/providers/aws/motoserver"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := motoserver.CloseShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

const motoRegion = "us-east-1"

// motoBucket creates a bucket on a moto server and returns the store URL
// gocloud opens it with (the static test key in the environment, as the
// SDK's default chain reads it).
func motoBucket(t *testing.T, srv *motoserver.Server, prefix string) string {
	t.Helper()
	motoserver.UseStaticKeys(t)
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	name = fmt.Sprintf("%.40s-%d", name, time.Now().UnixNano()%1e6)
	c := s3.NewFromConfig(srv.Config(motoRegion), func(o *s3.Options) { o.UsePathStyle = true })
	if _, err := c.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("s3://%s/%s?endpoint=%s&region=%s&use_path_style=true", name, prefix, srv.URL(), motoRegion)
}

func openT(t *testing.T, store string) *BucketStore {
	t.Helper()
	s, err := OpenBucket(t.Context(), store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestS3StoreRoundTrip runs the store life cycle on moto through
// gocloud's s3blob driver, with a part size that makes model.pt a
// multipart upload.
func TestS3StoreRoundTrip(t *testing.T) {
	srv := motoserver.Shared(t)
	s := openT(t, motoBucket(t, srv, "runs/bert"))
	s.PartSize = 5 << 20 // S3's minimum part
	storeRoundTrip(t, s)
	dir := t.TempDir()
	big := map[string][]byte{"model.pt": randBytes(9, 12<<20)}
	writeStep(t, dir, 7, big)
	m := New(testConfig(t, dir, &eventLog{}), s)
	if err := m.Upload(t.Context(), LocalStep{Step: 7, Dir: filepath.Join(dir, StepName(7))}); err != nil {
		t.Fatal(err)
	}
	r, err := New(testConfig(t, filepath.Join(t.TempDir(), "c"), &eventLog{}), s).restoreStep(t.Context(), 7)
	if err != nil {
		t.Fatal(err)
	}
	sameTree(t, r.Dir, big)
}

// bucketSigner is a daemon's signer in miniature: it signs with the
// bucket's driver (s3blob presigns with the SDK's SigV4 presigner).
type bucketSigner struct {
	s     *BucketStore
	signs int
}

func (b *bucketSigner) Sign(ctx context.Context, method string, keys []string) (map[string]string, time.Time, error) {
	b.signs++
	out := map[string]string{}
	for _, k := range keys {
		u, err := b.s.Bucket().SignedURL(ctx, k, &blob.SignedURLOptions{Method: method, Expiry: 10 * time.Minute})
		if err != nil {
			return nil, time.Time{}, err
		}
		out[k] = u
	}
	return out, time.Now().Add(10 * time.Minute), nil
}

func (b *bucketSigner) List(ctx context.Context, prefix string) ([]Object, error) {
	return b.s.List(ctx, prefix)
}
func (b *bucketSigner) Delete(ctx context.Context, keys []string) error { return b.s.Delete(ctx, keys) }

// TestSignedS3RoundTrip: the node holds no key; every byte goes through
// presigned URLs to moto.
func TestSignedS3RoundTrip(t *testing.T) {
	srv := motoserver.Shared(t)
	bs := openT(t, motoBucket(t, srv, "signed"))
	signer := &bucketSigner{s: bs}
	noKeys := &http.Client{Transport: &http.Transport{Proxy: nil}}
	st := NewSignedStore(signer, noKeys, "s3://b/signed")
	st.SendMD5 = true
	storeRoundTrip(t, st)
	if signer.signs == 0 {
		t.Fatal("nothing was signed")
	}
}

// writeOnly passes writes to a real store and answers listings as an
// empty store would.
type writeOnly struct{ Store }

func (writeOnly) List(context.Context, string) ([]Object, error) { return nil, nil }

func TestS3MissingBucket(t *testing.T) {
	srv := motoserver.Shared(t)
	store := motoBucket(t, srv, "p")
	store = strings.Replace(store, "s3://", "s3://no-such-", 1)
	s := openT(t, store)
	dir := t.TempDir()
	writeStep(t, dir, 5, map[string][]byte{"w": []byte("x")})
	log := &eventLog{}
	m := New(testConfig(t, dir, log), s)
	runManager(t, m)
	waitFor(t, 10*time.Second, "the failure reported", func() bool { return log.has(EventUploadFailed, 5) })
	st, _ := m.Status()
	if st.ErrorKind != KindNotFound || !strings.Contains(st.Error, "does not exist") {
		t.Fatalf("status %+v", st)
	}
	if local, _ := LocalSteps(dir); len(local) != 1 {
		t.Fatal("the local checkpoint is gone")
	}
	_, err := New(testConfig(t, t.TempDir(), &eventLog{}), s).Restore(t.Context())
	if ErrorKind(err) != KindNotFound {
		t.Fatalf("restore from a missing bucket: %v", err)
	}
}

// TestS3DeniedWrite: an IAM user that may read but not write. Its own
// moto server, since IAM enforcement is server-wide.
func TestS3DeniedWrite(t *testing.T) {
	srv := motoserver.StartT(t)
	store := motoBucket(t, srv, "p")
	policy := `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:ListBucket","s3:GetObject"],"Resource":"*"}]}`
	creds, err := srv.CreateUser(t.Context(), "reader", policy)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.EnforceIAM(t.Context(), 0); err != nil {
		t.Fatal(err)
	}
	cfg := srv.Config(motoRegion)
	cfg.Credentials = credentials.NewStaticCredentialsProvider(creds.AccessKeyID, creds.SecretAccessKey, "")
	client := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true })
	bucket := strings.TrimPrefix(store[:strings.Index(store, "/p?")], "s3://")
	b, err := s3blob.OpenBucket(t.Context(), client, bucket, nil)
	if err != nil {
		t.Fatal(err)
	}
	reader := NewBucketStore(blob.PrefixedBucket(b, "p/"), "s3://"+bucket+"/p")
	defer reader.Close()
	// Moto checks the signature of a listing with a prefix differently
	// from the SDK (SignatureDoesNotMatch) once IAM is on: the listings
	// are left out, the writes are real.
	s := writeOnly{reader}
	dir := t.TempDir()
	writeStep(t, dir, 5, map[string][]byte{"w": []byte("x")})
	err = New(testConfig(t, dir, &eventLog{}), s).Upload(t.Context(), LocalStep{Step: 5, Dir: filepath.Join(dir, StepName(5))})
	if ErrorKind(err) != KindDenied {
		t.Fatalf("upload with a read-only key: %v (kind %s), want denied", err, ErrorKind(err))
	}
	var se *StoreError
	if !errors.As(err, &se) || !strings.HasPrefix(se.Op, "write ") || !strings.Contains(err.Error(), "access denied") {
		t.Fatalf("error does not say access denied: %v", err)
	}
	if err := srv.DisableIAM(t.Context()); err != nil {
		t.Fatal(err)
	}
	if keys := storeKeys(t, openT(t, store)); len(keys) != 0 {
		t.Fatalf("a denied upload left %v", keys)
	}
}
