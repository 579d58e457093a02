package rendezvous

import (
	"fmt"
	"sort"
	"time"
)

// SnapshotVersion is the current Snapshot layout.
const SnapshotVersion = 1

// Snapshot is a fleet's durable rendezvous state, JSON-serialisable.
// Heartbeat times and worker reports are not in it: after a restore every
// member gets a fresh DeadAfter of grace instead of being dropped for the
// daemon's downtime.
type Snapshot struct {
	Version int    `json:"version"`
	Config  Config `json:"config"`
	RunID   string `json:"run_id"`
	RoundInfo
	Deadline  time.Time `json:"deadline,omitzero"`
	StandbyAt time.Time `json:"standby_at,omitzero"`
	Seq       uint64    `json:"seq"`
	// Order is the last closed round's node ids in group-rank order.
	Order      []string         `json:"order,omitempty"`
	MasterPort int              `json:"master_port,omitempty"`
	Members    []SnapshotMember `json:"members,omitempty"`  // by join order
	Excluded   []Exclusion      `json:"excluded,omitempty"` // by node id
	// NoticeRound replaced a running round because a node was excluded
	// (NoticeReason); its views carry CauseNotice.
	NoticeRound  int    `json:"notice_round,omitempty"`
	NoticeReason string `json:"notice_reason,omitempty"`
	// NoticeDeadline is when that round's excluded node goes away, if known.
	NoticeDeadline time.Time `json:"notice_deadline,omitzero"`
}

// SnapshotMember is a member in a Snapshot.
type SnapshotMember struct {
	JoinRequest
	Seq      uint64    `json:"seq"`
	JoinedAt time.Time `json:"joined_at"`
	Standby  bool      `json:"standby,omitempty"`
}

// Snapshot captures the machine's durable state. O(members).
func (m *Machine) Snapshot() Snapshot {
	s := Snapshot{
		Version: SnapshotVersion, Config: m.cfg, RunID: m.runID, RoundInfo: m.roundInfo(),
		Deadline: utc(m.deadline), StandbyAt: utc(m.standbyAt), Seq: m.seq,
		NoticeRound: m.noticeRound, NoticeReason: m.noticeReason, NoticeDeadline: utc(m.noticeDeadline),
	}
	s.OpenedAt, s.ClosedAt, s.FinishedAt = utc(s.OpenedAt), utc(s.ClosedAt), utc(s.FinishedAt)
	if len(m.order) > 0 {
		s.Order = append([]string(nil), m.order...)
		s.MasterPort = m.masterPort
	}
	for _, mb := range m.members {
		s.Members = append(s.Members, SnapshotMember{JoinRequest: mb.JoinRequest, Seq: mb.seq, JoinedAt: utc(mb.joinedAt), Standby: mb.standby})
	}
	sort.Slice(s.Members, func(i, j int) bool { return s.Members[i].Seq < s.Members[j].Seq })
	for _, ex := range m.excluded {
		ex.At, ex.Deadline = utc(ex.At), utc(ex.Deadline)
		s.Excluded = append(s.Excluded, ex)
	}
	sort.Slice(s.Excluded, func(i, j int) bool { return s.Excluded[i].NodeID < s.Excluded[j].NodeID })
	return s
}

// utc drops the monotonic reading and location so a snapshot compares
// equal after a JSON round trip.
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Round(0)
}

// Restore rebuilds a machine from a snapshot. Every member counts as seen
// at now.
func Restore(s Snapshot, now time.Time) (*Machine, error) {
	if s.Version != SnapshotVersion {
		return nil, fmt.Errorf("rendezvous snapshot version %d, want %d", s.Version, SnapshotVersion)
	}
	if err := s.Config.Validate(); err != nil {
		return nil, fmt.Errorf("rendezvous snapshot: %w", err)
	}
	if s.Round < 1 {
		return nil, fmt.Errorf("rendezvous snapshot: round %d", s.Round)
	}
	switch s.State {
	case RoundOpen, RoundClosed, RoundFinished:
	default:
		return nil, fmt.Errorf("rendezvous snapshot: unknown state %q", s.State)
	}
	m := newEmpty(s.Config, s.RunID)
	m.round, m.state, m.success, m.seq = s.Round, s.State, s.Success, s.Seq
	m.openedAt, m.closedAt, m.finishedAt = s.OpenedAt, s.ClosedAt, s.FinishedAt
	m.deadline, m.standbyAt = s.Deadline, s.StandbyAt
	m.noticeRound, m.noticeReason, m.noticeDeadline = s.NoticeRound, s.NoticeReason, s.NoticeDeadline
	members := append([]SnapshotMember(nil), s.Members...)
	sort.Slice(members, func(i, j int) bool { return members[i].Seq < members[j].Seq })
	for i, sm := range members {
		if i > 0 && sm.Seq == members[i-1].Seq {
			// Seq is the join order; a tie would make ranks depend on map order.
			return nil, fmt.Errorf("rendezvous snapshot: members %s and %s have the same seq %d", members[i-1].NodeID, sm.NodeID, sm.Seq)
		}
		if err := sm.JoinRequest.Validate(); err != nil {
			return nil, fmt.Errorf("rendezvous snapshot: member: %w", err)
		}
		if m.members[sm.NodeID] != nil {
			return nil, fmt.Errorf("rendezvous snapshot: member %s twice", sm.NodeID)
		}
		if sm.Seq > m.seq {
			return nil, fmt.Errorf("rendezvous snapshot: member %s has seq %d beyond %d", sm.NodeID, sm.Seq, m.seq)
		}
		m.add(&member{JoinRequest: sm.JoinRequest, seq: sm.Seq, joinedAt: sm.JoinedAt, standby: sm.Standby, lastSeen: now})
	}
	for _, ex := range s.Excluded {
		if m.members[ex.NodeID] != nil {
			return nil, fmt.Errorf("rendezvous snapshot: excluded %s is a member", ex.NodeID)
		}
		m.excluded[ex.NodeID] = ex
	}
	if len(s.Order) > 0 {
		order := make([]*member, len(s.Order))
		ranked := make(map[string]bool, len(s.Order))
		for i, id := range s.Order {
			if ranked[id] {
				return nil, fmt.Errorf("rendezvous snapshot: round %d ranks %s twice", s.Round, id)
			}
			ranked[id] = true
			mb := m.members[id]
			if mb == nil {
				if m.state == RoundClosed {
					return nil, fmt.Errorf("rendezvous snapshot: closed round %d lists unknown member %s", s.Round, id)
				}
				// The previous round's ranks only matter for ordering
				// survivors; a gone node keeps its slot by id.
				mb = &member{JoinRequest: JoinRequest{NodeID: id}}
			}
			order[i] = mb
		}
		m.assign(order, s.MasterPort)
	}
	if m.state == RoundOpen && m.nPart >= s.Config.MaxNodes {
		// An open round closes the moment it reaches max_nodes.
		return nil, fmt.Errorf("rendezvous snapshot: open round %d already has %d nodes (max %d)", s.Round, m.nPart, s.Config.MaxNodes)
	}
	if m.state == RoundClosed {
		if len(s.Order) != m.nPart {
			return nil, fmt.Errorf("rendezvous snapshot: closed round %d has %d ranks for %d participants", s.Round, len(s.Order), m.nPart)
		}
		// A round closes with at least one node and at most max_nodes.
		if m.nPart == 0 || m.nPart > s.Config.MaxNodes {
			return nil, fmt.Errorf("rendezvous snapshot: closed round %d has %d nodes (max %d)", s.Round, m.nPart, s.Config.MaxNodes)
		}
		for id := range m.rankOf {
			if m.members[id].standby {
				return nil, fmt.Errorf("rendezvous snapshot: standby %s has a rank", id)
			}
		}
	}
	return m, nil
}
