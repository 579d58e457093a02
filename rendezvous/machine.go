package rendezvous

import (
	"container/list"
	"fmt"
	"sort"
	"time"
)

// Effects is what a mutation of a Machine did.
type Effects struct {
	// Changed: some node's View may have changed; wake the watchers.
	Changed bool
	// Persist: durable state changed (round number or state, exclusions,
	// config, finish); save a Snapshot before announcing it.
	Persist bool
	// Events for the event log, in order.
	Events []Event
}

func (e *Effects) event(ev Event) { e.Events = append(e.Events, ev) }

// Exclusion records a node that may not rejoin (it is draining).
type Exclusion struct {
	NodeID string    `json:"node_id"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
	// Deadline is when the node goes away (its notice's), if known.
	Deadline time.Time `json:"deadline,omitzero"`
}

type member struct {
	JoinRequest
	seq      uint64 // join order; ties in rank formation are broken by it
	joinedAt time.Time
	standby  bool // false: participant of the current round (open or closed)
	lastSeen time.Time
	elem     *list.Element // in Machine.lru

	// Last worker report (not persisted: only for status).
	workerRound int
	step        *int64
	workers     string
	reportedAt  time.Time
	// progress is the last progress report (kept until a newer one),
	// progressAt when it came.
	progress   *Progress
	progressAt time.Time
}

// Machine is one fleet's rendezvous round state machine. It is pure: no
// goroutines, no I/O, no clock of its own; every method takes the time.
// It is not safe for concurrent use (the Service serialises calls).
//
// Rounds are numbered 1, 2, 3, …. A round is open (collecting) until it
// closes (assigned); a closed round never changes: any membership change
// starts a new round number.
type Machine struct {
	cfg   Config
	runID string

	round      int
	state      RoundState
	success    bool
	openedAt   time.Time
	closedAt   time.Time
	finishedAt time.Time
	deadline   time.Time // open round: last call ends (zero until MinNodes joined)
	standbyAt  time.Time // closed round: standbys are merged in (zero if none waiting)

	members map[string]*member
	// lru orders members by last heartbeat, oldest first, so the next
	// expiry is O(1) and a heartbeat is an O(1) move to the back.
	lru      *list.List
	nPart    int
	nStandby int
	seq      uint64

	// The last closed round (the current one when state is closed): node
	// ids in group-rank order. While a round is open it keeps the previous
	// order so survivors keep their relative ranks.
	order      []string
	rankOf     map[string]int
	offsets    []int // offsets[g] = RANK of local rank 0 of group rank g; len = nodes+1
	masterAddr string
	masterPort int
	summary    MembersSummary
	// listening: the closed round's master reported its store up;
	// listened: some round's master did (soft state, not persisted).
	listening, listened bool

	excluded map[string]Exclusion
	// noticeRound is the round that replaced a running round because a
	// node was excluded (noticeReason says which); its views carry
	// CauseNotice.
	noticeRound  int
	noticeReason string
	// noticeDeadline is when the excluded node of noticeRound goes away,
	// if its notice said.
	noticeDeadline time.Time
}

// NewMachine starts a fleet's rendezvous with round 1 open.
func NewMachine(cfg Config, runID string, now time.Time) (*Machine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := newEmpty(cfg, runID)
	m.round, m.state, m.openedAt = 1, RoundOpen, now
	return m, nil
}

func newEmpty(cfg Config, runID string) *Machine {
	return &Machine{
		cfg:      cfg,
		runID:    runID,
		members:  make(map[string]*member),
		lru:      list.New(),
		rankOf:   make(map[string]int),
		excluded: make(map[string]Exclusion),
	}
}

// Config returns the machine's configuration.
func (m *Machine) Config() Config { return m.cfg }

// Round returns the current round number and its state.
func (m *Machine) Round() (int, RoundState) { return m.round, m.state }

// Next returns when the machine next needs Tick: the earliest of the last
// call, the standby batch and the oldest member's heartbeat expiry. Zero
// means no timer is needed. It is O(1).
func (m *Machine) Next(now time.Time) time.Time {
	if m.state == RoundFinished {
		return time.Time{}
	}
	var t time.Time
	earliest := func(c time.Time) {
		if !c.IsZero() && (t.IsZero() || c.Before(t)) {
			t = c
		}
	}
	if m.state == RoundOpen {
		earliest(m.deadline)
	} else {
		earliest(m.standbyAt)
	}
	if f := m.lru.Front(); f != nil {
		earliest(f.Value.(*member).lastSeen.Add(m.cfg.DeadAfter))
	}
	if !t.IsZero() && t.Before(now) {
		return now
	}
	return t
}

// Tick drops silent members and fires due deadlines.
func (m *Machine) Tick(now time.Time) Effects {
	var eff Effects
	if m.state == RoundFinished {
		return eff
	}
	lost := 0
	for e := m.lru.Front(); e != nil; {
		mb := e.Value.(*member)
		if now.Before(mb.lastSeen.Add(m.cfg.DeadAfter)) {
			break // the rest heartbeated later
		}
		e = e.Next()
		eff.event(Event{Kind: EventMemberDropped, At: now, Round: m.round, Node: mb.NodeID, Duration: now.Sub(mb.lastSeen)})
		if m.remove(mb, &eff) {
			lost++
		}
	}
	if lost > 0 {
		m.reform(now, fmt.Sprintf("%d node(s) of round %d stopped heartbeating", lost, m.round), &eff)
	}
	m.settle(now, &eff)
	return eff
}

// Join adds a node, or refreshes it when it is already a member. Excluded
// nodes and finished fleets get the corresponding view and change nothing.
func (m *Machine) Join(now time.Time, req JoinRequest) (View, Effects, error) {
	var eff Effects
	if err := req.Validate(); err != nil {
		return View{}, eff, err
	}
	if m.state == RoundFinished {
		return m.View(req.NodeID), eff, nil
	}
	if _, ok := m.excluded[req.NodeID]; ok {
		return m.View(req.NodeID), eff, nil
	}
	if mb := m.members[req.NodeID]; mb != nil {
		restarted := req.Session != mb.Session && req.Session != ""
		moved := req.Addr != mb.Addr || req.Nproc != mb.Nproc
		m.touch(mb, now)
		if req.Session == "" {
			req.Session = mb.Session
		}
		mb.JoinRequest = req
		// A node of the running round whose agent restarted (or whose
		// address or size changed) has no workers in that round any more:
		// the others must restart with it, at once.
		if !mb.standby && m.state == RoundClosed && (restarted || moved) {
			eff.event(Event{Kind: EventMemberRejoined, At: now, Round: m.round, Node: mb.NodeID})
			m.reform(now, fmt.Sprintf("node %s restarted", mb.NodeID), &eff)
		}
		m.settle(now, &eff)
		return m.View(req.NodeID), eff, nil
	}
	m.seq++
	mb := &member{JoinRequest: req, seq: m.seq, joinedAt: now, lastSeen: now}
	mb.standby = m.state == RoundClosed || m.nPart >= m.cfg.MaxNodes
	m.add(mb)
	how := "participant"
	if mb.standby {
		how = "standby"
	}
	eff.event(Event{Kind: EventMemberJoined, At: now, Round: m.round, Node: req.NodeID, Reason: how})
	m.settle(now, &eff)
	return m.View(req.NodeID), eff, nil
}

// Heartbeat keeps a member alive and records its worker report. It is
// O(1), allocates nothing and never changes the assignment.
func (m *Machine) Heartbeat(now time.Time, req HeartbeatRequest) (HeartbeatResponse, error) {
	if err := req.Validate(); err != nil {
		return HeartbeatResponse{}, err
	}
	if mb := m.members[req.NodeID]; mb != nil && m.state != RoundFinished {
		m.touch(mb, now)
		mb.workerRound, mb.step, mb.workers, mb.reportedAt = req.Round, req.Step, req.Workers, now
		if req.Progress != nil {
			mb.progress, mb.progressAt = req.Progress, now
		}
	}
	v := m.view(req.NodeID, false)
	return HeartbeatResponse{Round: v.Round, RoundState: v.RoundState, State: v.State, HeartbeatMS: v.HeartbeatMS}, nil
}

// MasterListening records the master node's report that a worker of
// round listens on MASTER_PORT. Until then a new round's other workers
// would find the port closed, and torch < 2.4's TCPStore client retries a
// refused connect only once a second; agents that learn the store is up
// start them then instead. O(1); a stale or foreign report is ignored.
func (m *Machine) MasterListening(node string, round int) Effects {
	var eff Effects
	if m.state != RoundClosed || round != m.round || m.listening || len(m.order) == 0 || m.order[0] != node {
		return eff
	}
	m.listening, m.listened = true, true
	eff.Changed = true
	return eff
}

// Leave removes a node gracefully; like a drop, a running round is
// re-formed at once without it.
func (m *Machine) Leave(now time.Time, node string) Effects {
	var eff Effects
	mb := m.members[node]
	if mb == nil || m.state == RoundFinished {
		return eff
	}
	eff.event(Event{Kind: EventMemberLeft, At: now, Round: m.round, Node: node})
	if m.remove(mb, &eff) {
		m.reform(now, fmt.Sprintf("node %s left", node), &eff)
	}
	m.settle(now, &eff)
	return eff
}

// Exclude removes a node immediately (it has an interruption notice) and
// bars it from rejoining while it drains. It may be called for a node that
// is not (or not yet) a member.
func (m *Machine) Exclude(now time.Time, node, reason string) Effects {
	return m.ExcludeUntil(now, node, reason, time.Time{})
}

// ExcludeUntil is Exclude for a node whose notice names when it goes away:
// the views of the round that replaces its running round carry the
// deadline (View.NoticeDeadline), so every node's workers can bound their
// checkpoint by it.
func (m *Machine) ExcludeUntil(now time.Time, node, reason string, deadline time.Time) Effects {
	var eff Effects
	if m.state == RoundFinished {
		return eff
	}
	if _, ok := m.excluded[node]; ok {
		return eff
	}
	m.excluded[node] = Exclusion{NodeID: node, Reason: reason, At: now, Deadline: deadline}
	eff.Changed, eff.Persist = true, true
	eff.event(Event{Kind: EventMemberExcluded, At: now, Round: m.round, Node: node, Reason: reason})
	if mb := m.members[node]; mb != nil && m.remove(mb, &eff) {
		why := fmt.Sprintf("node %s excluded: %s", node, reason)
		m.reform(now, why, &eff)
		m.noticeRound, m.noticeReason, m.noticeDeadline = m.round, why, deadline
	}
	m.settle(now, &eff)
	return eff
}

// Finish ends the job: a final state. The first outcome sticks.
func (m *Machine) Finish(now time.Time, success bool) Effects {
	var eff Effects
	if m.state == RoundFinished {
		return eff
	}
	m.state, m.success, m.finishedAt = RoundFinished, success, now
	m.deadline, m.standbyAt = time.Time{}, time.Time{}
	eff.Changed, eff.Persist = true, true
	outcome := "failure"
	if success {
		outcome = "success"
	}
	eff.event(Event{Kind: EventFinished, At: now, Round: m.round, Reason: outcome})
	return eff
}

// Configure changes the fleet's configuration. A running round too large
// for a lowered MaxNodes is re-formed; other changes apply from the next
// decision on (a closed round keeps its master port).
func (m *Machine) Configure(now time.Time, cfg Config) (Effects, error) {
	var eff Effects
	if err := cfg.Validate(); err != nil {
		return eff, err
	}
	if cfg == m.cfg {
		return eff, nil
	}
	m.cfg = cfg
	eff.Changed, eff.Persist = true, true // views carry the heartbeat interval
	if m.state == RoundClosed && m.nPart > cfg.MaxNodes {
		m.reform(now, fmt.Sprintf("max_nodes lowered to %d", cfg.MaxNodes), &eff)
	}
	m.settle(now, &eff)
	return eff, nil
}

// touch records a sign of life. Times never go backwards in the lru, so it
// stays sorted even if a caller's clock does.
func (m *Machine) touch(mb *member, now time.Time) {
	if b := m.lru.Back(); b != nil {
		if last := b.Value.(*member).lastSeen; now.Before(last) {
			now = last
		}
	}
	mb.lastSeen = now
	m.lru.MoveToBack(mb.elem)
}

func (m *Machine) add(mb *member) {
	m.members[mb.NodeID] = mb
	mb.elem = m.lru.PushBack(mb)
	if mb.standby {
		m.nStandby++
	} else {
		m.nPart++
	}
}

// remove forgets a member and reports whether it was assigned in the
// running (closed) round, which then has to be re-formed.
func (m *Machine) remove(mb *member, eff *Effects) bool {
	m.lru.Remove(mb.elem)
	delete(m.members, mb.NodeID)
	eff.Changed = true // the node's own view is now unknown
	if mb.standby {
		m.nStandby--
		return false
	}
	m.nPart--
	return m.state == RoundClosed
}

// settle applies the closing rules after any change.
func (m *Machine) settle(now time.Time, eff *Effects) {
	switch m.state {
	case RoundOpen:
		m.promote()
		switch {
		case m.nPart >= m.cfg.MaxNodes:
			m.close(now, eff)
		case m.nPart >= m.cfg.MinNodes:
			if m.deadline.IsZero() { // later joins do not extend the last call
				m.deadline = now.Add(m.cfg.LastCall)
			}
			if !now.Before(m.deadline) {
				m.close(now, eff)
			}
		default:
			m.deadline = time.Time{}
		}
	case RoundClosed:
		if m.nStandby == 0 || m.nPart >= m.cfg.MaxNodes {
			m.standbyAt = time.Time{}
			return
		}
		if m.standbyAt.IsZero() { // batch the joiners of the next LastCall
			m.standbyAt = now.Add(m.cfg.LastCall)
		}
		// Standbys that fill the job to MaxNodes are merged at once, as an
		// open round closes at MaxNodes: nobody else can join, so waiting
		// would only delay the restart everyone must make anyway.
		if !now.Before(m.standbyAt) || m.nPart+m.nStandby >= m.cfg.MaxNodes {
			m.reform(now, fmt.Sprintf("%d standby node(s) joining", m.nStandby), eff)
		}
	}
}

// promote moves standbys, oldest first, into the open round while there
// is room.
func (m *Machine) promote() {
	if m.nStandby == 0 || m.nPart >= m.cfg.MaxNodes {
		return
	}
	var sb []*member
	for _, mb := range m.members {
		if mb.standby {
			sb = append(sb, mb)
		}
	}
	sort.Slice(sb, func(i, j int) bool { return sb[i].seq < sb[j].seq })
	for _, mb := range sb {
		if m.nPart >= m.cfg.MaxNodes {
			break
		}
		mb.standby = false
		m.nStandby--
		m.nPart++
	}
}

// reform replaces the running round by a new one with every live member
// (standbys included, up to MaxNodes). The survivors must restart anyway,
// so with at least MinNodes it closes at once: no last call.
func (m *Machine) reform(now time.Time, reason string, eff *Effects) {
	m.round++
	m.state, m.openedAt, m.closedAt = RoundOpen, now, time.Time{}
	m.deadline, m.standbyAt = time.Time{}, time.Time{}
	eff.Changed, eff.Persist = true, true
	eff.event(Event{Kind: EventRoundOpened, At: now, Round: m.round, Reason: reason})
	m.promote()
	if m.nPart >= m.cfg.MinNodes {
		m.close(now, eff)
	}
}

// close assigns ranks to the participants and closes the round.
func (m *Machine) close(now time.Time, eff *Effects) {
	parts := make([]*member, 0, m.nPart)
	for _, mb := range m.members {
		if !mb.standby {
			parts = append(parts, mb)
		}
	}
	order := m.rankOrder(parts)
	if len(order) > m.cfg.MaxNodes { // only after MaxNodes was lowered
		for _, mb := range order[m.cfg.MaxNodes:] {
			mb.standby = true
			m.nPart--
			m.nStandby++
		}
		order = order[:m.cfg.MaxNodes]
	}
	m.assign(order, RoundPort(m.cfg.MasterPort, m.round))
	m.state, m.closedAt, m.deadline, m.standbyAt = RoundClosed, now, time.Time{}, time.Time{}
	eff.Changed, eff.Persist = true, true
	eff.event(Event{Kind: EventRoundClosed, At: now, Round: m.round, Nodes: len(order),
		WorldSize: m.offsets[len(order)], Duration: now.Sub(m.openedAt)})
}

// rankOrder orders a round's nodes. Survivors of the previous closed round
// come first in their previous relative order, so ranks stay stable (rank
// 0, the usual checkpoint writer and MASTER_ADDR, stays put) and are
// compacted. Newcomers follow, grouped by zone: the last survivor's zone
// first (extending its block), then zones by first join. Without
// survivors this groups the whole round by zone.
func (m *Machine) rankOrder(parts []*member) []*member {
	prev := make(map[string]int, len(m.order))
	for i, id := range m.order {
		prev[id] = i
	}
	var survivors, newcomers []*member
	for _, mb := range parts {
		if _, ok := prev[mb.NodeID]; ok {
			survivors = append(survivors, mb)
		} else {
			newcomers = append(newcomers, mb)
		}
	}
	sort.Slice(survivors, func(i, j int) bool { return prev[survivors[i].NodeID] < prev[survivors[j].NodeID] })
	sort.Slice(newcomers, func(i, j int) bool { return newcomers[i].seq < newcomers[j].seq })
	zoneRank := make(map[string]int)
	if len(survivors) > 0 {
		zoneRank[survivors[len(survivors)-1].Zone] = 0
	}
	for _, mb := range newcomers {
		if _, ok := zoneRank[mb.Zone]; !ok {
			zoneRank[mb.Zone] = len(zoneRank)
		}
	}
	sort.SliceStable(newcomers, func(i, j int) bool { return zoneRank[newcomers[i].Zone] < zoneRank[newcomers[j].Zone] })
	return append(survivors, newcomers...)
}

// assign records a closed round's ranks: O(nodes).
func (m *Machine) assign(order []*member, port int) {
	m.order = make([]string, len(order))
	m.rankOf = make(map[string]int, len(order))
	m.offsets = make([]int, len(order)+1)
	m.summary = MembersSummary{Nodes: len(order)}
	zoneIdx := make(map[string]int)
	for g, mb := range order {
		m.order[g] = mb.NodeID
		m.rankOf[mb.NodeID] = g
		m.offsets[g+1] = m.offsets[g] + mb.Nproc
		i, ok := zoneIdx[mb.Zone]
		if !ok {
			i = len(m.summary.Zones)
			zoneIdx[mb.Zone] = i
			m.summary.Zones = append(m.summary.Zones, ZoneCount{Zone: mb.Zone})
		}
		m.summary.Zones[i].Nodes++
	}
	m.masterAddr, m.masterPort, m.listening = "", port, false
	if len(order) > 0 {
		m.masterAddr = order[0].Addr
	}
}

// View is the node's view of the rendezvous. O(1).
func (m *Machine) View(node string) View { return m.view(node, true) }

func (m *Machine) view(node string, withAssignment bool) View {
	v := View{Round: m.round, RoundState: m.state, HeartbeatMS: m.cfg.Heartbeat.Milliseconds()}
	if m.state == RoundFinished {
		v.State, v.Success = NodeFinished, m.success
		return v
	}
	if ex, ok := m.excluded[node]; ok {
		v.State, v.Reason, v.NoticeDeadline = NodeExcluded, ex.Reason, ex.Deadline
		return v
	}
	mb := m.members[node]
	switch {
	case mb == nil:
		v.State = NodeUnknown
	case mb.standby:
		v.State = NodeStandby
	case m.state == RoundOpen:
		v.State = NodeWaiting
	default:
		v.State = NodeAssigned
		v.MasterListening, v.MasterListens = m.listening, m.listened
		if withAssignment {
			v.Assignment = m.assignment(node)
		}
	}
	if (v.State == NodeWaiting || v.State == NodeAssigned) && m.noticeRound == m.round {
		v.Cause, v.Reason, v.NoticeDeadline = CauseNotice, m.noticeReason, m.noticeDeadline
	}
	return v
}

func (m *Machine) assignment(node string) *Assignment {
	g := m.rankOf[node]
	n := len(m.order)
	return &Assignment{
		Round:          m.round,
		RunID:          m.runID,
		GroupRank:      g,
		GroupWorldSize: n,
		RankOffset:     m.offsets[g],
		LocalWorldSize: m.offsets[g+1] - m.offsets[g],
		WorldSize:      m.offsets[n],
		MasterAddr:     m.masterAddr,
		MasterPort:     m.masterPort,
		Members:        m.summary,
	}
}
