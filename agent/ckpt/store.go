package ckpt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path"
	"strings"
	"syscall"

	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"
	"gocloud.dev/gcerrors"

	"github.com/fleetd/fleetd/agentwire"
)

// Object is a stored object's key (relative to the store's prefix) and size.
type Object = agentwire.CheckpointObject

// Store is what the manager needs of an object store. Keys are relative
// to the store's prefix.
type Store interface {
	// List returns the objects whose keys start with prefix.
	List(ctx context.Context, prefix string) ([]Object, error)
	// Open reads an object.
	Open(ctx context.Context, key string) (io.ReadCloser, error)
	// Put writes size bytes from r to key. A non-nil md5 lets the store
	// check that the bytes arrived intact.
	Put(ctx context.Context, key string, r io.Reader, size int64, md5 []byte) error
	// Delete removes objects; a missing one is not an error.
	Delete(ctx context.Context, keys []string) error
	// String names the store in messages (no credentials).
	String() string
}

// Error kinds: what went wrong with the store, for status and alerts.
const (
	KindUnreachable = "unreachable" // no answer (DNS, connection refused, timeout)
	KindNotFound    = "not-found"   // the bucket or directory does not exist
	KindDenied      = "denied"      // credentials or signature refused
	KindCorrupt     = "corrupt"     // a checksum or size did not match
	KindFailed      = "failed"      // anything else
)

// StoreError is a failed store operation with its kind.
type StoreError struct {
	Op, Key, Kind string
	Err           error
}

func (e *StoreError) Error() string {
	what := e.Op
	if e.Key != "" {
		what += " " + e.Key
	}
	return fmt.Sprintf("%s: %s: %v", what, kindText(e.Kind), e.Err)
}

func (e *StoreError) Unwrap() error { return e.Err }

func kindText(k string) string {
	switch k {
	case KindUnreachable:
		return "store unreachable"
	case KindNotFound:
		return "bucket or object does not exist"
	case KindDenied:
		return "access denied"
	case KindCorrupt:
		return "checksum mismatch"
	}
	return "failed"
}

// ErrorKind returns the kind of a store error (KindFailed for others).
func ErrorKind(err error) string {
	var se *StoreError
	if errors.As(err, &se) {
		return se.Kind
	}
	return KindFailed
}

// transportKind recognises an unreachable peer.
func transportKind(err error) (string, bool) {
	var ne net.Error
	var ue *url.Error
	var oe *net.OpError
	var de *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.As(err, &oe), errors.As(err, &de):
		return KindUnreachable, true
	case errors.As(err, &ne) && ne.Timeout():
		return KindUnreachable, true
	case errors.As(err, &ue) && ue.Timeout():
		return KindUnreachable, true
	}
	return "", false
}

// BucketStore is a Store on a gocloud.dev/blob bucket, reached with the
// node's own credentials (access = "node") or, in the daemon, its own.
type BucketStore struct {
	b    *blob.Bucket
	name string
	// PartSize and Concurrency tune the driver's multipart uploads (S3:
	// the transfer manager's part size and parts in flight).
	PartSize    int
	Concurrency int
}

// DefaultPartSize is the multipart part size of BucketStore uploads.
const DefaultPartSize = 16 << 20

// ParseStore splits a store URL (s3://bucket/prefix?params,
// gs://bucket/prefix, file:///path) into the URL gocloud opens and the key
// prefix. The spec has validated it; this only takes it apart.
func ParseStore(store string) (scheme, opener, prefix string, err error) {
	u, err := url.Parse(store)
	if err != nil {
		return "", "", "", fmt.Errorf("checkpoint store %q: %w", store, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" || !path.IsAbs(u.Path) {
			return "", "", "", fmt.Errorf("checkpoint store %q: want file:///absolute/path", store)
		}
		return "file", path.Clean(u.Path), "", nil
	case "s3", "gs":
		if u.Host == "" {
			return "", "", "", fmt.Errorf("checkpoint store %q names no bucket", store)
		}
		o := url.URL{Scheme: u.Scheme, Host: u.Host, RawQuery: u.RawQuery}
		return u.Scheme, o.String(), strings.Trim(path.Clean("/"+u.Path), "/"), nil
	}
	return "", "", "", fmt.Errorf("checkpoint store %q: want s3://, gs:// or file:///", store)
}

// ErrNoNodeDriver: this build links no driver for the store's scheme. The
// slim agent (cmd/fleetd-agent without -tags nodestore) has only file://;
// s3:// and gs:// with access = "node" need a build that imports
// agent/ckpt/nodestores, which the daemon serves to such fleets.
var ErrNoNodeDriver = errors.New(`this agent build has no s3/gcs driver for access = "node" (the slim agent; the daemon serves fleets with access = "node" the node-store agent, fleetd-agent-node-linux-ARCH)`)

// OpenBucket opens a store URL with gocloud.dev's fileblob driver, or the
// s3blob and gcsblob drivers when the binary links agent/ckpt/nodestores. A file store's directory must exist (it is usually a
// shared mount: a missing one is an error, not something to create).
func OpenBucket(ctx context.Context, store string) (*BucketStore, error) {
	scheme, opener, prefix, err := ParseStore(store)
	if err != nil {
		return nil, err
	}
	var b *blob.Bucket
	if scheme == "file" {
		if _, serr := os.Stat(opener); serr != nil {
			kind := KindFailed
			if errors.Is(serr, fs.ErrNotExist) {
				kind = KindNotFound
			}
			return nil, &StoreError{Op: "open " + store, Kind: kind, Err: serr}
		}
		// Temporary files next to their object: a store on a shared mount
		// is rarely on the same filesystem as /tmp, and a rename cannot
		// cross them.
		b, err = fileblob.OpenBucket(opener, &fileblob.Options{Metadata: fileblob.MetadataDontWrite, NoTempDir: true})
	} else {
		if !blob.DefaultURLMux().ValidBucketScheme(scheme) {
			return nil, &StoreError{Op: "open " + redact(store), Kind: KindFailed, Err: ErrNoNodeDriver}
		}
		b, err = blob.OpenBucket(ctx, opener)
	}
	if err != nil {
		return nil, &StoreError{Op: "open " + store, Kind: KindFailed, Err: err}
	}
	if prefix != "" {
		b = blob.PrefixedBucket(b, prefix+"/")
	}
	return NewBucketStore(b, redact(store)), nil
}

// NewBucketStore wraps an open bucket; name is used in messages.
func NewBucketStore(b *blob.Bucket, name string) *BucketStore {
	return &BucketStore{b: b, name: name, PartSize: DefaultPartSize, Concurrency: 4}
}

// Bucket is the underlying bucket (the daemon signs URLs with it).
func (s *BucketStore) Bucket() *blob.Bucket { return s.b }

// Close closes the bucket.
func (s *BucketStore) Close() error { return s.b.Close() }

func (s *BucketStore) String() string { return s.name }

// redact drops a store URL's query (it may name a key file).
func redact(store string) string {
	if i := strings.IndexByte(store, '?'); i >= 0 {
		return store[:i]
	}
	return store
}

func (s *BucketStore) wrap(op, key string, err error) error {
	if err == nil {
		return nil
	}
	kind := KindFailed
	if k, ok := transportKind(err); ok {
		kind = k
	} else {
		switch gcerrors.Code(err) {
		case gcerrors.NotFound:
			kind = KindNotFound
		case gcerrors.PermissionDenied:
			kind = KindDenied
		case gcerrors.FailedPrecondition:
			kind = KindCorrupt // ContentMD5 mismatch
		}
		// The S3 SDK's errors carry the HTTP status where gocloud has no
		// code for it (SignatureDoesNotMatch, InvalidAccessKeyId: 403).
		var hs interface{ HTTPStatusCode() int }
		if kind == KindFailed && errors.As(err, &hs) {
			switch hs.HTTPStatusCode() {
			case 401, 403:
				kind = KindDenied
			case 404:
				kind = KindNotFound
			}
		}
	}
	return &StoreError{Op: op + " " + s.name, Key: key, Kind: kind, Err: err}
}

// maxListed bounds a listing: a checkpoint store holds a few steps.
const maxListed = 1_000_000

func (s *BucketStore) List(ctx context.Context, prefix string) ([]Object, error) {
	it := s.b.List(&blob.ListOptions{Prefix: prefix})
	var out []Object
	for len(out) < maxListed {
		o, err := it.Next(ctx)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, s.wrap("list", prefix, err)
		}
		if !o.IsDir {
			out = append(out, Object{Key: o.Key, Size: o.Size})
		}
	}
	return nil, &StoreError{Op: "list " + s.name, Key: prefix, Kind: KindFailed, Err: fmt.Errorf("more than %d objects", maxListed)}
}

func (s *BucketStore) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	r, err := s.b.NewReader(ctx, key, nil)
	if err != nil {
		return nil, s.wrap("read", key, err)
	}
	return r, nil
}

func (s *BucketStore) Put(ctx context.Context, key string, r io.Reader, size int64, md5 []byte) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.b.NewWriter(wctx, key, &blob.WriterOptions{
		BufferSize: s.PartSize, MaxConcurrency: s.Concurrency, ContentMD5: md5,
		ContentType: "application/octet-stream",
	})
	if err != nil {
		return s.wrap("write", key, err)
	}
	n, err := io.Copy(w, r)
	if err == nil && n != size {
		err = fmt.Errorf("wrote %d bytes, expected %d", n, size)
	}
	if err != nil {
		cancel() // aborts the upload: nothing partial becomes the object
		_ = w.Close()
		return s.wrap("write", key, err)
	}
	return s.wrap("write", key, w.Close())
}

func (s *BucketStore) Delete(ctx context.Context, keys []string) error {
	for _, k := range keys {
		if err := s.b.Delete(ctx, k); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			return s.wrap("delete", k, err)
		}
	}
	return nil
}
