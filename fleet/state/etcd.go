package state

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/fleetd/fleetd/internal/ctxtime"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Errors of the etcd store, for errors.Is.
var (
	// ErrFenced: the store's fence (EtcdOptions.Fence) no longer holds,
	// e.g. this fleetd lost the leadership; nothing was written.
	ErrFenced = errors.New("state write fenced off: no longer the leader")
	// ErrConflict: other writers kept changing the state while Update
	// retried; nothing was written.
	ErrConflict = errors.New("state update kept conflicting with other writers")
	// ErrCommitUnknown: etcd did not answer the commit in time; the
	// update may or may not have been applied (the next Update finds out).
	ErrCommitUnknown = errors.New("state commit outcome unknown")
)

// EtcdOptions tune OpenEtcd.
type EtcdOptions struct {
	// Prefix is the key prefix of this deployment's state (default
	// DefaultEtcdPrefix); "/" is appended if missing.
	Prefix string
	// Now is the clock for timestamps (default time.Now).
	Now func() time.Time
	// Fence, if set, is called at every commit of Update; its comparisons
	// are added to the commit's If, and when one fails Update returns
	// ErrFenced without writing. See FenceKey.
	Fence func() []clientv3.Cmp
	// MaxAttempts bounds the runs of an Update's function when other
	// writers commit in between (default 10), see Update.
	MaxAttempts int
	// CommitTimeout bounds a commit, including resending it after a
	// connection loss (default 10s).
	CommitTimeout time.Duration
}

const (
	defaultMaxAttempts   = 10
	defaultCommitTimeout = 10 * time.Second
	// Retry pauses grow from retryBase to retryMax: after a conflict the
	// other writer usually has more to do, after a lost connection the
	// client needs a moment to fail over to another member.
	retryBase = 2 * time.Millisecond
	retryMax  = 200 * time.Millisecond
)

// FenceKey fences writes on key still having create revision rev, as an
// election's leader key does while its holder is leader
// (concurrency.Election.Key() and .Rev()): once the lease behind it expires
// or is revoked, the key is deleted or re-created and every later Update of
// the old leader fails with ErrFenced.
func FenceKey(key string, rev int64) []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", rev)}
}

// Etcd is the Store on etcd, for fleetd servers sharing one state (HA).
//
// Transactions:
//   - View reads one snapshot: its first read fixes a revision and every
//     later read is at that revision.
//   - Update runs fn optimistically: reads as in View, writes buffered (and
//     visible to fn's later reads), then one etcd transaction that applies
//     them all only if no other Update committed since the snapshot (the
//     commit key's ModRevision is unchanged) and the fence holds. On a
//     conflict fn runs again on a fresh snapshot, so fn must not have
//     effects outside the Tx that a second run would repeat; variables it
//     assigns end up with the last run's values. Updates of one Etcd run
//     one at a time, so only other processes cause conflicts.
//   - Durability: when Update returns nil etcd has committed the
//     transaction, i.e. a quorum of members has it in its write-ahead
//     log (fsynced unless a member runs with --unsafe-no-fsync).
//   - Connection loss during a commit: the identical transaction is sent
//     again until CommitTimeout; it carries a unique id in the commit key,
//     so it applies at most once and Update can tell whether an earlier
//     send did. Once fn has returned, cancelling ctx no longer stops the
//     commit (as with bbolt, which never checks ctx after that point).
//
// Limits: one Update is one etcd transaction, so its writes (one per record
// written, plus the commit key and the event sequence) must fit in etcd's
// --max-txn-ops (default 128) and --max-request-bytes (default 1.5 MiB).
//
// All writers of a prefix must be this type: the conflict check relies on
// every write updating the commit key.
type Etcd struct {
	cli           *clientv3.Client
	layout        etcdLayout
	now           func() time.Time
	fence         func() []clientv3.Cmp
	maxAttempts   int
	commitTimeout time.Duration
	id            string // random; names this store's commits

	mu     sync.RWMutex // read-held by each call, write-held by Close
	closed bool

	writeMu sync.Mutex // one Update at a time; guards the fields below
	// commitRev is the commit key's ModRevision as of this store's last
	// commit, valid if commitKnown. Another process's commit changes it.
	commitRev   int64
	commitKnown bool
	commits     uint64

	nodes *etcdNodeCache
}

var _ Store = (*Etcd)(nil)

// Prefix is the key prefix the store uses.
func (s *Etcd) Prefix() string { return s.layout.prefix }

func (s *Etcd) begin(ctx context.Context) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return nil, ErrClosed
	}
	return s.mu.RUnlock, nil
}

// View runs fn on one consistent snapshot.
func (s *Etcd) View(ctx context.Context, fn func(Tx) error) error {
	release, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer release()
	return runTx(s.newKV(ctx, false), s.now, fn)
}

// Update runs fn in an optimistic transaction (see Etcd). If fn returns an
// error or panics nothing is written. Do not call View or Update from fn.
func (s *Etcd) Update(ctx context.Context, fn func(Tx) error) error {
	return s.update(ctx, true, func(k *etcdKV) error { return runTx(k, s.now, fn) })
}

// update runs fn against a fresh etcdKV and commits its writes, running fn
// again after a conflict. fenced says whether the fence applies (not while
// opening: creating or migrating the layout is safe from any server).
func (s *Etcd) update(ctx context.Context, fenced bool, fn func(*etcdKV) error) error {
	release, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer release()
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := s.newKV(ctx, true)
		if !s.commitKnown {
			if err := s.refreshCommit(k); err != nil {
				return err
			}
		}
		if err := fn(k); err != nil {
			return err
		}
		if !k.dirty() {
			return nil
		}
		ok, err := s.commit(k, fenced)
		if err != nil || ok {
			return err
		}
		if attempt >= s.maxAttempts {
			return fmt.Errorf("etcd state %s: %w (gave up after %d attempts)", s.layout.prefix, ErrConflict, attempt)
		}
		if err := ctxtime.Sleep(ctx, retryDelay(attempt)); err != nil {
			return err
		}
	}
}

// refreshCommit reads the commit key's current ModRevision and pins k's
// snapshot to the same revision.
func (s *Etcd) refreshCommit(k *etcdKV) error {
	resp, err := s.cli.Get(k.ctx, s.layout.commitKey())
	if err != nil {
		return fmt.Errorf("etcd get %s: %w", s.layout.commitKey(), err)
	}
	k.fix(resp.Header.Revision)
	s.commitRev, s.commitKnown = 0, true
	if len(resp.Kvs) > 0 {
		s.commitRev = resp.Kvs[0].ModRevision
	}
	if k.rev == resp.Header.Revision {
		k.commitMod = s.commitRev
	}
	return nil
}

// commit applies k's writes if nobody committed since s.commitRev and the
// fence holds. ok=false, err=nil is a conflict: s.commitRev is updated and
// the caller may run its function again.
func (s *Etcd) commit(k *etcdKV, fenced bool) (ok bool, err error) {
	s.commits++
	id := s.id + "/" + strconv.FormatUint(s.commits, 10)
	key := s.layout.commitKey()
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", s.commitRev)}
	var fence []clientv3.Cmp
	if fenced && s.fence != nil {
		fence = s.fence()
		cmps = append(cmps, fence...)
	}
	ops := append(k.ops(), clientv3.OpPut(key, id))
	// Detached from the caller: a commit abandoned half way would leave
	// its outcome unknown, which costs more than finishing it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(k.ctx), s.commitTimeout)
	defer cancel()
	for try := 1; ; try++ {
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(key)).Commit()
		if err == nil {
			if resp.Succeeded {
				s.nodes.committed(s.commitRev, resp.Header.Revision, k)
				s.commitRev = resp.Header.Revision
				return true, nil
			}
			cur := resp.Responses[0].GetResponseRange().Kvs
			prev := s.commitRev
			s.commitRev = 0
			if len(cur) > 0 {
				s.commitRev = cur[0].ModRevision
				if string(cur[0].Value) == id {
					return true, nil // an earlier send of this commit applied
				}
			}
			if len(fence) > 0 && (s.commitRev == prev || s.fails(ctx, fence)) {
				return false, fmt.Errorf("etcd state %s: %w", s.layout.prefix, ErrFenced)
			}
			return false, nil
		}
		if definite(err) {
			hint := ""
			if errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrRequestTooLarge) {
				hint = fmt.Sprintf(" (%d writes in one update; raise etcd's --max-txn-ops/--max-request-bytes)", len(ops))
			}
			return false, fmt.Errorf("etcd state %s: commit: %w%s", s.layout.prefix, err, hint)
		}
		if ctx.Err() != nil || s.cli.Ctx().Err() != nil { // timed out, or the client was closed
			// Whether some send applied is unknown: the next Update
			// rereads the commit key before it trusts commitRev.
			s.commitKnown = false
			return false, fmt.Errorf("etcd state %s: %w: %w", s.layout.prefix, ErrCommitUnknown, err)
		}
		_ = ctxtime.Sleep(ctx, retryDelay(try))
	}
}

// fails reports whether the comparisons do not all hold now.
func (s *Etcd) fails(ctx context.Context, cmps []clientv3.Cmp) bool {
	resp, err := s.cli.Txn(ctx).If(cmps...).Commit()
	return err != nil || !resp.Succeeded
}

// definite reports whether etcd certainly did not apply a request that
// failed with err; anything else (lost connection, leader change, timeout)
// may have applied and is resolved by resending the same commit.
func definite(err error) bool {
	if errors.Is(err, rpctypes.ErrNoSpace) {
		return true
	}
	var code codes.Code
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	} else if st, ok := status.FromError(err); ok {
		code = st.Code()
	} else {
		return false
	}
	switch code {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition,
		codes.OutOfRange, codes.NotFound, codes.AlreadyExists, codes.Unimplemented:
		return true
	}
	return false
}

// retryDelay is the pause before retry number attempt (1, 2, …):
// exponential with jitter, so two conflicting writers fall out of step.
func retryDelay(attempt int) time.Duration {
	d := retryBase << min(attempt-1, 16)
	d = min(d, retryMax)
	return d/2 + rand.N(d/2+1)
}

// Events returns up to limit events with Seq > since in Seq order; limit <= 0
// means no limit.
func (s *Etcd) Events(ctx context.Context, since uint64, limit int) ([]Event, error) {
	release, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return readEvents(s.newKV(ctx, false), since, limit)
}

// AppendEvents appends events in one Update, assigning consecutive Seqs,
// and returns the stored events. An invalid event fails the whole call.
func (s *Etcd) AppendEvents(ctx context.Context, events []Event) ([]Event, error) {
	release, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	release()
	if len(events) == 0 {
		return []Event{}, nil
	}
	return updateAppend(ctx, s.Update, events)
}

// Stats counts fleets, nodes and offerings and reads the last event seq, in
// one read-only etcd transaction (counts only: no values are transferred).
// Path is "etcd:" and the prefix; Bytes is not tracked (0): etcd's database
// size covers every prefix and is etcd's own metric.
func (s *Etcd) Stats(ctx context.Context) (Stats, error) {
	release, err := s.begin(ctx)
	if err != nil {
		return Stats{}, err
	}
	defer release()
	l := s.layout
	count := func(b bucketRef) clientv3.Op {
		bp := l.bucket(b)
		return clientv3.OpGet(bp, clientv3.WithRange(clientv3.GetPrefixRangeEnd(bp)), clientv3.WithCountOnly())
	}
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(l.bucket(refMeta)+MetaSchemaVersion),
		count(refFleets), count(bucketRef{top: bucketNodes}), count(refOfferings),
		clientv3.OpGet(l.seqKey(refEvents)),
	).Commit()
	if err != nil {
		return Stats{}, fmt.Errorf("etcd state %s: stats: %w", l.prefix, err)
	}
	r := func(i int) *clientv3.GetResponse {
		return (*clientv3.GetResponse)(resp.Responses[i].GetResponseRange())
	}
	st := Stats{Path: "etcd:" + l.prefix}
	if kvs := r(0).Kvs; len(kvs) > 0 {
		st.SchemaVersion, err = strconv.Atoi(string(kvs[0].Value))
		if err != nil {
			return Stats{}, fmt.Errorf("etcd state %s: %s %q: %w", l.prefix, MetaSchemaVersion, kvs[0].Value, err)
		}
	}
	st.Fleets, st.Nodes, st.Offerings = int(r(1).Count), int(r(2).Count), int(r(3).Count)
	if kvs := r(4).Kvs; len(kvs) > 0 {
		st.LastEventSeq, err = strconv.ParseUint(string(kvs[0].Value), 10, 64)
		if err != nil {
			return Stats{}, fmt.Errorf("etcd state %s: event seq %q: %w", l.prefix, kvs[0].Value, err)
		}
	}
	return st, nil
}

// Close waits for running calls and makes later ones fail with ErrClosed.
// It does not close the etcd client, which the caller owns. Closing twice
// is a no-op.
func (s *Etcd) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

func randomID() string {
	var b [8]byte
	_, _ = crand.Read(b[:]) // never fails on Linux
	return hex.EncodeToString(b[:])
}
