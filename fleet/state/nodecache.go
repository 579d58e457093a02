package state

import (
	"slices"
	"strings"
	"sync"
)

// nodeCache holds the decoded node records of the fleets a BoltStore has
// read, so that a reconcile pass over 10,000 nodes copies structs instead
// of JSON-decoding every record again. It can be exact because the process
// holding the file lock is the file's only writer and every node write goes
// through tx: an Update's node writes reach the cache only after bbolt has
// committed them, and are dropped on rollback.
//
// bbolt readers see the snapshot of the commit they started after (their
// txid), and may run while a writer commits. A fleet's entry therefore says
// which commit it reflects: a reader at txid R uses it only if that commit
// is ≤ R and no Update touching the fleet is under way; otherwise the
// reader decodes the file as before. Updates are serialised by
// BoltStore.writeMu up to the end of their cache update, so the entry is
// always the latest committed state or marked as being written.
type nodeCache struct {
	mu     sync.Mutex
	fleets map[string]*fleetNodes
}

// fleetNodes is one fleet's entry.
type fleetNodes struct {
	// nodes, sorted by id like bbolt's keys, once loaded: a read copies
	// them, a lookup is a binary search, and inserting or deleting a node
	// moves pointers only. A cached Node is never modified, only replaced.
	nodes []*Node
	// view is nodes as one slice, built by the first shared read after a
	// change and handed to every shared reader until the next one.
	view   []Node
	loaded bool
	// changed is the txid of the last commit that changed the fleet's
	// nodes (0: none since the store was opened).
	changed int
	// writing: an Update has changed the fleet's nodes and has not
	// finished; readers must use the file.
	writing bool
}

func (e *fleetNodes) find(id string) (int, bool) {
	return slices.BinarySearchFunc(e.nodes, id, func(n *Node, id string) int { return strings.Compare(n.ID, id) })
}

// nodeWrites are one Update's changes to one fleet's nodes, in the form a
// later read returns them.
type nodeWrites struct {
	dropped bool             // the fleet's nodes were all deleted first (DeleteFleet)
	puts    map[string]*Node // nil: deleted
}

func newNodeCache() *nodeCache { return &nodeCache{fleets: map[string]*fleetNodes{}} }

// entry returns fleet's entry, creating an empty one; c.mu is held.
func (c *nodeCache) entry(fleet string) *fleetNodes {
	e := c.fleets[fleet]
	if e == nil {
		e = &fleetNodes{}
		c.fleets[fleet] = e
	}
	return e
}

// usable reports whether a transaction at txid may read e instead of the
// file. An Update (writer) may: it holds writeMu, so writing is its own
// flag and its own changes are overlaid by the caller.
func (e *fleetNodes) usable(txid int, writer bool) bool {
	return e != nil && e.loaded && e.changed <= txid && (writer || !e.writing)
}

// list returns fleet's nodes in id order, or ok=false when the transaction
// must read the file: a copy, or with shared the entry's view, which the
// caller must not modify.
func (c *nodeCache) list(fleet string, txid int, writer, shared bool) (out []Node, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.fleets[fleet]
	if !e.usable(txid, writer) {
		return nil, false
	}
	if !shared {
		return copyNodes(e.nodes), true
	}
	if e.view == nil {
		e.view = copyNodes(e.nodes)
	}
	return e.view, true
}

// get returns one node (found=false: no such node), or ok=false when the
// transaction must read the file.
func (c *nodeCache) get(fleet, id string, txid int, writer bool) (n Node, found, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.fleets[fleet]
	if !e.usable(txid, writer) {
		return Node{}, false, false
	}
	if i, found := e.find(id); found {
		return *e.nodes[i], true, true
	}
	return Node{}, false, true
}

// fill stores the nodes a reader at txid decoded from the file, if they
// are still the latest committed state and the fleet is not loaded yet.
func (c *nodeCache) fill(fleet string, txid int, nodes []Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entry(fleet)
	if e.loaded || e.writing || e.changed > txid {
		return
	}
	e.nodes, e.view, e.loaded = make([]*Node, len(nodes)), nil, true
	for i := range nodes {
		n := nodes[i]
		e.nodes[i] = &n
	}
	// In key order already (a scan); sorting keeps find correct regardless.
	slices.SortFunc(e.nodes, func(a, b *Node) int { return strings.Compare(a.ID, b.ID) })
}

// begin marks fleet as being written by the running Update.
func (c *nodeCache) begin(fleet string) {
	c.mu.Lock()
	c.entry(fleet).writing = true
	c.mu.Unlock()
}

// commit applies an Update's node writes after bbolt committed them as
// transaction txid.
func (c *nodeCache) commit(txid int, writes map[string]*nodeWrites) {
	if len(writes) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for fleet, w := range writes {
		e := c.entry(fleet)
		e.writing, e.changed, e.view = false, txid, nil
		if w.dropped {
			// Every node of the fleet is now in w.puts: the entry is
			// complete even if it was never loaded.
			e.nodes, e.loaded = []*Node{}, true
		}
		if !e.loaded {
			continue // the next reader loads the new state
		}
		e.apply(w.puts)
	}
}

// apply replaces nodes in place and merges insertions and deletions in one
// pass: a transaction adding thousands of nodes must not move the slice
// once per node.
func (e *fleetNodes) apply(puts map[string]*Node) {
	var ins []*Node
	var del map[string]bool
	for id, n := range puts {
		i, found := e.find(id)
		switch {
		case n == nil && found:
			if del == nil {
				del = map[string]bool{}
			}
			del[id] = true
		case n != nil && !found:
			ins = append(ins, n)
		case n != nil:
			e.nodes[i] = n
		}
	}
	switch {
	case len(ins) == 0 && len(del) == 0:
	case len(ins) == 1 && len(del) == 0: // a launch: one node, in place
		i, _ := e.find(ins[0].ID)
		e.nodes = slices.Insert(e.nodes, i, ins[0])
	default:
		slices.SortFunc(ins, func(a, b *Node) int { return strings.Compare(a.ID, b.ID) })
		merged := make([]*Node, 0, len(e.nodes)+len(ins)-len(del))
		j := 0
		for _, n := range e.nodes {
			for j < len(ins) && ins[j].ID < n.ID {
				merged = append(merged, ins[j])
				j++
			}
			if !del[n.ID] {
				merged = append(merged, n)
			}
		}
		e.nodes = append(merged, ins[j:]...)
	}
}

// abort forgets the writes of an Update that rolled back: the committed
// state, and the entries, are unchanged.
func (c *nodeCache) abort(writes map[string]*nodeWrites) {
	if len(writes) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for fleet := range writes {
		c.entry(fleet).writing = false
	}
}

// invalidate handles an Update whose commit failed after its function
// succeeded: whether the file holds its writes is unknown, so the touched
// fleets are reloaded from the file by a reader that starts later.
func (c *nodeCache) invalidate(txid int, writes map[string]*nodeWrites) {
	if len(writes) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for fleet := range writes {
		e := c.entry(fleet)
		e.nodes, e.view, e.loaded, e.writing = nil, nil, false, false
		e.changed = max(e.changed, txid)
	}
}
