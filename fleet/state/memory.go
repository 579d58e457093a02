package state

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"time"
)

// Memory is a Store held in memory, for tests and `fleetd sim`. It shares the
// typed transaction code with BoltStore and stores the same JSON, so it has
// the same semantics: snapshot reads, one writer at a time, all-or-nothing
// commits, the same validation and errors. It is not durable.
type Memory struct {
	now func() time.Time

	writeMu sync.Mutex   // held for a whole Update: one writer, like bbolt
	mu      sync.RWMutex // guards buckets and closed; held by View and by commit
	buckets map[string]*memBucket
	closed  bool
}

var _ Store = (*Memory)(nil)

type memBucket struct {
	keys []string // sorted, for ordered scans
	vals map[string][]byte
	seq  uint64
}

// NewMemory returns an empty in-memory store using the wall clock.
func NewMemory() *Memory { return NewMemoryWithClock(time.Now) }

// NewMemoryWithClock returns an empty in-memory store whose timestamps come
// from now (e.g. a virtual clock in `fleetd sim`).
func NewMemoryWithClock(now func() time.Time) *Memory {
	m := &Memory{now: now, buckets: map[string]*memBucket{}}
	k := &memKV{m: m, write: true}
	if err := initMeta(k, SchemaVersion, now()); err != nil {
		// initMeta only fails if the system random source does.
		panic(err)
	}
	k.commit()
	return m
}

// View runs fn on a consistent snapshot; commits wait until it returns.
func (m *Memory) View(ctx context.Context, fn func(Tx) error) error {
	return m.rawView(ctx, func(k kv) error { return runTx(k, m.now, fn) })
}

// Update runs fn with writes buffered in the transaction and applies them
// all at once if fn returns nil. A panic in fn discards them.
func (m *Memory) Update(ctx context.Context, fn func(Tx) error) error {
	return m.rawUpdate(ctx, func(k kv) error { return runTx(k, m.now, fn) })
}

// Events returns up to limit events with Seq > since in Seq order; limit <= 0
// means no limit.
func (m *Memory) Events(ctx context.Context, since uint64, limit int) ([]Event, error) {
	var out []Event
	err := m.View(ctx, func(Tx) error {
		var err error
		out, err = readEvents(&memKV{m: m}, since, limit)
		return err
	})
	return out, err
}

// AppendEvents appends events in one transaction, like BoltStore.AppendEvents.
func (m *Memory) AppendEvents(ctx context.Context, events []Event) ([]Event, error) {
	return updateAppend(ctx, m.Update, events)
}

// Close makes every later call fail with ErrClosed. Closing twice is a no-op.
func (m *Memory) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	return nil
}

// memKV is kv over Memory. Writes go to pending and are applied by commit.
type memKV struct {
	m       *Memory
	write   bool
	pending map[string]*memPending
}

// memPending is one bucket's uncommitted changes.
type memPending struct {
	dropped bool              // the bucket was deleted: ignore the base
	puts    map[string][]byte // nil value: deleted
	seq     uint64
	seqSet  bool
}

func bucketName(b bucketRef) string {
	if b.sub == "" {
		return string(b.top)
	}
	return string(b.top) + "\x00" + b.sub // NUL never occurs in top-level names
}

func (k *memKV) writable() bool { return k.write }

func (k *memKV) pend(b bucketRef) *memPending {
	if k.pending == nil {
		k.pending = map[string]*memPending{}
	}
	name := bucketName(b)
	p := k.pending[name]
	if p == nil {
		p = &memPending{puts: map[string][]byte{}}
		k.pending[name] = p
	}
	return p
}

// base returns the committed bucket unless this transaction dropped it.
func (k *memKV) base(name string) *memBucket {
	if p := k.pending[name]; p != nil && p.dropped {
		return nil
	}
	return k.m.buckets[name]
}

func (k *memKV) get(b bucketRef, key string) ([]byte, error) {
	name := bucketName(b)
	if p := k.pending[name]; p != nil {
		if v, ok := p.puts[key]; ok {
			return v, nil
		}
	}
	if mb := k.base(name); mb != nil {
		return mb.vals[key], nil
	}
	return nil, nil
}

func (k *memKV) put(b bucketRef, key string, value []byte) error {
	if value == nil {
		value = []byte{}
	}
	k.pend(b).puts[key] = bytes.Clone(value)
	return nil
}

func (k *memKV) del(b bucketRef, key string) error {
	k.pend(b).puts[key] = nil
	return nil
}

func (k *memKV) scan(b bucketRef, start string, fn func(string, []byte) (bool, error)) error {
	name := bucketName(b)
	var keys []string
	var vals, puts map[string][]byte
	if mb := k.base(name); mb != nil {
		keys, vals = mb.keys, mb.vals
	}
	if p := k.pending[name]; p != nil {
		puts = p.puts
	}
	return mergeScan(keys, vals, puts, start, fn)
}

func (k *memKV) nextSeq(b bucketRef) (uint64, error) {
	name := bucketName(b)
	p := k.pend(b)
	if !p.seqSet {
		if mb := k.base(name); mb != nil {
			p.seq = mb.seq
		}
		p.seqSet = true
	}
	p.seq++
	return p.seq, nil
}

func (k *memKV) dropBucket(b bucketRef) error {
	p := k.pend(b)
	*p = memPending{dropped: true, puts: map[string][]byte{}}
	return nil
}

// commit applies the pending changes under the write lock.
func (k *memKV) commit() {
	if len(k.pending) == 0 {
		return
	}
	m := k.m
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, p := range k.pending {
		if p.dropped {
			delete(m.buckets, name)
		}
		mb := m.buckets[name]
		if mb == nil {
			if len(p.puts) == 0 && !p.seqSet {
				continue // nothing to (re)create
			}
			mb = &memBucket{vals: map[string][]byte{}}
			m.buckets[name] = mb
		}
		if p.seqSet {
			mb.seq = p.seq
		}
		for key, v := range p.puts {
			i, found := slices.BinarySearch(mb.keys, key)
			switch {
			case v == nil && found:
				mb.keys = slices.Delete(mb.keys, i, i+1)
				delete(mb.vals, key)
			case v != nil && !found:
				mb.keys = slices.Insert(mb.keys, i, key)
				mb.vals[key] = v
			case v != nil:
				mb.vals[key] = v
			}
		}
	}
}
