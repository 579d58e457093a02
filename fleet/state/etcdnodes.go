package state

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdNodeCache holds the decoded node records of the fleets an Etcd store
// has read, so that a pass over 10,000 nodes does not range-read and
// JSON-decode every record again.
//
// It stays exact without trusting anything about leadership: every write
// to the prefix updates the commit key in the same etcd transaction (see
// Etcd), so the commit key's ModRevision at a snapshot names the whole
// state of the prefix. An entry says which commit it reflects (at); a
// reader whose snapshot has that commit uses it as is. A snapshot with a
// later commit (another server wrote, or this one's commit outcome was
// unknown) catches the entry up: one range of the fleet's keys changed
// since the entry's commit, and a count of its keys, which reveals
// deletions (then the fleet is read in full). Neither needs history, so a
// compaction changes nothing. This store's own commits move the entries
// they found current forward with their writes.
type etcdNodeCache struct {
	mu     sync.Mutex
	fleets map[string]*etcdFleetNodes // by bucket prefix (<prefix>nodes/<fleet>/)
}

// etcdFleetNodes is one fleet's entry. Its nodes are never modified, only
// replaced, and readers get copies.
type etcdFleetNodes struct {
	at    int64   // the commit key's ModRevision the nodes are the state of
	nodes []*Node // sorted by ID, as the keys are
	view  []Node  // nodes as one slice for shared readers, built on demand
}

// read returns a copy of e's nodes, or with shared its view (built on
// first use; the caller holds the cache's lock).
func (e *etcdFleetNodes) read(shared bool) []Node {
	if !shared {
		return copyNodes(e.nodes)
	}
	if e.view == nil {
		e.view = copyNodes(e.nodes)
	}
	return e.view
}

func newEtcdNodeCache() *etcdNodeCache {
	return &etcdNodeCache{fleets: map[string]*etcdFleetNodes{}}
}

// nodeCacher is a kv whose store keeps decoded nodes (Etcd); the bbolt
// store's cache is handled by tx itself (tx.cache).
type nodeCacher interface {
	// cachedNodes returns fleet's nodes at the transaction's snapshot,
	// ok=false when they must be read from the store; with shared, a
	// slice other readers get too, which the caller must not modify.
	cachedNodes(fleet string, shared bool) (nodes []Node, ok bool, err error)
	// fillNodes offers the nodes the transaction read from the store.
	fillNodes(fleet string, nodes []Node)
}

var _ nodeCacher = (*etcdKV)(nil)

// commitAt returns the commit key's ModRevision at k's snapshot (0 when the
// prefix was never committed to), fixing the snapshot if no read did yet.
func (k *etcdKV) commitAt() (int64, error) {
	if k.commitMod > 0 {
		return k.commitMod, nil
	}
	key := k.s.layout.commitKey()
	resp, err := k.s.cli.Get(k.ctx, key, k.revOpts()...)
	if err != nil {
		return 0, fmt.Errorf("etcd get %s: %w", key, err)
	}
	k.fix(resp.Header.Revision)
	if len(resp.Kvs) > 0 {
		k.commitMod = resp.Kvs[0].ModRevision
	}
	return k.commitMod, nil
}

// nodesCacheable reports whether the cache may stand for bucket bp in this
// transaction: not when it changed or cleared the bucket (reads then merge
// its own writes).
func (k *etcdKV) nodesCacheable(bp string) bool {
	return k.pending[bp] == nil && !k.isCleared(bp)
}

func (k *etcdKV) cachedNodes(fleet string, shared bool) ([]Node, bool, error) {
	c := k.s.nodes
	bp := k.s.layout.bucket(refNodes(fleet))
	if !k.nodesCacheable(bp) {
		return nil, false, nil
	}
	at, err := k.commitAt()
	if err != nil || at == 0 {
		return nil, false, err
	}
	c.mu.Lock()
	var e etcdFleetNodes
	cur := c.fleets[bp]
	found := cur != nil
	if found && cur.at == at {
		out := cur.read(shared)
		c.mu.Unlock()
		return out, true, nil
	}
	if found {
		e = etcdFleetNodes{at: cur.at, nodes: cur.nodes}
	}
	c.mu.Unlock()
	if !found || e.at > at {
		// Never read, or this snapshot predates the entry: read the store.
		return nil, false, nil
	}
	nodes, ok, err := k.catchUp(bp, e)
	if err != nil || !ok {
		return nil, false, err
	}
	caught := &etcdFleetNodes{at: at, nodes: nodes}
	c.store(bp, caught)
	c.mu.Lock()
	defer c.mu.Unlock()
	return caught.read(shared), true, nil
}

// catchUp returns e's nodes brought to k's snapshot, ok=false when a node
// was deleted since e's commit (the fleet is then read in full).
func (k *etcdKV) catchUp(bp string, e etcdFleetNodes) ([]*Node, bool, error) {
	end := clientv3.GetPrefixRangeEnd(bp)
	changed, err := k.s.cli.Get(k.ctx, bp, k.revOpts(clientv3.WithRange(end), clientv3.WithMinModRev(e.at+1))...)
	if err != nil {
		return nil, false, fmt.Errorf("etcd range %s: %w", bp, err)
	}
	count, err := k.s.cli.Get(k.ctx, bp, k.revOpts(clientv3.WithRange(end), clientv3.WithCountOnly())...)
	if err != nil {
		return nil, false, fmt.Errorf("etcd count %s: %w", bp, err)
	}
	puts := make(map[string]*Node, len(changed.Kvs))
	for _, kv := range changed.Kvs {
		id := string(kv.Key[len(bp):])
		var n Node
		if err := decode("node", id, kv.Value, &n); err != nil {
			return nil, false, err
		}
		puts[id] = &n
	}
	// Every key of the snapshot is in e or changed since, so the merge
	// holds all of them plus those deleted since: equal counts mean none.
	nodes := mergeNodes(e.nodes, false, puts)
	return nodes, int64(len(nodes)) == count.Count, nil
}

func (k *etcdKV) fillNodes(fleet string, nodes []Node) {
	bp := k.s.layout.bucket(refNodes(fleet))
	if !k.nodesCacheable(bp) {
		return
	}
	at, err := k.commitAt()
	if err != nil || at == 0 {
		return
	}
	ptrs := make([]*Node, len(nodes))
	for i := range nodes {
		n := nodes[i]
		ptrs[i] = &n
	}
	slices.SortFunc(ptrs, func(a, b *Node) int { return strings.Compare(a.ID, b.ID) })
	k.s.nodes.store(bp, &etcdFleetNodes{at: at, nodes: ptrs})
}

// store makes e the entry of bp unless the entry is of a later commit.
func (c *etcdNodeCache) store(bp string, e *etcdFleetNodes) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.fleets[bp]; old == nil || old.at <= e.at {
		c.fleets[bp] = e
	}
}

// committed moves the entries that were current at commit prev (the state
// k's transaction applied its writes to) to rev, the revision of its
// commit, with k's node writes applied. Entries of other commits stay;
// their next reader catches them up.
func (c *etcdNodeCache) committed(prev, rev int64, k *etcdKV) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k.cleared {
		clear(c.fleets)
		return
	}
	for bp, e := range c.fleets {
		if e.at != prev {
			continue
		}
		p := k.pending[bp]
		if p == nil {
			c.fleets[bp] = &etcdFleetNodes{at: rev, nodes: e.nodes, view: e.view}
			continue
		}
		puts := make(map[string]*Node, len(p.puts))
		for key, v := range p.puts {
			id := key[len(bp):]
			if v == nil {
				puts[id] = nil
				continue
			}
			var n Node
			if err := json.Unmarshal(v, &n); err != nil {
				delete(c.fleets, bp) // not a node: the next reader reads the store
				puts = nil
				break
			}
			puts[id] = &n
		}
		if puts != nil {
			c.fleets[bp] = &etcdFleetNodes{at: rev, nodes: mergeNodes(e.nodes, p.dropped, puts)}
		}
	}
}

func copyNodes(nodes []*Node) []Node {
	out := make([]Node, len(nodes))
	for i, n := range nodes {
		out[i] = *n
	}
	return out
}

// mergeNodes returns nodes (sorted by ID; none if dropped) with puts
// applied by ID (nil: deleted), as a new slice.
func mergeNodes(nodes []*Node, dropped bool, puts map[string]*Node) []*Node {
	if dropped {
		nodes = nil
	}
	e := &fleetNodes{nodes: slices.Clone(nodes)}
	if e.nodes == nil {
		e.nodes = []*Node{}
	}
	e.apply(puts)
	return e.nodes
}
