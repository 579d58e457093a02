package state

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Options tune Open.
type Options struct {
	// LockTimeout is how long Open waits for the file lock held by another
	// process before giving up (default 2s).
	LockTimeout time.Duration
	// NoSync skips fsync on commit. For tests only: with it, a crash can
	// lose or corrupt committed data.
	NoSync bool
	// Now is the clock used for CreatedAt/UpdatedAt/event times
	// (default time.Now).
	Now func() time.Time
}

const (
	defaultLockTimeout = 2 * time.Second
	batchDelay         = time.Millisecond // see open
)

// BoltStore is the Store backed by one bbolt file, owned by one fleetd
// process at a time (enforced with a file lock).
//
// Durability:
//   - Update: when it returns nil the transaction is fsynced to disk and
//     survives a crash or power loss; one fsync per call. Use it for
//     everything that must not be lost (node transitions before they are
//     acted on, applied specs, offering history).
//   - AppendEvents: exactly as durable when it returns nil, but concurrent
//     callers share one transaction and one fsync (bbolt's Batch), at the
//     price of up to 1ms extra latency. Use it for high-rate events.
//   - View and Events never write.
//
// With Options.NoSync (tests only) neither path fsyncs.
//
// Node records are also kept decoded in memory (see nodeCache): reads of
// unchanged nodes cost a copy, not a JSON decode. Update runs one at a time
// (writeMu) so that its node writes reach that cache in commit order.
type BoltStore struct {
	db      *bolt.DB
	path    string
	now     func() time.Time
	noSync  bool
	closed  atomic.Bool
	writeMu sync.Mutex
	nodes   *nodeCache
}

var _ Store = (*BoltStore)(nil)

// Open opens or creates the state file at path, creating its directory with
// mode 0700 if missing; the file itself is created (or tightened to) 0600.
//
// Open refuses, with an error naming the file: a file that is not a valid
// fleetd state file (not bbolt, damaged, or another program's bbolt file;
// ErrNotStateFile), a file written by a newer fleetd (ErrSchemaTooNew), and a
// file locked by another process for longer than LockTimeout (ErrLocked).
// A file from an older fleetd is copied to <path>.bak-v<old> and migrated in
// one transaction. Existing files are inspected read-only before anything is
// written, and every page is checked (about 0.1s for a 200 MB file), so a
// damaged file is reported at start rather than crashing the daemon later.
func Open(path string, opts Options) (*BoltStore, error) {
	return open(path, opts, currentSchema)
}

func open(path string, opts Options, sc schema) (*BoltStore, error) {
	if path == "" {
		return nil, errors.New("open state file: empty path")
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = defaultLockTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir %s: %w", dir, err)
	}
	fi, statErr := os.Stat(path)
	created := errors.Is(statErr, os.ErrNotExist)
	if statErr == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("open state file %s: not a regular file (%s)", path, fi.Mode().Type())
	}
	if statErr == nil && fi.Size() > 0 {
		// Inspect read-only first: bbolt may write while opening read-write
		// (e.g. to persist a missing freelist), and a file Open refuses
		// must stay untouched.
		ro, err := openBolt(path, opts, true)
		if err != nil {
			return nil, err
		}
		err = inspect(ro, path, sc)
		_ = ro.Close()
		if err != nil {
			return nil, err
		}
	}

	db, err := openBolt(path, opts, false)
	if err != nil {
		return nil, err
	}
	// bbolt's default 10ms batch window costs more than it saves when fsync
	// is fast (~0.3ms on a VM disk: 1.4k events/s batched vs 3.2k with one
	// Update each); 1ms still lets concurrent appenders share a commit
	// (9k events/s) and bounds the wait of a lone caller.
	db.MaxBatchDelay = batchDelay
	s := &BoltStore{db: db, path: path, now: opts.Now, noSync: opts.NoSync, nodes: newNodeCache()}
	if err := s.setup(sc, created); err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// openBolt opens the bbolt file. bbolt reads pages straight from an mmap, so
// a truncated or garbled file can fault or panic inside bolt.Open; both are
// turned into ErrNotStateFile instead of crashing the daemon.
// initialMmapSize is the address space mapped for the state file at open.
const initialMmapSize = 1 << 30

func openBolt(path string, opts Options, readOnly bool) (db *bolt.DB, err error) {
	var (
		file    *os.File
		fileErr error
	)
	bo := &bolt.Options{
		Timeout:  opts.LockTimeout,
		NoSync:   opts.NoSync,
		ReadOnly: readOnly,
		// bbolt remaps the file when it outgrows the mapping, and a remap
		// waits for every open read transaction while blocking new ones.
		// A reader that then waits on a lock held by a writer (API
		// handler vs. rendezvous save) deadlocks the daemon. Reserving
		// address space up front (not memory) makes writers independent
		// of readers until the file reaches this size.
		InitialMmapSize: initialMmapSize,
		// Captured so a panic mid-Open can still release the flock bbolt
		// took and close the fd.
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			file, fileErr = os.OpenFile(name, flag, perm)
			return file, fileErr
		},
	}
	func() {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if r := recover(); r != nil {
				if file != nil {
					unlockFile(file)
					_ = file.Close()
				}
				db, err = nil, describePanic(r)
			}
		}()
		db, err = bolt.Open(path, 0o600, bo)
	}()
	if err == nil {
		return db, nil
	}
	var errno syscall.Errno
	switch {
	case fileErr != nil:
		return nil, fmt.Errorf("open state file %s: %w", path, fileErr)
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("open state file %s: %w (waited %s): another fleetd may be running with data dir %s",
			path, ErrLocked, opts.LockTimeout, filepath.Dir(path))
	case errors.As(err, &errno):
		return nil, fmt.Errorf("open state file %s: %w", path, err)
	}
	return nil, notStateFile(path, err)
}

// describePanic turns a panic recovered from bbolt into an error. Memory
// faults (SetPanicOnFault) carry the faulting address; Go prints them as a
// nil dereference, which would mislead whoever reads the message.
func describePanic(r any) error {
	if f, ok := r.(interface{ Addr() uintptr }); ok {
		return fmt.Errorf("bbolt: memory fault at %#x reading the mapped file (page beyond its end?)", f.Addr())
	}
	return fmt.Errorf("bbolt: %v", r)
}

func notStateFile(path string, cause error) error {
	return fmt.Errorf("%s is %w: it is damaged or not a bbolt database (%v); move it aside or restore a backup",
		path, ErrNotStateFile, cause)
}

// inspect checks, without writing, that an existing file is an intact fleetd
// state file this fleetd can open (possibly after migrating it).
func inspect(db *bolt.DB, path string, sc schema) error {
	if err := verify(db, path); err != nil {
		return err
	}
	version, fresh, err := readVersion(db, path)
	switch {
	case err != nil:
		return err
	case fresh:
		return nil
	case version > sc.version:
		return tooNew(path, version, sc.version)
	}
	// Current or older (setup migrates it): the buckets of its version.
	return checkBuckets(db, path, version)
}

func tooNew(path string, version, supported int) error {
	return fmt.Errorf("open state file %s: %w (schema version %d; this fleetd supports up to version %d); upgrade fleetd",
		path, ErrSchemaTooNew, version, supported)
}

// setup initialises a new file or migrates an old one. The file has been
// inspected already (if it had any content), and is now locked exclusively.
func (s *BoltStore) setup(sc schema, created bool) error {
	if err := checkConsistency(s.db, s.path); err != nil {
		return err
	}
	version, fresh, err := readVersion(s.db, s.path)
	if err != nil {
		return err
	}
	switch {
	case fresh:
		if err := s.initialize(sc.version); err != nil {
			return err
		}
		if created && !s.noSync {
			if err := syncDir(filepath.Dir(s.path)); err != nil {
				return err
			}
		}
	case version > sc.version:
		return tooNew(s.path, version, sc.version)
	case version < sc.version:
		if err := s.migrate(sc, version); err != nil {
			return err
		}
	}
	if err := checkBuckets(s.db, s.path, sc.version); err != nil { // migrated, if it was older
		return err
	}
	return restrictMode(s.path)
}

// verify makes sure every page the file references is inside the file and
// that the bucket tree can be walked. Reads past the end of a truncated file
// fault (SIGBUS) inside the mmap; with SetPanicOnFault that is a recoverable
// panic instead of a crash.
func verify(db *bolt.DB, path string) (err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("open state file %s: %w", path, err)
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = notStateFile(path, fmt.Errorf("reading pages: %w", describePanic(r)))
		}
	}()
	return db.View(func(btx *bolt.Tx) error {
		if fi.Size() < btx.Size() {
			return notStateFile(path, fmt.Errorf("file has %d bytes but its pages need %d; truncated", fi.Size(), btx.Size()))
		}
		return btx.ForEach(func(name []byte, b *bolt.Bucket) error {
			return walkBucket(path, b, 1)
		})
	})
}

// checkConsistency runs bbolt's own check, which also validates the
// freelist against the page tree: a garbled freelist loads without error
// and would later hand out pages still in use. The check runs in a goroutine
// bbolt starts, where a fault could not be recovered; it is only safe
// because inspect's walk has already touched the same pages and bolt.Open
// has loaded the freelist under openBolt's protection.
func checkConsistency(db *bolt.DB, path string) error {
	const maxReported = 3
	var problems []string
	err := db.View(func(btx *bolt.Tx) error {
		for err := range btx.Check() { // drain: the checker blocks on a full channel
			if len(problems) < maxReported {
				problems = append(problems, err.Error())
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("check state file %s: %w", path, err)
	}
	if len(problems) > 0 {
		return notStateFile(path, fmt.Errorf("consistency check: %s", strings.Join(problems, "; ")))
	}
	return nil
}

// walkBucket visits every key of b and its nested buckets, touching each
// page of the tree once.
func walkBucket(path string, b *bolt.Bucket, depth int) error {
	const maxDepth = 8 // the layout nests two levels; more means garbage
	if depth > maxDepth {
		return notStateFile(path, errors.New("buckets nested too deep"))
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v != nil {
			continue
		}
		if sub := b.Bucket(k); sub != nil {
			if err := walkBucket(path, sub, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// readVersion returns the schema version, or fresh=true for an empty bbolt
// file (new, or created by bbolt but never initialised).
func readVersion(db *bolt.DB, path string) (version int, fresh bool, err error) {
	err = db.View(func(btx *bolt.Tx) error {
		meta := btx.Bucket(bucketMeta)
		if meta == nil {
			if k, _ := btx.Cursor().First(); k != nil {
				return fmt.Errorf("%s is %w: it is a bbolt database without fleetd's meta bucket (it has a bucket %q; written by another program?)",
					path, ErrNotStateFile, k)
			}
			fresh = true
			return nil
		}
		raw := meta.Get([]byte(MetaSchemaVersion))
		if raw == nil {
			return fmt.Errorf("%s is %w: its meta bucket has no %s", path, ErrNotStateFile, MetaSchemaVersion)
		}
		v, err := strconv.Atoi(string(raw))
		if err != nil || v < 1 {
			return fmt.Errorf("%s is %w: %s %q is not a positive integer", path, ErrNotStateFile, MetaSchemaVersion, raw)
		}
		version = v
		return nil
	})
	return version, fresh, err
}

func (s *BoltStore) initialize(version int) error {
	err := s.db.Update(func(btx *bolt.Tx) error {
		for _, name := range topBuckets {
			if _, err := btx.CreateBucket(name); err != nil {
				return fmt.Errorf("create bucket %q: %w", name, err)
			}
		}
		return initMeta(&boltKV{tx: btx}, version, s.now())
	})
	if err != nil {
		return fmt.Errorf("initialise state file %s: %w", s.path, err)
	}
	return nil
}

// checkBuckets: the file has every top-level bucket of schema version.
func checkBuckets(db *bolt.DB, path string, version int) error {
	return db.View(func(btx *bolt.Tx) error {
		for _, name := range topBuckets {
			if bucketSince[string(name)] <= version && btx.Bucket(name) == nil {
				return fmt.Errorf("%s is %w: bucket %q is missing", path, ErrNotStateFile, name)
			}
		}
		return nil
	})
}

// migrate copies the file to <path>.bak-v<from>, then runs every pending
// migration and the version bump in one transaction: the file ends up either
// fully migrated or untouched.
func (s *BoltStore) migrate(sc schema, from int) error {
	plan, err := sc.plan(from)
	if err != nil {
		return fmt.Errorf("migrate state file %s from schema version %d to %d: %w", s.path, from, sc.version, err)
	}
	backup := fmt.Sprintf("%s.bak-v%d", s.path, from)
	if err := s.backupTo(backup); err != nil {
		return fmt.Errorf("back up state file %s to %s before migrating: %w", s.path, backup, err)
	}
	err = s.db.Update(func(btx *bolt.Tx) error {
		for _, m := range plan {
			if err := m.apply(btx); err != nil {
				return fmt.Errorf("migration %d→%d (%s): %w", m.from, m.from+1, m.name, err)
			}
		}
		return btx.Bucket(bucketMeta).Put([]byte(MetaSchemaVersion), []byte(strconv.Itoa(sc.version)))
	})
	if err != nil {
		return fmt.Errorf("migrate state file %s from schema version %d to %d: %w (file unchanged; copy at %s)",
			s.path, from, sc.version, err, backup)
	}
	return nil
}

// backupTo writes a consistent copy of the database to dst atomically
// (temp file, fsync, rename, fsync dir).
func (s *BoltStore) backupTo(dst string) (err error) {
	tmp := dst + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	err = f.Chmod(0o600) // O_TRUNC keeps the mode of a leftover temp file
	if err == nil {
		err = s.db.View(func(btx *bolt.Tx) error {
			_, err := btx.WriteTo(f)
			return err
		})
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return syncDir(filepath.Dir(dst))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}

// restrictMode tightens a state file that is readable by others to 0600: it
// holds node token hashes and the daemon id.
func restrictMode(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("open state file %s: %w", path, err)
	}
	if fi.Mode().Perm()&^0o600 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return fmt.Errorf("restrict state file %s to mode 0600: %w", path, err)
		}
	}
	return nil
}

// Path is the state file's path.
func (s *BoltStore) Path() string { return s.path }

func (s *BoltStore) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

func mapErr(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// View runs fn in a read-only transaction that sees one consistent snapshot.
func (s *BoltStore) View(ctx context.Context, fn func(Tx) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return mapErr(s.db.View(func(btx *bolt.Tx) error {
		return s.tx(btx).run(fn)
	}))
}

// tx is the typed transaction over btx, with the node cache.
func (s *BoltStore) tx(btx *bolt.Tx) *tx {
	return &tx{kv: &boltKV{tx: btx}, now: s.now, cache: s.nodes, txid: btx.ID()}
}

// Update runs fn in a read-write transaction. If fn returns an error (or
// panics) nothing is written; if Update returns nil the writes are fsynced.
// Writers are serialised; do not call Update or View from inside fn.
func (s *BoltStore) Update(ctx context.Context, fn func(Tx) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	var (
		t       *tx
		fnOK    bool // fn returned nil: an error after it is the commit's
		settled bool
	)
	defer func() {
		if t != nil && !settled { // fn panicked: bbolt rolled back
			s.nodes.abort(t.nodes)
		}
	}()
	err := s.db.Update(func(btx *bolt.Tx) error {
		t = s.tx(btx)
		if err := t.run(fn); err != nil {
			return err
		}
		fnOK = true
		return nil
	})
	switch {
	case t == nil:
	case err == nil:
		s.nodes.commit(t.txid, t.nodes)
	case fnOK:
		s.nodes.invalidate(t.txid, t.nodes)
	default:
		s.nodes.abort(t.nodes)
	}
	settled = true
	return mapErr(err)
}

// Events returns up to limit events with Seq > since in Seq order; limit <= 0
// means no limit.
func (s *BoltStore) Events(ctx context.Context, since uint64, limit int) ([]Event, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	var out []Event
	err := s.db.View(func(btx *bolt.Tx) error {
		var err error
		out, err = readEvents(&boltKV{tx: btx}, since, limit)
		return err
	})
	return out, mapErr(err)
}

// AppendEvents appends events in order, assigning consecutive Seqs, and
// returns the stored events. Concurrent calls are committed together in one
// fsynced transaction (see the durability note on BoltStore). An invalid
// event fails the whole call and nothing is appended.
func (s *BoltStore) AppendEvents(ctx context.Context, events []Event) ([]Event, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	// Validated up front: a failing call makes bbolt re-run the whole batch.
	if err := validEvents(events); err != nil {
		return nil, err
	}
	if len(events) == 0 {
		return []Event{}, nil
	}
	var out []Event
	// Batch may run this function more than once; appendEvents rebuilds out each time.
	err := s.db.Batch(func(btx *bolt.Tx) error {
		return runTx(&boltKV{tx: btx}, s.now, func(t Tx) error {
			var err error
			out, err = appendEvents(t, events)
			return err
		})
	})
	if err != nil {
		return nil, mapErr(err)
	}
	return out, nil
}

// Stats is a cheap summary of the state file, for /metrics and `fleetd debug`.
type Stats struct {
	Path          string `json:"path"`
	Bytes         int64  `json:"bytes"` // in-use size of the file (bbolt high-water mark)
	SchemaVersion int    `json:"schema_version"`
	Fleets        int    `json:"fleets"`
	Nodes         int    `json:"nodes"`
	Offerings     int    `json:"offerings"`
	LastEventSeq  uint64 `json:"last_event_seq"`
}

// Stats counts fleets, nodes and offerings (a scan of those small buckets)
// and reads the last event seq without scanning the event log.
func (s *BoltStore) Stats(ctx context.Context) (Stats, error) {
	if err := s.begin(ctx); err != nil {
		return Stats{}, err
	}
	st := Stats{Path: s.path}
	err := s.db.View(func(btx *bolt.Tx) error {
		st.Bytes = btx.Size()
		v, err := strconv.Atoi(string(btx.Bucket(bucketMeta).Get([]byte(MetaSchemaVersion))))
		if err != nil {
			return fmt.Errorf("%s: %w", MetaSchemaVersion, err)
		}
		st.SchemaVersion = v
		st.Fleets = countKeys(btx.Bucket(bucketFleets))
		st.Offerings = countKeys(btx.Bucket(bucketOfferings))
		nodes := btx.Bucket(bucketNodes)
		err = nodes.ForEachBucket(func(name []byte) error {
			st.Nodes += countKeys(nodes.Bucket(name))
			return nil
		})
		st.LastEventSeq = btx.Bucket(bucketEvents).Sequence()
		return err
	})
	return st, mapErr(err)
}

func countKeys(b *bolt.Bucket) int {
	n := 0
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	return n
}

// Close releases the file and its lock; it waits for open transactions.
// Closing twice is a no-op.
func (s *BoltStore) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close state file %s: %w", s.path, err)
	}
	return nil
}

// boltKV is kv over a bbolt transaction.
type boltKV struct{ tx *bolt.Tx }

func (k *boltKV) writable() bool { return k.tx.Writable() }

func (k *boltKV) bucket(b bucketRef, create bool) (*bolt.Bucket, error) {
	top := k.tx.Bucket(b.top)
	if top == nil {
		return nil, fmt.Errorf("state file is missing bucket %q", b.top)
	}
	if b.sub == "" {
		return top, nil
	}
	sub := top.Bucket([]byte(b.sub))
	if sub == nil && create {
		return top.CreateBucket([]byte(b.sub))
	}
	return sub, nil
}

func (k *boltKV) get(b bucketRef, key string) ([]byte, error) {
	bk, err := k.bucket(b, false)
	if bk == nil {
		return nil, err
	}
	return bk.Get([]byte(key)), nil
}

func (k *boltKV) put(b bucketRef, key string, value []byte) error {
	bk, err := k.bucket(b, true)
	if err != nil {
		return err
	}
	return bk.Put([]byte(key), value)
}

func (k *boltKV) del(b bucketRef, key string) error {
	bk, err := k.bucket(b, false)
	if bk == nil {
		return err
	}
	return bk.Delete([]byte(key))
}

func (k *boltKV) scan(b bucketRef, start string, fn func(string, []byte) (bool, error)) error {
	bk, err := k.bucket(b, false)
	if bk == nil {
		return err
	}
	c := bk.Cursor()
	for key, v := c.Seek([]byte(start)); key != nil; key, v = c.Next() {
		if v == nil { // a nested bucket, not a record
			continue
		}
		more, err := fn(string(key), v)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

func (k *boltKV) nextSeq(b bucketRef) (uint64, error) {
	bk, err := k.bucket(b, true)
	if err != nil {
		return 0, err
	}
	return bk.NextSequence()
}

func (k *boltKV) dropBucket(b bucketRef) error {
	top := k.tx.Bucket(b.top)
	if top == nil || b.sub == "" {
		return fmt.Errorf("drop bucket %q/%q: only nested buckets can be dropped", b.top, b.sub)
	}
	err := top.DeleteBucket([]byte(b.sub))
	if errors.Is(err, berrors.ErrBucketNotFound) {
		return nil
	}
	return err
}
