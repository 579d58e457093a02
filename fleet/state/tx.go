package state

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// bucketRef names a bucket of the layout in schema.go: a top-level bucket,
// or a nested one (sub != "") such as nodes/<fleet>.
type bucketRef struct {
	top []byte
	sub string
}

var (
	refMeta      = bucketRef{top: bucketMeta}
	refFleets    = bucketRef{top: bucketFleets}
	refEvents    = bucketRef{top: bucketEvents}
	refOfferings = bucketRef{top: bucketOfferings}
)

func refNodes(fleet string) bucketRef { return bucketRef{top: bucketNodes, sub: fleet} }

func refStaging(fleet string) bucketRef { return bucketRef{top: bucketStaging, sub: fleet} }

// kv is the bucketed key-value transaction both backends provide. All typed
// logic (encoding, generations, timestamps, validation) lives in tx on top of
// it, so the bbolt and memory stores cannot drift apart.
type kv interface {
	writable() bool
	// get returns nil when the key or bucket is absent. The slice is only
	// valid until the transaction ends and must not be modified.
	get(b bucketRef, key string) ([]byte, error)
	// put creates a missing nested bucket on demand.
	put(b bucketRef, key string, value []byte) error
	// del is a no-op for absent keys.
	del(b bucketRef, key string) error
	// scan calls fn in key (byte) order for keys >= start until fn returns
	// false or an error. Missing buckets scan as empty.
	scan(b bucketRef, start string, fn func(key string, value []byte) (bool, error)) error
	// nextSeq returns the bucket's next sequence number (1, 2, …). It rolls
	// back with the transaction.
	nextSeq(b bucketRef) (uint64, error)
	// dropBucket deletes a nested bucket and everything in it; no-op if absent.
	dropBucket(b bucketRef) error
}

// mergeScan is scan for the stores that buffer a transaction's writes
// (memory, etcd): it calls fn for the keys >= from of a sorted snapshot
// (keys, their values in vals) merged with the pending puts (nil value:
// deleted), in key order, a pending entry shadowing the snapshot's.
func mergeScan(keys []string, vals, puts map[string][]byte, from string, fn func(key string, value []byte) (bool, error)) error {
	keys = keys[sort.SearchStrings(keys, from):]
	var over []string
	for key := range puts {
		if key >= from {
			over = append(over, key)
		}
	}
	slices.Sort(over)
	i, j := 0, 0
	for i < len(keys) || j < len(over) {
		var key string
		var v []byte
		switch {
		case j == len(over) || (i < len(keys) && keys[i] < over[j]):
			key, v = keys[i], vals[keys[i]]
			i++
		default:
			if i < len(keys) && keys[i] == over[j] {
				i++
			}
			key, v = over[j], puts[over[j]]
			j++
			if v == nil {
				continue
			}
		}
		if more, err := fn(key, v); err != nil || !more {
			return err
		}
	}
	return nil
}

// maxKeyLen bounds names and keys; bbolt's own limit is 32 KiB, but nothing
// legitimate comes close and a small bound keeps both backends identical.
const maxKeyLen = 1024

// tx implements Tx over a kv.
type tx struct {
	kv   kv
	now  func() time.Time
	done bool

	// cache, when set, serves node reads at txid (the bbolt transaction
	// id) and receives this transaction's node writes in nodes, applied
	// by the store after commit. Only BoltStore.View and Update set it.
	cache *nodeCache
	txid  int
	nodes map[string]*nodeWrites
	// incs caches fleet incarnations for AppendEvent; PutFleet and
	// DeleteFleet invalidate it.
	incs map[string]string
}

// runTx runs fn with a Tx over k; the Tx is unusable after fn returns.
func runTx(k kv, now func() time.Time, fn func(Tx) error) error {
	return (&tx{kv: k, now: now}).run(fn)
}

func (t *tx) run(fn func(Tx) error) error {
	defer func() { t.done = true }()
	return fn(t)
}

// wrote returns this transaction's pending writes to fleet's nodes,
// marking the fleet as being written in the cache on first use.
func (t *tx) wrote(fleet string) *nodeWrites {
	w := t.nodes[fleet]
	if w == nil {
		if t.nodes == nil {
			t.nodes = map[string]*nodeWrites{}
		}
		w = &nodeWrites{puts: map[string]*Node{}}
		t.nodes[fleet] = w
		t.cache.begin(fleet)
	}
	return w
}

func (t *tx) check(write bool) error {
	if t.done {
		return ErrTxDone
	}
	if write && !t.kv.writable() {
		return ErrReadOnly
	}
	return nil
}

// stamp is the store clock in UTC without a monotonic reading, so values read
// back compare equal to values returned by a put.
func (t *tx) stamp() time.Time { return t.now().UTC().Round(0) }

func checkKey(what, key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty %s", ErrInvalid, what)
	}
	if len(key) > maxKeyLen {
		return fmt.Errorf("%w: %s longer than %d bytes", ErrInvalid, what, maxKeyLen)
	}
	return nil
}

func (t *tx) Meta(key string) ([]byte, error) {
	if err := t.check(false); err != nil {
		return nil, err
	}
	v, err := t.kv.get(refMeta, key)
	if err != nil || v == nil {
		return nil, err
	}
	return bytes.Clone(v), nil
}

// SetMeta stores value under key; a nil or empty value deletes the key.
// The keys the store writes itself (MetaSchemaVersion, MetaDaemonID,
// MetaCreatedAt) are refused.
func (t *tx) SetMeta(key string, value []byte) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkKey("meta key", key); err != nil {
		return err
	}
	switch key {
	case MetaSchemaVersion, MetaDaemonID, MetaCreatedAt:
		return fmt.Errorf("%w: meta key %q is written by the store only", ErrInvalid, key)
	}
	if len(value) == 0 {
		return t.kv.del(refMeta, key)
	}
	return t.kv.put(refMeta, key, bytes.Clone(value))
}

func (t *tx) Fleet(name string) (Fleet, error) {
	if err := t.check(false); err != nil {
		return Fleet{}, err
	}
	var f Fleet
	found, err := t.getJSON(refFleets, "fleet", name, &f)
	if err == nil && !found {
		return Fleet{}, fmt.Errorf("fleet %q: %w", name, ErrNotFound)
	}
	return f, err
}

func (t *tx) Fleets() ([]Fleet, error) {
	if err := t.check(false); err != nil {
		return nil, err
	}
	return scanJSON[Fleet](t.kv, refFleets, "fleet")
}

func (t *tx) PutFleet(f Fleet) (Fleet, error) {
	if err := t.check(true); err != nil {
		return Fleet{}, err
	}
	if err := checkKey("fleet name", f.Name); err != nil {
		return Fleet{}, err
	}
	now := t.stamp()
	old, err := t.Fleet(f.Name)
	switch {
	case err == nil:
		f.Generation = old.Generation + 1
		f.CreatedAt = old.CreatedAt
		f.Incarnation, f.LegacyUntagged = old.Incarnation, old.LegacyUntagged
	case isNotFound(err):
		f.Generation = 1
		if f.CreatedAt.IsZero() {
			f.CreatedAt = now
		}
		if f.Incarnation == "" {
			if f.Incarnation, err = NewIncarnation(); err != nil {
				return Fleet{}, err
			}
		}
	default:
		return Fleet{}, err
	}
	f.UpdatedAt = now
	var stored Fleet
	if err := t.putJSON(refFleets, f.Name, f, &stored); err != nil {
		return Fleet{}, err
	}
	delete(t.incs, f.Name)
	return stored, nil
}

func (t *tx) DeleteFleet(name string) error {
	if err := t.check(true); err != nil {
		return err
	}
	if _, err := t.Fleet(name); err != nil {
		return err
	}
	if err := t.kv.dropBucket(refNodes(name)); err != nil {
		return err
	}
	if err := t.kv.dropBucket(refStaging(name)); err != nil {
		return err
	}
	if t.cache != nil {
		*t.wrote(name) = nodeWrites{dropped: true, puts: map[string]*Node{}}
	}
	delete(t.incs, name)
	return t.kv.del(refFleets, name)
}

// incarnation returns fleet's current incarnation ("" when there is no
// such fleet), remembered for the rest of the transaction: a pass appends
// many events of one fleet.
func (t *tx) incarnation(fleet string) (string, error) {
	if inc, ok := t.incs[fleet]; ok {
		return inc, nil
	}
	f, err := t.Fleet(fleet)
	switch {
	case isNotFound(err):
	case err != nil:
		return "", err
	}
	if t.incs == nil {
		t.incs = map[string]string{}
	}
	t.incs[fleet] = f.Incarnation
	return f.Incarnation, nil
}

// NewIncarnation returns a fresh fleet incarnation id: 8 characters of
// [a-z0-9] (40 random bits), short enough for node ids and cloud labels.
func NewIncarnation() (string, error) { return RandomID(8) }

// RandomID returns n random characters of [a-z0-9] minus the easily
// confused l and o (valid in GCE names and labels, EC2 tags, file names).
func RandomID(n int) (string, error) {
	const alphabet = "abcdefghijkmnpqrstuvwxyz0123456789" // 34 symbols
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b), nil
}

// fleetExists is Fleet's not-found check without decoding the record.
func (t *tx) fleetExists(name string) error {
	v, err := t.kv.get(refFleets, name)
	if err != nil {
		return err
	}
	if v == nil {
		return fmt.Errorf("fleet %q: %w", name, ErrNotFound)
	}
	return nil
}

func (t *tx) Node(fleet, id string) (Node, error) {
	if err := t.check(false); err != nil {
		return Node{}, err
	}
	notFound := func() error { return fmt.Errorf("node %q of fleet %q: %w", id, fleet, ErrNotFound) }
	if fleet == "" || id == "" { // an empty fleet would name the parent bucket
		return Node{}, notFound()
	}
	if n, found, ok := t.cachedNode(fleet, id); ok {
		if !found {
			return Node{}, notFound()
		}
		return n, nil
	}
	var n Node
	found, err := t.getJSON(refNodes(fleet), "node", id, &n)
	if err == nil && !found {
		return Node{}, notFound()
	}
	return n, err
}

// cachedNode looks a node up in this transaction's own writes, then in the
// node cache; ok=false means the file must be read.
func (t *tx) cachedNode(fleet, id string) (n Node, found, ok bool) {
	if t.cache == nil {
		return Node{}, false, false
	}
	if w := t.nodes[fleet]; w != nil {
		if p, put := w.puts[id]; put {
			if p == nil {
				return Node{}, false, true
			}
			return *p, true, true
		}
		if w.dropped {
			return Node{}, false, true
		}
	}
	return t.cache.get(fleet, id, t.txid, t.kv.writable())
}

// Nodes returns the fleet's nodes ordered by id; ErrNotFound if the fleet
// does not exist.
func (t *tx) Nodes(fleet string) ([]Node, error) { return t.nodesOf(fleet, false) }

func (t *tx) SharedNodes(fleet string) ([]Node, error) { return t.nodesOf(fleet, true) }

// nodesOf reads fleet's nodes: from the store's node cache when it is
// current, as a copy or (shared) the cache's own slice.
func (t *tx) nodesOf(fleet string, shared bool) ([]Node, error) {
	if err := t.check(false); err != nil {
		return nil, err
	}
	if err := t.fleetExists(fleet); err != nil {
		return nil, err
	}
	// The cache serves the fleet unless this transaction changed it (the
	// file, read in this transaction, then has the changes).
	cached := t.cache != nil && t.nodes[fleet] == nil
	if cached {
		if out, ok := t.cache.list(fleet, t.txid, t.kv.writable(), shared); ok {
			return out, nil
		}
	}
	kc, _ := t.kv.(nodeCacher)
	if kc != nil {
		out, ok, err := kc.cachedNodes(fleet, shared)
		if err != nil || ok {
			return out, err
		}
	}
	out, err := scanJSON[Node](t.kv, refNodes(fleet), "node")
	if err != nil {
		return nil, err
	}
	if cached {
		t.cache.fill(fleet, t.txid, out)
	}
	if kc != nil {
		kc.fillNodes(fleet, out)
	}
	return out, nil
}

// PutNode stores n under its fleet, which must exist. CreatedAt is kept from
// the stored node (or set to now for a new one when zero); UpdatedAt is now.
func (t *tx) PutNode(n Node) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkKey("node id", n.ID); err != nil {
		return err
	}
	if err := checkKey("node fleet", n.Fleet); err != nil {
		return err
	}
	if !n.State.Valid() {
		return fmt.Errorf("%w: node %q: unknown state %q", ErrInvalid, n.ID, n.State)
	}
	if err := t.fleetExists(n.Fleet); err != nil {
		return fmt.Errorf("put node %q: %w", n.ID, err)
	}
	now := t.stamp()
	old, err := t.Node(n.Fleet, n.ID)
	switch {
	case err == nil:
		n.CreatedAt = old.CreatedAt
	case isNotFound(err):
		if n.CreatedAt.IsZero() {
			n.CreatedAt = now
		}
	default:
		return err
	}
	n.UpdatedAt = now
	if t.cache == nil {
		return t.putJSON(refNodes(n.Fleet), n.ID, n, nil)
	}
	// The cache gets what a later read decodes (time zones and monotonic
	// clock readings do not survive JSON), and only once the put is done.
	data, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("encode %s: %w", n.ID, err)
	}
	var stored Node
	if err := decode("node", n.ID, data, &stored); err != nil {
		return err
	}
	w := t.wrote(n.Fleet)
	if err := t.kv.put(refNodes(n.Fleet), n.ID, data); err != nil {
		return err
	}
	w.puts[n.ID] = &stored
	return nil
}

func (t *tx) DeleteNode(fleet, id string) error {
	if err := t.check(true); err != nil {
		return err
	}
	if _, err := t.Node(fleet, id); err != nil {
		return err
	}
	if err := t.kv.del(refNodes(fleet), id); err != nil {
		return err
	}
	if t.cache != nil {
		t.wrote(fleet).puts[id] = nil
	}
	return t.deleteStagings(fleet, id)
}

// stagingKey is a staging record's key: the node id, NUL, the mount path,
// so one node's records are a key range.
func stagingKey(node, mountPath string) string { return node + "\x00" + mountPath }

func (t *tx) PutStaging(r StagingRecord) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkKey("staging mount path", r.MountPath); err != nil {
		return err
	}
	if strings.ContainsRune(r.Node, 0) {
		return fmt.Errorf("%w: node id %q contains NUL", ErrInvalid, r.Node)
	}
	if _, err := t.Node(r.Fleet, r.Node); err != nil {
		return fmt.Errorf("put staging of %s: %w", r.MountPath, err)
	}
	if !json.Valid(r.Report) {
		return fmt.Errorf("%w: staging report of node %q is not JSON", ErrInvalid, r.Node)
	}
	r.UpdatedAt = t.stamp()
	return t.putJSON(refStaging(r.Fleet), stagingKey(r.Node, r.MountPath), r, nil)
}

func (t *tx) Stagings(fleet string) ([]StagingRecord, error) {
	if err := t.check(false); err != nil {
		return nil, err
	}
	if fleet == "" { // would name the parent bucket
		return []StagingRecord{}, nil
	}
	return scanJSON[StagingRecord](t.kv, refStaging(fleet), "staging")
}

// deleteStagings deletes node's staging records, found as a key range.
func (t *tx) deleteStagings(fleet, node string) error {
	prefix := stagingKey(node, "")
	var keys []string
	err := t.kv.scan(refStaging(fleet), prefix, func(k string, _ []byte) (bool, error) {
		if !strings.HasPrefix(k, prefix) {
			return false, nil
		}
		keys = append(keys, k)
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := t.kv.del(refStaging(fleet), k); err != nil {
			return err
		}
	}
	return nil
}

func (t *tx) AppendEvent(e Event) (Event, error) {
	if err := t.check(true); err != nil {
		return Event{}, err
	}
	if err := validEvent(e); err != nil {
		return Event{}, err
	}
	seq, err := t.kv.nextSeq(refEvents)
	if err != nil {
		return Event{}, err
	}
	e.Seq = seq
	if e.Time.IsZero() {
		e.Time = t.stamp()
	}
	if e.Fleet != "" && e.Incarnation == "" {
		if e.Incarnation, err = t.incarnation(e.Fleet); err != nil {
			return Event{}, err
		}
	}
	var stored Event
	if err := t.putJSON(refEvents, seqKey(seq), e, &stored); err != nil {
		return Event{}, err
	}
	return stored, nil
}

func validEvent(e Event) error {
	if e.Type == "" {
		return fmt.Errorf("%w: event without a type", ErrInvalid)
	}
	return nil
}

// validEvents checks a batch before any of it is written, so an invalid
// event fails the whole AppendEvents call.
func validEvents(events []Event) error {
	for _, e := range events {
		if err := validEvent(e); err != nil {
			return err
		}
	}
	return nil
}

// updateAppend is AppendEvents over a store's Update: every event checked
// first, then all appended in one transaction.
func updateAppend(ctx context.Context, update func(context.Context, func(Tx) error) error, events []Event) ([]Event, error) {
	if err := validEvents(events); err != nil {
		return nil, err
	}
	var out []Event
	err := update(ctx, func(t Tx) error {
		var err error
		out, err = appendEvents(t, events) // a rerun starts over
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// appendEvents is the body of every store's AppendEvents: the events in
// order, returned as stored. It builds a fresh slice, so a transaction that
// runs again starts over.
func appendEvents(t Tx, events []Event) ([]Event, error) {
	out := make([]Event, 0, len(events))
	for _, e := range events {
		stored, err := t.AppendEvent(e)
		if err != nil {
			return nil, err
		}
		out = append(out, stored)
	}
	return out, nil
}

func (t *tx) Offering(key string) (OfferingRecord, error) {
	if err := t.check(false); err != nil {
		return OfferingRecord{}, err
	}
	var r OfferingRecord
	found, err := t.getJSON(refOfferings, "offering", key, &r)
	if err == nil && !found {
		return OfferingRecord{Key: key}, nil
	}
	return r, err
}

func (t *tx) Offerings() ([]OfferingRecord, error) {
	if err := t.check(false); err != nil {
		return nil, err
	}
	return scanJSON[OfferingRecord](t.kv, refOfferings, "offering")
}

// PutOffering stores r under r.Key with UpdatedAt set to now.
func (t *tx) PutOffering(r OfferingRecord) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkKey("offering key", r.Key); err != nil {
		return err
	}
	r.UpdatedAt = t.stamp()
	return t.putJSON(refOfferings, r.Key, r, nil)
}

// putJSON encodes v under key and, if stored is non-nil, decodes the encoded
// bytes into it, so callers get exactly what a later read returns.
func (t *tx) putJSON(b bucketRef, key string, v, stored any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	if err := t.kv.put(b, key, data); err != nil {
		return err
	}
	if stored != nil {
		return json.Unmarshal(data, stored)
	}
	return nil
}

// getJSON decodes key's record in bucket b into v; false (and v untouched)
// when there is none.
func (t *tx) getJSON(b bucketRef, what, key string, v any) (bool, error) {
	data, err := t.kv.get(b, key)
	if err != nil || data == nil {
		return false, err
	}
	return true, decode(what, key, data, v)
}

// scanJSON decodes every record in bucket b, in key order; on an error it
// returns what it decoded before it.
func scanJSON[T any](k kv, b bucketRef, what string) ([]T, error) {
	out := []T{}
	err := k.scan(b, "", func(key string, v []byte) (bool, error) {
		var r T
		if err := decode(what, key, v, &r); err != nil {
			return false, err
		}
		out = append(out, r)
		return true, nil
	})
	return out, err
}

func decode(what, key string, data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode %s %q: %w", what, key, err)
	}
	return nil
}

func isNotFound(err error) bool { return err != nil && errors.Is(err, ErrNotFound) }

// seqKey is the events bucket key: big-endian so byte order is seq order.
func seqKey(seq uint64) string {
	return string(binary.BigEndian.AppendUint64(nil, seq))
}

// readEvents returns up to limit (all if limit <= 0) events with Seq > since.
func readEvents(k kv, since uint64, limit int) ([]Event, error) {
	out := []Event{}
	if since == math.MaxUint64 {
		return out, nil
	}
	err := k.scan(refEvents, seqKey(since+1), func(key string, v []byte) (bool, error) {
		if len(key) != 8 {
			return false, fmt.Errorf("event key %x is not a big-endian uint64", key)
		}
		var e Event
		if err := decode("event", fmt.Sprint(binary.BigEndian.Uint64([]byte(key))), v, &e); err != nil {
			return false, err
		}
		out = append(out, e)
		return limit <= 0 || len(out) < limit, nil
	})
	return out, err
}

// initMeta writes the store-owned meta keys of a new state file.
func initMeta(k kv, version int, now time.Time) error {
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return fmt.Errorf("daemon id: %w", err)
	}
	for key, v := range map[string]string{
		MetaSchemaVersion: fmt.Sprint(version),
		MetaDaemonID:      hex.EncodeToString(id[:]),
		MetaCreatedAt:     now.UTC().Format(time.RFC3339Nano),
	} {
		if err := k.put(refMeta, key, []byte(v)); err != nil {
			return err
		}
	}
	return nil
}

// DaemonID returns the id the store generated when its file was created;
// it tags every instance this deployment launches.
func DaemonID(ctx context.Context, s Store) (string, error) {
	var id []byte
	err := s.View(ctx, func(tx Tx) error {
		var err error
		id, err = tx.Meta(MetaDaemonID)
		return err
	})
	if err != nil {
		return "", err
	}
	if len(id) == 0 {
		return "", fmt.Errorf("state has no %s", MetaDaemonID)
	}
	return string(id), nil
}

// Valid reports whether s is one of the lifecycle states above.
func (s NodeState) Valid() bool {
	switch s {
	case NodeRequested, NodeProvisioning, NodeBooting, NodeJoined, NodeRunning,
		NodeDraining, NodeTerminating, NodeTerminated, NodeFailed:
		return true
	}
	return false
}
