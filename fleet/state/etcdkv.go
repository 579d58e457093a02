package state

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The etcd layout: one key per record under a prefix (default
// DefaultEtcdPrefix), the buckets of schema.go turned into key prefixes.
//
//	<prefix>meta/<key>            opaque bytes, as the meta bucket (schema_version, daemon_id, …)
//	<prefix>fleets/<name>         Fleet JSON
//	<prefix>nodes/<fleet>/<id>    Node JSON; <fleet> is escaped (% → %25, / → %2F) so that
//	                              one fleet's prefix never covers another fleet's nodes
//	<prefix>events/<seq>          Event JSON; seq zero-padded to 20 digits, so key order is
//	                              seq order
//	<prefix>offerings/<key>       OfferingRecord JSON
//	<prefix>staging/<fleet>/<node id> NUL <mount path>   StagingRecord JSON; <fleet> escaped as for nodes
//	<prefix>seq/events            last event seq handed out, decimal (the bucket sequence
//	                              bbolt keeps in the bucket header)
//	<prefix>commit                id of the last committed transaction; every write
//	                              compares its ModRevision (see Etcd.Update)
//
// Values are byte for byte what the bbolt store holds, so `etcdctl get
// --prefix /fleetd/v1/fleets/` shows the same JSON as `bbolt get`.
const DefaultEtcdPrefix = "/fleetd/v1/"

// etcdLayout turns bucket references into etcd keys under one prefix.
type etcdLayout struct{ prefix string }

func (l etcdLayout) commitKey() string { return l.prefix + "commit" }

// seqKey holds a bucket's sequence. Only top-level buckets have one.
func (l etcdLayout) seqKey(b bucketRef) string { return l.prefix + "seq/" + string(b.top) }

// bucket is the key prefix of b's records, ending in "/".
func (l etcdLayout) bucket(b bucketRef) string {
	if b.sub == "" {
		return l.prefix + string(b.top) + "/"
	}
	return l.prefix + string(b.top) + "/" + escapeSegment(b.sub) + "/"
}

// dataBuckets are the prefixes holding records and sequences, everything
// but meta and the commit key (see etcdKV.clearData).
func (l etcdLayout) dataBuckets() []string {
	return []string{
		l.prefix + string(bucketFleets) + "/", l.prefix + string(bucketNodes) + "/",
		l.prefix + string(bucketEvents) + "/", l.prefix + string(bucketOfferings) + "/",
		l.prefix + string(bucketStaging) + "/", l.prefix + "seq/",
	}
}

var segmentEscaper = strings.NewReplacer("%", "%25", "/", "%2F")

func escapeSegment(s string) string { return segmentEscaper.Replace(s) }

// isEvents reports whether b is the event log, whose tx-level keys are
// big-endian uint64s (seqKey in tx.go) and whose etcd keys are decimal.
func isEvents(b bucketRef) bool { return b.sub == "" && bytes.Equal(b.top, bucketEvents) }

// encodeKey maps a tx-level key to the suffix of its etcd key.
func encodeKey(b bucketRef, key string) (string, error) {
	if !isEvents(b) || key == "" {
		return key, nil
	}
	if len(key) != 8 {
		return "", fmt.Errorf("event key %x is not a big-endian uint64", key)
	}
	return fmt.Sprintf("%020d", binary.BigEndian.Uint64([]byte(key))), nil
}

// decodeKey is encodeKey's inverse.
func decodeKey(b bucketRef, suffix string) (string, error) {
	if !isEvents(b) {
		return suffix, nil
	}
	n, err := strconv.ParseUint(suffix, 10, 64)
	if err != nil || len(suffix) != 20 {
		return "", fmt.Errorf("etcd event key %q is not a 20-digit seq", suffix)
	}
	return seqKey(n), nil
}

// scanPage is how many keys one range request returns: large enough that a
// fleet's nodes take a few round trips, small enough that a page stays far
// below etcd's 2 GiB response limit and Events(since, 10) does not fetch the
// whole log.
const scanPage = 512

// etcdKV is kv over etcd: reads at one revision, writes buffered until the
// store commits them (Etcd.commit), and read-your-writes over the buffer.
type etcdKV struct {
	s     *Etcd
	ctx   context.Context
	write bool

	// rev is the snapshot revision, fixed by the first read (0 before it).
	rev int64
	// commitMod is the commit key's ModRevision at rev, once read
	// (commitAt; 0: not read, or never committed).
	commitMod int64
	// read caches values read at rev by etcd key (nil: absent); whole
	// holds the sorted keys of buckets read completely, whose absent keys
	// then need no request.
	read  map[string][]byte
	whole map[string][]string

	pending map[string]*etcdPending // by bucket prefix
	seqs    map[string]uint64       // new sequence values by seq key
	cleared bool                    // clearData ran: data buckets read as empty
}

// etcdPending is one bucket's buffered changes.
type etcdPending struct {
	dropped bool              // every committed key of the bucket is deleted
	puts    map[string][]byte // by etcd key; nil value: deleted
}

func (s *Etcd) newKV(ctx context.Context, write bool) *etcdKV {
	return &etcdKV{s: s, ctx: ctx, write: write, read: map[string][]byte{}, whole: map[string][]string{}}
}

func (k *etcdKV) writable() bool { return k.write }

// dirty reports whether commit has anything to write.
func (k *etcdKV) dirty() bool { return len(k.pending) > 0 || len(k.seqs) > 0 || k.cleared }

func (k *etcdKV) revOpts(opts ...clientv3.OpOption) []clientv3.OpOption {
	if k.rev > 0 {
		opts = append(opts, clientv3.WithRev(k.rev))
	}
	return opts
}

// fix pins the snapshot to the revision of the first response.
func (k *etcdKV) fix(rev int64) {
	if k.rev == 0 {
		k.rev = rev
	}
}

func (k *etcdKV) pend(bp string) *etcdPending {
	if k.pending == nil {
		k.pending = map[string]*etcdPending{}
	}
	p := k.pending[bp]
	if p == nil {
		p = &etcdPending{puts: map[string][]byte{}}
		k.pending[bp] = p
	}
	return p
}

// isCleared reports whether bucket prefix bp was emptied by clearData.
func (k *etcdKV) isCleared(bp string) bool {
	return k.cleared && !strings.HasPrefix(bp, k.s.layout.bucket(refMeta))
}

func (k *etcdKV) get(b bucketRef, key string) ([]byte, error) {
	bp := k.s.layout.bucket(b)
	suffix, err := encodeKey(b, key)
	if err != nil {
		return nil, err
	}
	full := bp + suffix
	if p := k.pending[bp]; p != nil {
		if v, ok := p.puts[full]; ok {
			return v, nil
		}
		if p.dropped {
			return nil, nil
		}
	}
	if k.isCleared(bp) {
		return nil, nil
	}
	return k.getRaw(full, bp)
}

// getRaw reads one etcd key at the snapshot revision, through the cache.
// bp, if not empty, is the key's bucket prefix.
func (k *etcdKV) getRaw(full, bp string) ([]byte, error) {
	if v, ok := k.read[full]; ok {
		return v, nil
	}
	if _, ok := k.whole[bp]; ok && bp != "" {
		return nil, nil
	}
	resp, err := k.s.cli.Get(k.ctx, full, k.revOpts()...)
	if err != nil {
		return nil, fmt.Errorf("etcd get %s: %w", full, err)
	}
	k.fix(resp.Header.Revision)
	var v []byte
	if len(resp.Kvs) > 0 {
		v = resp.Kvs[0].Value
		if v == nil {
			v = []byte{} // present but empty: not "absent"
		}
	}
	k.read[full] = v
	return v, nil
}

func (k *etcdKV) put(b bucketRef, key string, value []byte) error {
	bp := k.s.layout.bucket(b)
	if k.isCleared(bp) {
		return errors.New("etcd: records written in the transaction that cleared the store")
	}
	suffix, err := encodeKey(b, key)
	if err != nil {
		return err
	}
	if value == nil {
		value = []byte{}
	}
	k.pend(bp).puts[bp+suffix] = bytes.Clone(value)
	return nil
}

func (k *etcdKV) del(b bucketRef, key string) error {
	bp := k.s.layout.bucket(b)
	suffix, err := encodeKey(b, key)
	if err != nil {
		return err
	}
	k.pend(bp).puts[bp+suffix] = nil
	return nil
}

func (k *etcdKV) dropBucket(b bucketRef) error {
	if b.sub == "" {
		return fmt.Errorf("drop bucket %q: only nested buckets can be dropped", b.top)
	}
	p := k.pend(k.s.layout.bucket(b))
	p.dropped, p.puts = true, map[string][]byte{}
	return nil
}

func (k *etcdKV) nextSeq(b bucketRef) (uint64, error) {
	n, err := k.seq(b)
	if err != nil {
		return 0, err
	}
	if k.seqs == nil {
		k.seqs = map[string]uint64{}
	}
	k.seqs[k.s.layout.seqKey(b)] = n + 1
	return n + 1, nil
}

// seq returns the bucket's current sequence (0 if never used).
func (k *etcdKV) seq(b bucketRef) (uint64, error) {
	sk := k.s.layout.seqKey(b)
	if n, ok := k.seqs[sk]; ok {
		return n, nil
	}
	if k.cleared {
		return 0, nil
	}
	v, err := k.getRaw(sk, "")
	if err != nil || v == nil {
		return 0, err
	}
	n, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd key %s = %q is not a sequence number", sk, v)
	}
	return n, nil
}

// setSeq sets the bucket's sequence (Load).
func (k *etcdKV) setSeq(b bucketRef, n uint64) error {
	if k.cleared {
		return errors.New("etcd: sequence set in the transaction that cleared the store")
	}
	if k.seqs == nil {
		k.seqs = map[string]uint64{}
	}
	k.seqs[k.s.layout.seqKey(b)] = n
	return nil
}

// clearData deletes every record and sequence, keeping meta. The same
// transaction may then change meta but not write records: etcd refuses a
// put inside a range the same transaction deletes.
func (k *etcdKV) clearData() error {
	k.cleared = true
	k.seqs = nil
	for bp := range k.pending {
		if k.isCleared(bp) {
			delete(k.pending, bp)
		}
	}
	return nil
}

func (k *etcdKV) scan(b bucketRef, start string, fn func(string, []byte) (bool, error)) error {
	bp := k.s.layout.bucket(b)
	suffix, err := encodeKey(b, start)
	if err != nil {
		return err
	}
	from := bp + suffix
	p := k.pending[bp]
	keys, whole := k.whole[bp]
	switch {
	case k.isCleared(bp):
		keys = nil
	case p != nil && p.dropped:
		keys = nil
	case !whole && p == nil:
		return k.stream(b, bp, from, start == "", fn)
	case !whole:
		if keys, err = k.loadBucket(bp); err != nil {
			return err
		}
	}
	var puts map[string][]byte
	if p != nil {
		puts = p.puts
	}
	return mergeScan(keys, k.read, puts, from, func(key string, v []byte) (bool, error) {
		return visit(b, bp, key, v, fn)
	})
}

// visit hands fn the entry of bucket b (prefix bp) at the etcd key key.
func visit(b bucketRef, bp, key string, v []byte, fn func(string, []byte) (bool, error)) (bool, error) {
	dk, err := decodeKey(b, key[len(bp):])
	if err != nil {
		return false, err
	}
	return fn(dk, v)
}

// stream calls fn for the bucket's keys ≥ from, one page at a time, so a
// caller that stops early (Events with a limit) reads little. A complete
// scan from the start is remembered in whole.
func (k *etcdKV) stream(b bucketRef, bp, from string, fromStart bool, fn func(string, []byte) (bool, error)) error {
	end := clientv3.GetPrefixRangeEnd(bp)
	var seen []string
	for {
		resp, err := k.s.cli.Get(k.ctx, from, k.revOpts(clientv3.WithRange(end), clientv3.WithLimit(scanPage))...)
		if err != nil {
			return fmt.Errorf("etcd range %s: %w", bp, err)
		}
		k.fix(resp.Header.Revision)
		for _, kv := range resp.Kvs {
			key := string(kv.Key)
			v := kv.Value
			if v == nil {
				v = []byte{}
			}
			k.read[key] = v
			if fromStart {
				seen = append(seen, key)
			}
			if more, err := visit(b, bp, key, v, fn); err != nil || !more {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	if fromStart {
		k.whole[bp] = seen
	}
	return nil
}

// loadBucket reads all of a bucket at the snapshot revision.
func (k *etcdKV) loadBucket(bp string) ([]string, error) {
	end := clientv3.GetPrefixRangeEnd(bp)
	from := bp
	var keys []string
	for {
		resp, err := k.s.cli.Get(k.ctx, from, k.revOpts(clientv3.WithRange(end), clientv3.WithLimit(scanPage))...)
		if err != nil {
			return nil, fmt.Errorf("etcd range %s: %w", bp, err)
		}
		k.fix(resp.Header.Revision)
		for _, kv := range resp.Kvs {
			v := kv.Value
			if v == nil {
				v = []byte{}
			}
			k.read[string(kv.Key)] = v
			keys = append(keys, string(kv.Key))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = keys[len(keys)-1] + "\x00"
	}
	k.whole[bp] = keys
	return keys, nil
}

// ops turns the buffered changes into the Then branch of the commit. etcd
// refuses a transaction in which a put falls inside a deleted range, so a
// dropped bucket that gets new keys in the same transaction (DeleteFleet,
// then PutFleet and PutNode again) is deleted as the ranges between them.
func (k *etcdKV) ops() []clientv3.Op {
	var ops []clientv3.Op
	if k.cleared {
		for _, bp := range k.s.layout.dataBuckets() {
			ops = append(ops, clientv3.OpDelete(bp, clientv3.WithRange(clientv3.GetPrefixRangeEnd(bp))))
		}
	}
	for _, bp := range slices.Sorted(maps.Keys(k.pending)) {
		p := k.pending[bp]
		keys := slices.Sorted(maps.Keys(p.puts))
		if p.dropped {
			lo := bp
			for _, key := range keys {
				if p.puts[key] == nil {
					continue // inside a deleted range already
				}
				if lo < key {
					ops = append(ops, clientv3.OpDelete(lo, clientv3.WithRange(key)))
				}
				lo = key + "\x00"
			}
			ops = append(ops, clientv3.OpDelete(lo, clientv3.WithRange(clientv3.GetPrefixRangeEnd(bp))))
		}
		for _, key := range keys {
			switch v := p.puts[key]; {
			case v != nil:
				ops = append(ops, clientv3.OpPut(key, string(v)))
			case !p.dropped:
				ops = append(ops, clientv3.OpDelete(key))
			}
		}
	}
	for _, sk := range slices.Sorted(maps.Keys(k.seqs)) {
		ops = append(ops, clientv3.OpPut(sk, strconv.FormatUint(k.seqs[sk], 10)))
	}
	return ops
}
