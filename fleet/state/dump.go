package state

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"
)

// A dump is every record of a store as JSON lines, the same from every
// backend for the same content, so a copy can be checked by comparing
// dumps byte for byte:
//
//	{"format":"fleetd-state","version":1,"schema_version":2}
//	{"kind":"meta","key":"created_at","text":"2026-03-04T05:06:07Z"}    (or "base64" for binary values)
//	{"kind":"fleet","key":"bert","value":{…Fleet…}}
//	{"kind":"node","fleet":"bert","key":"n1","value":{…Node…}}
//	{"kind":"event","key":"1","value":{…Event…}}
//	{"kind":"offering","key":"aws/…","value":{…OfferingRecord…}}
//	{"kind":"staging","fleet":"bert","key":"n1\u0000/data","value":{…StagingRecord…}}
//	{"end":{"meta":3,"fleets":1,"nodes":1,"events":1,"offerings":1,"staging":1,"event_seq":1}}
//
// Sections come in that order, each sorted by key (events by seq). Values
// are the stored JSON verbatim. The store-owned meta keys are included:
// the daemon id tags every cloud instance and must survive a move. The
// last line makes a truncated dump detectable.
const (
	dumpFormat = "fleetd-state"
	// DumpVersion is the version of the dump format written by Dump.
	DumpVersion = 1
)

// ErrNotEmpty: Load was asked to write into a store that already has
// records; nothing was written.
var ErrNotEmpty = errors.New("target state is not empty")

// DumpCounts says what a dump holds.
type DumpCounts struct {
	Meta      int    `json:"meta"`
	Fleets    int    `json:"fleets"`
	Nodes     int    `json:"nodes"`
	Events    int    `json:"events"`
	Offerings int    `json:"offerings"`
	Staging   int    `json:"staging"`
	EventSeq  uint64 `json:"event_seq"` // the store's event sequence: the next event gets EventSeq+1
}

func (c DumpCounts) String() string {
	return fmt.Sprintf("%d meta keys, %d fleets, %d nodes, %d events (last seq %d), %d offerings, %d staging reports",
		c.Meta, c.Fleets, c.Nodes, c.Events, c.EventSeq, c.Offerings, c.Staging)
}

// dumpLine is one line of a dump: the header, a record or the end.
type dumpLine struct {
	Format        string `json:"format,omitempty"`
	Version       int    `json:"version,omitempty"`
	SchemaVersion int    `json:"schema_version,omitempty"`

	Kind   string          `json:"kind,omitempty"`
	Fleet  string          `json:"fleet,omitempty"`
	Key    string          `json:"key,omitempty"`
	Text   string          `json:"text,omitempty"`
	Base64 []byte          `json:"base64,omitempty"`
	Value  json.RawMessage `json:"value,omitempty"`

	End *DumpCounts `json:"end,omitempty"`
}

const (
	kindMeta     = "meta"
	kindFleet    = "fleet"
	kindNode     = "node"
	kindEvent    = "event"
	kindOffering = "offering"
	kindStaging  = "staging"
)

// rawStore is what Dump and Load need beyond Store: the bucketed
// transaction underneath Tx, which can list meta keys, write the
// store-owned ones, and set the event sequence. The stores of this package
// implement it.
type rawStore interface {
	rawView(ctx context.Context, fn func(kv) error) error
	rawUpdate(ctx context.Context, fn func(kv) error) error
	// loadLimits bounds one Load transaction.
	loadLimits() loadLimits
}

// seqKV is implemented by every kv of this package.
type seqKV interface {
	seq(b bucketRef) (uint64, error)
	setSeq(b bucketRef, n uint64) error
	// clearData deletes every record and sequence, keeping meta.
	clearData() error
}

// loadLimits: ops == 0 means everything in one transaction. Otherwise
// records go in batches of at most ops writes and about bytes bytes, and
// the transaction that clears the target writes only meta (etcd).
type loadLimits struct {
	ops, bytes int
}

// Dump writes every record of s to w (see the format above) from one
// consistent snapshot. s must be a store of this package.
func Dump(ctx context.Context, s Store, w io.Writer) (DumpCounts, error) {
	rs, ok := s.(rawStore)
	if !ok {
		return DumpCounts{}, fmt.Errorf("dump state: %T does not support dumps", s)
	}
	var (
		lines  []dumpLine
		counts DumpCounts
		schema int
	)
	err := rs.rawView(ctx, func(k kv) error {
		var err error
		lines, counts, schema, err = readDump(k)
		return err
	})
	if err != nil {
		return DumpCounts{}, fmt.Errorf("dump state: %w", err)
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false) // values verbatim, as stored
	if err := enc.Encode(dumpLine{Format: dumpFormat, Version: DumpVersion, SchemaVersion: schema}); err != nil {
		return DumpCounts{}, err
	}
	for _, l := range lines {
		if err := enc.Encode(l); err != nil {
			return DumpCounts{}, fmt.Errorf("dump state: %s %q: %w", l.Kind, l.Key, err)
		}
	}
	if err := enc.Encode(dumpLine{End: &counts}); err != nil {
		return DumpCounts{}, err
	}
	return counts, bw.Flush()
}

func readDump(k kv) (lines []dumpLine, c DumpCounts, schema int, err error) {
	sk, ok := k.(seqKV)
	if !ok {
		return nil, c, 0, fmt.Errorf("%T has no sequences", k)
	}
	err = k.scan(refMeta, "", func(key string, v []byte) (bool, error) {
		l := dumpLine{Kind: kindMeta, Key: key}
		if utf8.Valid(v) {
			l.Text = string(v)
		} else {
			l.Base64 = bytes.Clone(v)
		}
		if key == MetaSchemaVersion {
			schema, _ = strconv.Atoi(string(v))
		}
		lines = append(lines, l)
		c.Meta++
		return true, nil
	})
	if err != nil {
		return nil, c, 0, err
	}
	if schema < 1 {
		return nil, c, 0, fmt.Errorf("meta %s is missing or invalid", MetaSchemaVersion)
	}
	record := func(kind, fleet string, count *int) func(string, []byte) (bool, error) {
		return func(key string, v []byte) (bool, error) {
			if !json.Valid(v) {
				return false, fmt.Errorf("%s %q is not JSON", kind, key)
			}
			if kind == kindEvent {
				key = strconv.FormatUint(binary.BigEndian.Uint64([]byte(key)), 10)
			}
			lines = append(lines, dumpLine{Kind: kind, Fleet: fleet, Key: key, Value: bytes.Clone(v)})
			*count++
			return true, nil
		}
	}
	var fleets []string
	err = k.scan(refFleets, "", func(key string, v []byte) (bool, error) {
		fleets = append(fleets, key)
		return record(kindFleet, "", &c.Fleets)(key, v)
	})
	if err != nil {
		return nil, c, 0, err
	}
	for _, f := range fleets {
		if err := k.scan(refNodes(f), "", record(kindNode, f, &c.Nodes)); err != nil {
			return nil, c, 0, err
		}
	}
	if err := k.scan(refEvents, "", func(key string, v []byte) (bool, error) {
		if len(key) != 8 {
			return false, fmt.Errorf("event key %x is not a big-endian uint64", key)
		}
		return record(kindEvent, "", &c.Events)(key, v)
	}); err != nil {
		return nil, c, 0, err
	}
	if err := k.scan(refOfferings, "", record(kindOffering, "", &c.Offerings)); err != nil {
		return nil, c, 0, err
	}
	for _, f := range fleets {
		if err := k.scan(refStaging(f), "", record(kindStaging, f, &c.Staging)); err != nil {
			return nil, c, 0, err
		}
	}
	if c.EventSeq, err = sk.seq(refEvents); err != nil {
		return nil, c, 0, err
	}
	return lines, c, schema, nil
}

// LoadOptions tune Load.
type LoadOptions struct {
	// Force replaces whatever the target holds; without it Load refuses a
	// target with any fleet, node, event, offering or daemon meta key.
	Force bool
}

// Load writes the dump read from r into s, which must be empty (a store just
// created) unless opts.Force. The store-owned meta keys (daemon id, created
// at) are taken from the dump. The dump is checked completely before
// anything is written.
//
// bbolt and memory targets are written in one transaction. An etcd target
// is written in several (etcd bounds a transaction's size): a failed Load
// leaves it partly written, and is repeated with Force.
func Load(ctx context.Context, s Store, r io.Reader, opts LoadOptions) (DumpCounts, error) {
	rs, ok := s.(rawStore)
	if !ok {
		return DumpCounts{}, fmt.Errorf("load state: %T does not support loading", s)
	}
	meta, data, counts, err := parseDump(r)
	if err != nil {
		return DumpCounts{}, fmt.Errorf("load state: %w", err)
	}
	lim := rs.loadLimits()
	var batches [][]loadOp
	if lim.ops == 0 {
		batches = [][]loadOp{append(meta, data...)}
	} else {
		batches = append(split(meta, lim), split(data, lim)...)
	}
	for i, batch := range batches {
		first, last := i == 0, i == len(batches)-1
		err := rs.rawUpdate(ctx, func(k kv) error {
			sk, ok := k.(seqKV)
			if !ok {
				return fmt.Errorf("%T has no sequences", k)
			}
			if first {
				if err := prepareTarget(k, sk, meta, opts.Force); err != nil {
					return err
				}
			}
			for _, op := range batch {
				if err := k.put(op.b, op.key, op.value); err != nil {
					return fmt.Errorf("%s %q: %w", op.b.top, op.key, err)
				}
			}
			if last {
				return sk.setSeq(refEvents, counts.EventSeq)
			}
			return nil
		})
		if err != nil {
			return DumpCounts{}, fmt.Errorf("load state (transaction %d of %d): %w", i+1, len(batches), err)
		}
	}
	return counts, nil
}

// CheckDump reads a whole dump and checks it as Load does, without a store.
func CheckDump(r io.Reader) (DumpCounts, error) {
	_, _, c, err := parseDump(r)
	if err != nil {
		return DumpCounts{}, fmt.Errorf("check state dump: %w", err)
	}
	return c, nil
}

// loadOp is one record to write.
type loadOp struct {
	b     bucketRef
	key   string
	value []byte
}

func split(ops []loadOp, lim loadLimits) [][]loadOp {
	var out [][]loadOp
	var cur []loadOp
	size := 0
	for _, op := range ops {
		n := len(op.key) + len(op.value)
		if len(cur) > 0 && (len(cur) >= lim.ops || size+n > lim.bytes) {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, op)
		size += n
	}
	if len(cur) > 0 || len(out) == 0 {
		out = append(out, cur)
	}
	return out
}

// prepareTarget refuses a non-empty target, or (force) empties it: records
// and sequences are deleted and meta keys the dump lacks are removed.
func prepareTarget(k kv, sk seqKV, meta []loadOp, force bool) error {
	if !force {
		what, err := contents(k, sk)
		if err != nil {
			return err
		}
		if what != "" {
			return fmt.Errorf("%w: it has %s; replace it with -force", ErrNotEmpty, what)
		}
		return nil
	}
	if err := sk.clearData(); err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, op := range meta {
		keep[op.key] = true
	}
	var stale []string
	if err := k.scan(refMeta, "", func(key string, _ []byte) (bool, error) {
		if !keep[key] {
			stale = append(stale, key)
		}
		return true, nil
	}); err != nil {
		return err
	}
	for _, key := range stale {
		if err := k.del(refMeta, key); err != nil {
			return err
		}
	}
	return nil
}

// contents names the first kind of record k holds beyond what a new store
// has, or "" for an empty store.
func contents(k kv, sk seqKV) (string, error) {
	var found string
	first := func(what string) func(string, []byte) (bool, error) {
		return func(key string, _ []byte) (bool, error) {
			found = fmt.Sprintf("%s %q", what, key)
			return false, nil
		}
	}
	for _, b := range []struct {
		ref  bucketRef
		what string
	}{{refFleets, "fleet"}, {refOfferings, "offering"}} {
		if err := k.scan(b.ref, "", first(b.what)); err != nil || found != "" {
			return found, err
		}
	}
	if n, err := sk.seq(refEvents); err != nil || n > 0 {
		return fmt.Sprintf("%d events", n), err
	}
	err := k.scan(refMeta, "", func(key string, _ []byte) (bool, error) {
		switch key {
		case MetaSchemaVersion, MetaDaemonID, MetaCreatedAt:
			return true, nil
		}
		found = fmt.Sprintf("meta key %q", key)
		return false, nil
	})
	return found, err
}

// parseDump reads and checks a whole dump: meta ops, record ops (fleets,
// nodes, events, offerings, staging reports) and the counts.
func parseDump(r io.Reader) (meta, data []loadOp, c DumpCounts, err error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	lineNo := 0
	next := func() (dumpLine, bool, error) {
		var l dumpLine
		if !dec.More() {
			return l, false, nil
		}
		lineNo++
		if err := dec.Decode(&l); err != nil {
			return l, false, fmt.Errorf("record %d: %w", lineNo, err)
		}
		return l, true, nil
	}
	h, ok, err := next()
	switch {
	case err != nil:
		return nil, nil, c, err
	case !ok || h.Format != dumpFormat:
		return nil, nil, c, fmt.Errorf("not a fleetd state dump (no %q header)", dumpFormat)
	case h.Version != DumpVersion:
		return nil, nil, c, fmt.Errorf("dump format version %d; this fleetd reads version %d", h.Version, DumpVersion)
	case h.SchemaVersion != SchemaVersion:
		return nil, nil, c, fmt.Errorf("dump of schema version %d; this fleetd writes version %d (export and import with the same fleetd version)",
			h.SchemaVersion, SchemaVersion)
	}
	fleets := map[string]bool{}
	var lastSeq uint64
	var end *DumpCounts
	for {
		l, ok, err := next()
		if err != nil {
			return nil, nil, c, err
		}
		if !ok {
			break
		}
		if end != nil {
			return nil, nil, c, fmt.Errorf("record %d after the end line", lineNo)
		}
		if l.End != nil {
			end = l.End
			continue
		}
		op, err := checkRecord(l, fleets, &lastSeq)
		if err != nil {
			return nil, nil, c, fmt.Errorf("record %d (%s %q): %w", lineNo, l.Kind, l.Key, err)
		}
		switch l.Kind {
		case kindMeta:
			if len(data) > 0 {
				return nil, nil, c, fmt.Errorf("record %d: meta after records", lineNo)
			}
			meta = append(meta, op)
			c.Meta++
			continue
		case kindFleet:
			c.Fleets++
		case kindNode:
			c.Nodes++
		case kindEvent:
			c.Events++
		case kindOffering:
			c.Offerings++
		case kindStaging:
			c.Staging++
		}
		data = append(data, op)
	}
	if end == nil {
		return nil, nil, c, errors.New("the dump has no end line: truncated?")
	}
	c.EventSeq = end.EventSeq
	if *end != c {
		return nil, nil, c, fmt.Errorf("the end line counts %v but the dump holds %v", *end, c)
	}
	if c.EventSeq < lastSeq {
		return nil, nil, c, fmt.Errorf("event sequence %d is below the last event's seq %d", c.EventSeq, lastSeq)
	}
	for _, key := range []string{MetaSchemaVersion, MetaDaemonID, MetaCreatedAt} {
		found := false
		for _, op := range meta {
			if op.key == key {
				found = true
				if key == MetaSchemaVersion && string(op.value) != strconv.Itoa(h.SchemaVersion) {
					return nil, nil, c, fmt.Errorf("meta %s %q disagrees with the header's %d", key, op.value, h.SchemaVersion)
				}
			}
		}
		if !found {
			return nil, nil, c, fmt.Errorf("meta key %s is missing", key)
		}
	}
	return meta, data, c, nil
}

// checkRecord validates one record line and returns its write.
func checkRecord(l dumpLine, fleets map[string]bool, lastSeq *uint64) (loadOp, error) {
	if err := checkKey("key", l.Key); err != nil {
		return loadOp{}, err
	}
	if l.Kind == kindMeta {
		if (l.Text == "") == (len(l.Base64) == 0) || l.Value != nil {
			return loadOp{}, errors.New(`a meta record has exactly one of "text" and "base64"`)
		}
		v := []byte(l.Text)
		if l.Text == "" {
			v = l.Base64
		}
		return loadOp{b: refMeta, key: l.Key, value: v}, nil
	}
	var value bytes.Buffer
	if err := json.Compact(&value, l.Value); err != nil || value.Len() == 0 {
		return loadOp{}, fmt.Errorf("value is not JSON: %v", err)
	}
	decode := func(v any) error {
		dec := json.NewDecoder(bytes.NewReader(value.Bytes()))
		return dec.Decode(v)
	}
	if l.Fleet != "" && l.Kind != kindNode && l.Kind != kindStaging {
		return loadOp{}, errors.New(`only nodes and staging reports have a "fleet"`)
	}
	switch l.Kind {
	case kindFleet:
		var f Fleet
		if err := decode(&f); err != nil {
			return loadOp{}, err
		}
		if f.Name != l.Key {
			return loadOp{}, fmt.Errorf("fleet named %q", f.Name)
		}
		fleets[f.Name] = true
		return loadOp{b: refFleets, key: l.Key, value: value.Bytes()}, nil
	case kindNode:
		var n Node
		if err := decode(&n); err != nil {
			return loadOp{}, err
		}
		switch {
		case !fleets[l.Fleet]:
			return loadOp{}, fmt.Errorf("node of fleet %q, which the dump does not have (before it)", l.Fleet)
		case n.ID != l.Key || n.Fleet != l.Fleet:
			return loadOp{}, fmt.Errorf("node record says fleet %q id %q", n.Fleet, n.ID)
		case !n.State.Valid():
			return loadOp{}, fmt.Errorf("unknown node state %q", n.State)
		}
		return loadOp{b: refNodes(l.Fleet), key: l.Key, value: value.Bytes()}, nil
	case kindEvent:
		seq, err := strconv.ParseUint(l.Key, 10, 64)
		if err != nil || seq == 0 {
			return loadOp{}, errors.New("event key is not a seq")
		}
		var e Event
		if err := decode(&e); err != nil {
			return loadOp{}, err
		}
		if e.Seq != seq || seq <= *lastSeq {
			return loadOp{}, fmt.Errorf("event seq %d (record says %d) after seq %d", seq, e.Seq, *lastSeq)
		}
		*lastSeq = seq
		return loadOp{b: refEvents, key: seqKey(seq), value: value.Bytes()}, nil
	case kindOffering:
		var o OfferingRecord
		if err := decode(&o); err != nil {
			return loadOp{}, err
		}
		if o.Key != l.Key {
			return loadOp{}, fmt.Errorf("offering record says key %q", o.Key)
		}
		return loadOp{b: refOfferings, key: l.Key, value: value.Bytes()}, nil
	case kindStaging:
		var r StagingRecord
		if err := decode(&r); err != nil {
			return loadOp{}, err
		}
		switch {
		case !fleets[l.Fleet]:
			return loadOp{}, fmt.Errorf("staging report of fleet %q, which the dump does not have (before it)", l.Fleet)
		case r.Fleet != l.Fleet || stagingKey(r.Node, r.MountPath) != l.Key:
			return loadOp{}, fmt.Errorf("staging record says fleet %q node %q mount path %q", r.Fleet, r.Node, r.MountPath)
		}
		return loadOp{b: refStaging(l.Fleet), key: l.Key, value: value.Bytes()}, nil
	}
	return loadOp{}, fmt.Errorf("unknown record kind %q", l.Kind)
}

// The backends' raw access.

func (s *BoltStore) rawView(ctx context.Context, fn func(kv) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return mapErr(s.db.View(func(btx *bolt.Tx) error { return fn(&boltKV{tx: btx}) }))
}

// rawUpdate writes around tx and so around the node cache: every fleet
// whose nodes existed before or after the write is marked as being written
// and then reloaded from the file by the next reader.
func (s *BoltStore) rawUpdate(ctx context.Context, fn func(kv) error) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	var txid int
	touched := map[string]*nodeWrites{}
	defer func() { s.nodes.invalidate(txid, touched) }() // also after a panic
	mark := func(btx *bolt.Tx) error {
		return btx.Bucket(bucketNodes).ForEachBucket(func(name []byte) error {
			if touched[string(name)] == nil {
				touched[string(name)] = &nodeWrites{}
				s.nodes.begin(string(name))
			}
			return nil
		})
	}
	return mapErr(s.db.Update(func(btx *bolt.Tx) error {
		txid = btx.ID()
		if err := mark(btx); err != nil {
			return err
		}
		if err := fn(&boltKV{tx: btx}); err != nil {
			return err
		}
		return mark(btx)
	}))
}

func (s *BoltStore) loadLimits() loadLimits { return loadLimits{} }

func (k *boltKV) seq(b bucketRef) (uint64, error) {
	bk, err := k.bucket(b, false)
	if bk == nil {
		return 0, err
	}
	return bk.Sequence(), nil
}

func (k *boltKV) setSeq(b bucketRef, n uint64) error {
	bk, err := k.bucket(b, true)
	if err != nil {
		return err
	}
	return bk.SetSequence(n)
}

func (k *boltKV) clearData() error {
	for _, name := range topBuckets {
		if bytes.Equal(name, bucketMeta) {
			continue
		}
		if err := k.tx.DeleteBucket(name); err != nil {
			return fmt.Errorf("clear bucket %q: %w", name, err)
		}
		if _, err := k.tx.CreateBucket(name); err != nil {
			return fmt.Errorf("clear bucket %q: %w", name, err)
		}
	}
	return nil
}

func (m *Memory) rawView(ctx context.Context, fn func(kv) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	return fn(&memKV{m: m})
}

func (m *Memory) rawUpdate(ctx context.Context, fn func(kv) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	m.mu.RLock()
	closed := m.closed
	m.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	// The base maps only change in commit, which only this writer (holding
	// writeMu) runs, so fn may read them without m.mu.
	k := &memKV{m: m, write: true}
	if err := fn(k); err != nil {
		return err
	}
	k.commit()
	return nil
}

func (m *Memory) loadLimits() loadLimits { return loadLimits{} }

func (k *memKV) seq(b bucketRef) (uint64, error) {
	name := bucketName(b)
	if p := k.pending[name]; p != nil && p.seqSet {
		return p.seq, nil
	}
	if mb := k.base(name); mb != nil {
		return mb.seq, nil
	}
	return 0, nil
}

func (k *memKV) setSeq(b bucketRef, n uint64) error {
	p := k.pend(b)
	p.seq, p.seqSet = n, true
	return nil
}

func (k *memKV) clearData() error {
	if k.pending == nil {
		k.pending = map[string]*memPending{}
	}
	// Under writeMu the committed bucket set only changes in commit.
	names := map[string]bool{}
	for name := range k.m.buckets {
		names[name] = true
	}
	for name := range k.pending {
		names[name] = true
	}
	for name := range names {
		if name != string(bucketMeta) {
			k.pending[name] = &memPending{dropped: true, puts: map[string][]byte{}}
		}
	}
	return nil
}

func (s *Etcd) rawView(ctx context.Context, fn func(kv) error) error {
	release, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer release()
	return fn(s.newKV(ctx, false))
}

func (s *Etcd) rawUpdate(ctx context.Context, fn func(kv) error) error {
	return s.update(ctx, true, func(k *etcdKV) error { return fn(k) })
}

// Below etcd's default --max-txn-ops (128, leaving room for the clear,
// the sequence and the commit key) and --max-request-bytes (1.5 MiB).
func (s *Etcd) loadLimits() loadLimits { return loadLimits{ops: 100, bytes: 1 << 20} }
