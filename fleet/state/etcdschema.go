package state

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdMigration upgrades the etcd layout (etcdkv.go) from schema version
// from to from+1. Like bbolt's migrations it runs on the raw bucketed
// transaction, because the typed Tx only knows the current layout. All
// pending migrations and the version bump commit in one etcd transaction,
// after the prefix has been copied to <prefix without "/">.bak-v<old>/.
type etcdMigration struct {
	from  int
	name  string
	apply func(k kv) error
}

// etcdMigrations holds one entry per past layout change, in order (the
// same changes as bbolt's migrations). A migration's writes count against
// etcd's --max-txn-ops like any transaction's.
var etcdMigrations = []etcdMigration{
	{from: 1, name: "fleet incarnations", apply: migrateIncarnations},
	// A bucket is a key prefix here: the staging bucket needs no creating.
	{from: 2, name: "staging reports", apply: func(kv) error { return nil }},
}

// etcdSchema is the target of OpenEtcd; tests pass their own.
type etcdSchema struct {
	version    int
	migrations []etcdMigration
}

var currentEtcdSchema = etcdSchema{version: SchemaVersion, migrations: etcdMigrations}

func (sc etcdSchema) plan(from int) ([]etcdMigration, error) {
	return planMigrations(sc.migrations, func(m etcdMigration) int { return m.from }, from, sc.version)
}

// OpenEtcd opens the state under opts.Prefix on the etcd cluster cli talks
// to, creating it if the prefix is empty. cli stays the caller's: Close does
// not close it.
//
// OpenEtcd refuses a prefix that holds keys but no schema version
// (ErrNotStateFile) and a layout written by a newer fleetd
// (ErrSchemaTooNew). An older layout is copied to a backup prefix and
// migrated in one transaction. Several servers may open the same prefix at
// once: exactly one creates or migrates it, and the fence does not apply
// to either.
func OpenEtcd(ctx context.Context, cli *clientv3.Client, opts EtcdOptions) (*Etcd, error) {
	return openEtcd(ctx, cli, opts, currentEtcdSchema)
}

func openEtcd(ctx context.Context, cli *clientv3.Client, opts EtcdOptions, sc etcdSchema) (*Etcd, error) {
	if cli == nil {
		return nil, errors.New("open etcd state: no etcd client")
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultEtcdPrefix
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	s := &Etcd{
		cli: cli, layout: etcdLayout{prefix: prefix}, now: opts.Now, fence: opts.Fence,
		maxAttempts: opts.MaxAttempts, commitTimeout: opts.CommitTimeout, id: randomID(),
		nodes: newEtcdNodeCache(),
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.maxAttempts <= 0 {
		s.maxAttempts = defaultMaxAttempts
	}
	if s.commitTimeout <= 0 {
		s.commitTimeout = defaultCommitTimeout
	}
	// Each round either finishes or lost a race to another server that
	// created or migrated the layout meanwhile; three rounds are plenty.
	for range 3 {
		version, fresh, err := s.readVersion(ctx)
		if err != nil {
			return nil, err
		}
		switch {
		case fresh:
			created, err := s.initialize(ctx, sc.version)
			if err != nil || created {
				return s, err
			}
		case version > sc.version:
			return nil, fmt.Errorf("open etcd state %s: %w (schema version %d; this fleetd supports up to version %d); upgrade fleetd",
				prefix, ErrSchemaTooNew, version, sc.version)
		case version < sc.version:
			if err := s.migrate(ctx, sc, version); err != nil {
				return nil, err
			}
		default:
			return s, nil
		}
	}
	return nil, fmt.Errorf("open etcd state %s: the layout kept changing while opening", prefix)
}

// readVersion returns the schema version, or fresh=true for an empty prefix.
func (s *Etcd) readVersion(ctx context.Context) (version int, fresh bool, err error) {
	p := s.layout.prefix
	key := s.layout.bucket(refMeta) + MetaSchemaVersion
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(key),
		clientv3.OpGet(p, clientv3.WithRange(clientv3.GetPrefixRangeEnd(p)), clientv3.WithLimit(1), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return 0, false, fmt.Errorf("open etcd state %s: %w", p, err)
	}
	ver := resp.Responses[0].GetResponseRange().Kvs
	some := resp.Responses[1].GetResponseRange().Kvs
	switch {
	case len(ver) == 0 && len(some) == 0:
		return 0, true, nil
	case len(ver) == 0:
		return 0, false, fmt.Errorf("etcd prefix %s is %w: it holds keys (e.g. %s) but no %s; written by another program? use another prefix",
			p, ErrNotStateFile, some[0].Key, key)
	}
	v, err := strconv.Atoi(string(ver[0].Value))
	if err != nil || v < 1 {
		return 0, false, fmt.Errorf("etcd prefix %s is %w: %s %q is not a positive integer", p, ErrNotStateFile, key, ver[0].Value)
	}
	return v, false, nil
}

// initialize writes the store-owned meta keys if the prefix is still empty;
// created=false means another server got there first.
func (s *Etcd) initialize(ctx context.Context, version int) (created bool, err error) {
	p := s.layout.prefix
	k := s.newKV(ctx, true)
	if err := initMeta(k, version, s.now()); err != nil {
		return false, err
	}
	ops := append(k.ops(), clientv3.OpPut(s.layout.commitKey(), s.id+"/0"))
	empty := clientv3.Compare(clientv3.CreateRevision(p), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(p))
	resp, err := s.cli.Txn(ctx).If(empty).Then(ops...).Commit()
	if err != nil {
		return false, fmt.Errorf("initialise etcd state %s: %w", p, err)
	}
	if resp.Succeeded {
		s.commitRev, s.commitKnown = resp.Header.Revision, true
	}
	return resp.Succeeded, nil
}

// errMigrated: another server migrated the layout first.
var errMigrated = errors.New("already migrated")

// migrate backs the prefix up, then runs every pending migration and the
// version bump in one transaction: the layout ends up fully migrated or
// untouched.
func (s *Etcd) migrate(ctx context.Context, sc etcdSchema, from int) error {
	p := s.layout.prefix
	plan, err := sc.plan(from)
	if err != nil {
		return fmt.Errorf("migrate etcd state %s from schema version %d to %d: %w", p, from, sc.version, err)
	}
	backup := s.backupPrefix(from)
	if err := s.copyPrefix(ctx, backup); err != nil {
		return fmt.Errorf("back up etcd state %s to %s before migrating: %w", p, backup, err)
	}
	err = s.update(ctx, false, func(k *etcdKV) error {
		v, err := k.get(refMeta, MetaSchemaVersion)
		if err != nil {
			return err
		}
		if string(v) != strconv.Itoa(from) {
			return errMigrated
		}
		for _, m := range plan {
			if err := m.apply(k); err != nil {
				return fmt.Errorf("migration %d→%d (%s): %w", m.from, m.from+1, m.name, err)
			}
		}
		return k.put(refMeta, MetaSchemaVersion, []byte(strconv.Itoa(sc.version)))
	})
	if errors.Is(err, errMigrated) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("migrate etcd state %s from schema version %d to %d: %w (state unchanged; copy at %s)",
			p, from, sc.version, err, backup)
	}
	return nil
}

// backupPrefix is a sibling of the prefix, outside it.
func (s *Etcd) backupPrefix(from int) string {
	return strings.TrimSuffix(s.layout.prefix, "/") + ".bak-v" + strconv.Itoa(from) + "/"
}

// copyBatch bounds the puts of one backup transaction, below etcd's default
// --max-txn-ops (128) and --max-request-bytes (1.5 MiB).
const (
	copyBatchOps   = 100
	copyBatchBytes = 1 << 20
)

// copyPrefix replaces whatever is under dst with a copy of the prefix as of
// one revision. The copy takes several transactions; an interrupted copy is
// redone by the next migration attempt.
func (s *Etcd) copyPrefix(ctx context.Context, dst string) error {
	if _, err := s.cli.Delete(ctx, dst, clientv3.WithRange(clientv3.GetPrefixRangeEnd(dst))); err != nil {
		return err
	}
	src := s.layout.prefix
	end := clientv3.GetPrefixRangeEnd(src)
	var rev int64
	var ops []clientv3.Op
	size := 0
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		_, err := s.cli.Txn(ctx).Then(ops...).Commit()
		ops, size = nil, 0
		return err
	}
	for from := src; ; {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(scanPage)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, from, opts...)
		if err != nil {
			return err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if len(ops) >= copyBatchOps || size+len(kv.Key)+len(kv.Value) > copyBatchBytes {
				if err := flush(); err != nil {
					return err
				}
			}
			ops = append(ops, clientv3.OpPut(dst+string(kv.Key[len(src):]), string(kv.Value)))
			size += len(kv.Key) + len(kv.Value)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return flush()
}
