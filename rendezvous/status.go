package rendezvous

import (
	"sort"
	"time"
)

// Status is an operator's view of a fleet's rendezvous.
type Status struct {
	Fleet  string `json:"fleet"`
	RunID  string `json:"run_id"`
	Config Config `json:"config"`
	RoundInfo
	// LastCallAt is when an open round with MinNodes closes.
	LastCallAt time.Time `json:"last_call_at,omitzero"`
	// StandbyAt is when waiting standbys are merged into a new round.
	StandbyAt time.Time `json:"standby_at,omitzero"`
	// Of the closed round:
	Nodes      int    `json:"nodes"`
	WorldSize  int    `json:"world_size"`
	MasterAddr string `json:"master_addr,omitempty"`
	MasterPort int    `json:"master_port,omitempty"`
	// Members are in group-rank order, then the unranked ones by join order.
	Members  []MemberStatus `json:"members"`
	Standby  []string       `json:"standby,omitempty"`
	Excluded []Exclusion    `json:"excluded,omitempty"`
	// Unsaved is set while the last change could not be persisted; a
	// closed round is not announced to agents until it is.
	Unsaved bool `json:"unsaved,omitempty"`
}

// RoundInfo is the current round's number, state and times, in both
// Status and Snapshot.
type RoundInfo struct {
	Round      int        `json:"round"`
	State      RoundState `json:"state"`
	Success    bool       `json:"success,omitempty"`
	OpenedAt   time.Time  `json:"opened_at"`
	ClosedAt   time.Time  `json:"closed_at,omitzero"`
	FinishedAt time.Time  `json:"finished_at,omitzero"`
}

func (m *Machine) roundInfo() RoundInfo {
	return RoundInfo{Round: m.round, State: m.state, Success: m.success, OpenedAt: m.openedAt, ClosedAt: m.closedAt, FinishedAt: m.finishedAt}
}

// MemberStatus is one live member.
type MemberStatus struct {
	NodeID        string    `json:"node_id"`
	Addr          string    `json:"addr"`
	Zone          string    `json:"zone,omitempty"`
	Nproc         int       `json:"nproc"`
	State         NodeState `json:"state"`
	GroupRank     *int      `json:"group_rank,omitempty"`
	RankOffset    *int      `json:"rank_offset,omitempty"`
	JoinedAt      time.Time `json:"joined_at"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// From the agent's last heartbeat:
	WorkerRound int    `json:"worker_round,omitempty"`
	Step        *int64 `json:"step,omitempty"`
	Workers     string `json:"workers,omitempty"`
	// Progress is the node's last progress report, if any; ProgressAt
	// is when the daemon received it.
	Progress   *Progress `json:"progress,omitempty"`
	ProgressAt time.Time `json:"progress_at,omitzero"`
}

// Status reports the machine's state. O(n log n); for operators, not for
// hot paths.
func (m *Machine) Status() Status {
	st := Status{
		RunID: m.runID, Config: m.cfg, RoundInfo: m.roundInfo(),
		Members: []MemberStatus{},
	}
	if m.state == RoundOpen {
		st.LastCallAt = m.deadline
	}
	if m.state == RoundClosed {
		st.StandbyAt = m.standbyAt
		st.Nodes, st.WorldSize = len(m.order), m.offsets[len(m.order)]
		st.MasterAddr, st.MasterPort = m.masterAddr, m.masterPort
	}
	ms := make([]*member, 0, len(m.members))
	for _, mb := range m.members {
		ms = append(ms, mb)
	}
	ranked := m.state == RoundClosed
	sort.Slice(ms, func(i, j int) bool {
		if ranked && ms[i].standby != ms[j].standby {
			return !ms[i].standby
		}
		if ranked && !ms[i].standby {
			return m.rankOf[ms[i].NodeID] < m.rankOf[ms[j].NodeID]
		}
		return ms[i].seq < ms[j].seq
	})
	for _, mb := range ms {
		s := MemberStatus{
			NodeID: mb.NodeID, Addr: mb.Addr, Zone: mb.Zone, Nproc: mb.Nproc,
			JoinedAt: mb.joinedAt, LastHeartbeat: mb.lastSeen,
			WorkerRound: mb.workerRound, Step: mb.step, Workers: mb.workers,
		}
		if mb.progress != nil {
			p := *mb.progress
			s.Progress, s.ProgressAt = &p, mb.progressAt
		}
		switch {
		case m.state == RoundFinished:
			s.State = NodeFinished
		case mb.standby:
			s.State = NodeStandby
			st.Standby = append(st.Standby, mb.NodeID)
		case m.state == RoundOpen:
			s.State = NodeWaiting
		default:
			s.State = NodeAssigned
			g := m.rankOf[mb.NodeID]
			off := m.offsets[g]
			s.GroupRank, s.RankOffset = &g, &off
		}
		st.Members = append(st.Members, s)
	}
	for _, ex := range m.excluded {
		st.Excluded = append(st.Excluded, ex)
	}
	sort.Slice(st.Excluded, func(i, j int) bool { return st.Excluded[i].NodeID < st.Excluded[j].NodeID })
	return st
}
