package rendezvous

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"reflect"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func testConfig(minN, maxN int) Config {
	return Config{MinNodes: minN, MaxNodes: maxN, LastCall: 5 * time.Second, Heartbeat: time.Second, DeadAfter: time.Hour, MasterPort: 29500}
}

// addrOf gives every test node a stable IP.
func addrOf(id string) string {
	h := fnv.New32a()
	h.Write([]byte(id))
	return fmt.Sprintf("10.0.%d.%d", h.Sum32()%200, 1+h.Sum32()/200%250)
}

type op func(m *Machine, now time.Time) (Effects, View)

func joinZ(id, zone string, nproc int) op {
	return func(m *Machine, now time.Time) (Effects, View) {
		v, eff, err := m.Join(now, JoinRequest{NodeID: id, Addr: addrOf(id), Zone: zone, Nproc: nproc, Session: "s-" + id})
		if err != nil {
			panic(err)
		}
		return eff, v
	}
}

func join(id string) op { return joinZ(id, "z1", 1) }

func joinSession(id, session string) op {
	return func(m *Machine, now time.Time) (Effects, View) {
		v, eff, err := m.Join(now, JoinRequest{NodeID: id, Addr: addrOf(id), Zone: "z1", Nproc: 1, Session: session})
		if err != nil {
			panic(err)
		}
		return eff, v
	}
}

func hb(ids ...string) op {
	return func(m *Machine, now time.Time) (Effects, View) {
		var v View
		for _, id := range ids {
			r, err := m.Heartbeat(now, HeartbeatRequest{NodeID: id})
			if err != nil {
				panic(err)
			}
			v = View{Round: r.Round, RoundState: r.RoundState, State: r.State}
		}
		return Effects{}, v
	}
}

func leave(id string) op {
	return func(m *Machine, now time.Time) (Effects, View) { return m.Leave(now, id), m.View(id) }
}

func exclude(id string) op {
	return func(m *Machine, now time.Time) (Effects, View) {
		return m.Exclude(now, id, "spot interruption notice"), m.View(id)
	}
}

func finish(ok bool) op {
	return func(m *Machine, now time.Time) (Effects, View) { return m.Finish(now, ok), View{} }
}

func configure(c Config) op {
	return func(m *Machine, now time.Time) (Effects, View) {
		eff, err := m.Configure(now, c)
		if err != nil {
			panic(err)
		}
		return eff, View{}
	}
}

type step struct {
	at time.Duration // since t0; timers fire (via Next/Tick) up to and including it
	op op            // nil: only let time pass
	// Expectations after the step; zero values are not checked.
	round     int
	state     RoundState
	ranks     []string  // the closed round by group rank
	standby   []string  // []string{} checks that there are none
	view      NodeState // the op's returned view
	changed   *bool
	lastEvent EventKind
}

var yes, no = new(true), new(false)

// harness drives a machine like the Service does: Tick exactly when Next
// says so.
type harness struct {
	t      *testing.T
	m      *Machine
	now    time.Time
	events []Event
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	m, err := NewMachine(cfg, "run-1", t0)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, m: m, now: t0}
}

func (h *harness) advance(to time.Time) {
	h.t.Helper()
	for range 10000 {
		n := h.m.Next(h.now)
		if n.IsZero() || n.After(to) {
			h.now = to
			return
		}
		h.now = n
		h.events = append(h.events, h.m.Tick(n).Events...)
		if after := h.m.Next(n); !after.IsZero() && !after.After(n) {
			h.t.Fatalf("after Tick(%s) Next is %s: the timer would spin", n.Sub(t0), after.Sub(t0))
		}
		checkInvariants(h.t, h.m)
	}
	h.t.Fatal("too many ticks")
}

func ranks(m *Machine) []string {
	if m.state != RoundClosed {
		return nil
	}
	return append([]string{}, m.order...)
}

func standbys(m *Machine) []string {
	out := []string{}
	for _, ms := range m.Status().Members {
		if ms.State == NodeStandby {
			out = append(out, ms.NodeID)
		}
	}
	return out
}

func checkInvariants(t *testing.T, m *Machine) {
	t.Helper()
	part, sb := 0, 0
	for _, mb := range m.members {
		if mb.standby {
			sb++
		} else {
			part++
		}
	}
	if part != m.nPart || sb != m.nStandby || m.lru.Len() != len(m.members) {
		t.Fatalf("counts: participants %d/%d standby %d/%d lru %d members %d", part, m.nPart, sb, m.nStandby, m.lru.Len(), len(m.members))
	}
	var prev time.Time
	for e := m.lru.Front(); e != nil; e = e.Next() {
		ls := e.Value.(*member).lastSeen
		if ls.Before(prev) {
			t.Fatal("lru not ordered by last heartbeat")
		}
		prev = ls
	}
	if m.state == RoundClosed {
		if len(m.order) != m.nPart || m.nPart > m.cfg.MaxNodes {
			t.Fatalf("closed round has %d ranks for %d participants (max %d)", len(m.order), m.nPart, m.cfg.MaxNodes)
		}
		for g, id := range m.order {
			if mb := m.members[id]; mb == nil || mb.standby || m.rankOf[id] != g {
				t.Fatalf("rank %d: %s is not a ranked participant", g, id)
			}
		}
	}
	if m.state == RoundOpen && m.nPart >= m.cfg.MaxNodes {
		t.Fatalf("open round holds %d >= max %d nodes", m.nPart, m.cfg.MaxNodes)
	}
	for id := range m.excluded {
		if m.members[id] != nil {
			t.Fatalf("excluded %s is a member", id)
		}
	}
}

func TestMachineScenarios(t *testing.T) {
	s := time.Second
	fast := testConfig(2, 3)
	fast.Heartbeat, fast.DeadAfter = 2*s, 10*s
	wide := testConfig(2, 8)
	lc0 := testConfig(2, 4)
	lc0.LastCall = 0

	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"closes at max", testConfig(2, 4), []step{
			{at: 0, op: join("a"), round: 1, state: RoundOpen, view: NodeWaiting, changed: no},
			{at: 1 * s, op: join("b"), state: RoundOpen},
			{at: 2 * s, op: join("c"), state: RoundOpen, view: NodeWaiting},
			{at: 3 * s, op: join("d"), round: 1, state: RoundClosed, ranks: []string{"a", "b", "c", "d"}, view: NodeAssigned, changed: yes, lastEvent: EventRoundClosed},
			{at: 4 * s, op: join("e"), round: 1, view: NodeStandby, standby: []string{"e"}, changed: no},
		}},
		{"closes last_call after min", testConfig(2, 4), []step{
			{at: 0, op: join("a")},
			{at: 1 * s, op: join("b"), state: RoundOpen},
			{at: 3 * s, op: join("c"), state: RoundOpen},   // joins after min do not extend the last call
			{at: 6*s - time.Millisecond, state: RoundOpen}, // b reached min at 1s
			{at: 6 * s, round: 1, state: RoundClosed, ranks: []string{"a", "b", "c"}, lastEvent: EventRoundClosed},
		}},
		{"last_call 0 closes at min", lc0, []step{
			{at: 0, op: join("a"), state: RoundOpen},
			{at: s, op: join("b"), state: RoundClosed, ranks: []string{"a", "b"}, view: NodeAssigned},
		}},
		{"zones grouped from scratch, newcomers appended by zone", wide, []step{
			{at: 0, op: joinZ("a", "us-east-1a", 1)},
			{at: 0, op: joinZ("b", "us-east-1b", 1)},
			{at: 0, op: joinZ("c", "us-east-1a", 1)},
			{at: 0, op: joinZ("d", "us-east-1b", 1)},
			{at: 5 * s, state: RoundClosed, ranks: []string{"a", "c", "b", "d"}},
			{at: 6 * s, op: joinZ("e", "us-east-1a", 1), view: NodeStandby},
			{at: 7 * s, op: joinZ("f", "us-west-2a", 1)},
			{at: 8 * s, op: joinZ("g", "us-east-1b", 1), standby: []string{"e", "f", "g"}},
			// Survivors keep their ranks; g continues the last survivor's zone.
			{at: 11 * s, round: 2, state: RoundClosed, ranks: []string{"a", "c", "b", "d", "g", "e", "f"}, standby: []string{}},
		}},
		{"ranks stable and compacted across rounds", testConfig(2, 4), []step{
			{at: 0, op: join("a")}, {at: 0, op: join("b")}, {at: 0, op: join("c")},
			{at: 0, op: join("d"), ranks: []string{"a", "b", "c", "d"}},
			{at: s, op: leave("b"), round: 2, state: RoundClosed, ranks: []string{"a", "c", "d"}, changed: yes, view: NodeUnknown},
			// e fills the job to max_nodes: merged at once, no last call.
			{at: 2 * s, op: join("e"), round: 3, ranks: []string{"a", "c", "d", "e"}, view: NodeAssigned},
			{at: 8 * s, op: leave("a"), round: 4, ranks: []string{"c", "d", "e"}},
		}},
		{"dead member dropped after dead_after, survivors re-form at once", fast, []step{
			{at: 0, op: join("a")}, {at: 0, op: join("b")},
			{at: 0, op: join("c"), round: 1, state: RoundClosed, ranks: []string{"a", "b", "c"}},
			{at: 2 * s, op: hb("a", "b")}, {at: 4 * s, op: hb("a", "b")}, {at: 6 * s, op: hb("a", "b")},
			{at: 8 * s, op: hb("a", "b"), round: 1, changed: no},
			{at: 10*s - time.Millisecond, round: 1, state: RoundClosed},
			{at: 10 * s, round: 2, state: RoundClosed, ranks: []string{"a", "b"}, lastEvent: EventRoundClosed},
			{at: 12 * s, op: hb("a"), view: NodeAssigned},
			{at: 18 * s, round: 3, state: RoundOpen}, // b died too: below min, training pauses
			{at: 21 * s, op: hb("a"), round: 3, state: RoundOpen, view: NodeWaiting},
			{at: 22 * s, op: join("c"), view: NodeWaiting, state: RoundOpen}, // c's agent came back
			{at: 27 * s, round: 3, state: RoundClosed, ranks: []string{"a", "c"}},
		}},
		{"exclude re-forms at once and bars rejoining", testConfig(2, 3), []step{
			{at: 0, op: join("a")}, {at: 0, op: join("b")}, {at: 0, op: join("c"), ranks: []string{"a", "b", "c"}},
			{at: 5 * s, op: exclude("b"), round: 2, state: RoundClosed, ranks: []string{"a", "c"}, view: NodeExcluded, changed: yes},
			{at: 6 * s, op: join("b"), round: 2, view: NodeExcluded, changed: no, standby: []string{}},
			{at: 7 * s, op: hb("b"), view: NodeExcluded},
			{at: 8 * s, op: exclude("x"), round: 2, changed: yes}, // notice before the node ever joined
			{at: 9 * s, op: join("x"), view: NodeExcluded, ranks: []string{"a", "c"}},
		}},
		{"below min: round stays open until a join and last call", testConfig(2, 3), []step{
			{at: 0, op: join("a")}, {at: 0, op: join("b")}, {at: 0, op: join("c"), round: 1, state: RoundClosed},
			{at: s, op: leave("b"), round: 2, state: RoundClosed, ranks: []string{"a", "c"}},
			{at: 2 * s, op: exclude("c"), round: 3, state: RoundOpen, view: NodeExcluded},
			{at: 30 * time.Minute, round: 3, state: RoundOpen},
			{at: 31 * time.Minute, op: join("d"), state: RoundOpen, view: NodeWaiting},
			{at: 31*time.Minute + 5*s, round: 3, state: RoundClosed, ranks: []string{"a", "d"}},
		}},
		{"standbys batched for last_call", testConfig(2, 6), []step{
			{at: 0, op: join("a")}, {at: 0, op: join("b")},
			{at: 5 * s, round: 1, state: RoundClosed, ranks: []string{"a", "b"}},
			{at: 10 * s, op: join("c"), view: NodeStandby, changed: no},
			{at: 12 * s, op: join("d")},
			{at: 13 * s, op: join("e"), standby: []string{"c", "d", "e"}},
			{at: 15*s - time.Millisecond, round: 1},
			{at: 15 * s, round: 2, state: RoundClosed, ranks: []string{"a", "b", "c", "d", "e"}, standby: []string{}},
		}},
		{"standbys filling max merge at once; extra ones wait for a slot", testConfig(2, 4), []step{
			{at: 0, op: join("a")}, {at: 0, op: join("b")},
			{at: 5 * s, round: 1, state: RoundClosed, ranks: []string{"a", "b"}},
			{at: 10 * s, op: join("c"), view: NodeStandby, changed: no},
			{at: 12 * s, op: join("d"), round: 2, state: RoundClosed, ranks: []string{"a", "b", "c", "d"}},
			{at: 13 * s, op: join("e"), view: NodeStandby, standby: []string{"e"}},
			{at: 60 * s, round: 2, standby: []string{"e"}}, // full: e waits for a slot
			{at: 61 * s, op: leave("a"), round: 3, state: RoundClosed, ranks: []string{"b", "c", "d", "e"}, standby: []string{}},
		}},
		{"a lost node's slot goes to a waiting standby in the same round", testConfig(2, 2), []step{
			{at: 0, op: join("a")}, {at: 0, op: join("b"), state: RoundClosed},
			{at: s, op: join("c"), view: NodeStandby},
			{at: 2 * s, op: exclude("a"), round: 2, state: RoundClosed, ranks: []string{"b", "c"}},
		}},
		{"finished is final", testConfig(1, 2), []step{
			{at: 0, op: join("a")},
			{at: 5 * s, state: RoundClosed},
			{at: 6 * s, op: finish(true), state: RoundFinished, changed: yes, lastEvent: EventFinished},
			{at: 7 * s, op: join("b"), view: NodeFinished, changed: no, state: RoundFinished},
			{at: 8 * s, op: leave("a"), changed: no, state: RoundFinished},
			{at: 9 * s, op: exclude("a"), changed: no, state: RoundFinished},
			{at: 10 * s, op: finish(false), changed: no},
			{at: 100 * time.Hour, state: RoundFinished, round: 1},
		}},
		{"a retried join changes nothing; a restarted agent re-forms the round", testConfig(2, 2), []step{
			{at: 0, op: joinSession("a", "s1")},
			{at: 0, op: joinSession("b", "s1"), state: RoundClosed, ranks: []string{"a", "b"}},
			{at: s, op: joinSession("a", "s1"), round: 1, changed: no, view: NodeAssigned},
			{at: 2 * s, op: joinSession("a", "s2"), round: 2, state: RoundClosed, ranks: []string{"a", "b"}, changed: yes, view: NodeAssigned},
		}},
		{"a drop from an open round keeps the round number", fast, []step{
			{at: 0, op: join("a")},
			{at: 5 * s, op: join("b"), state: RoundOpen}, // last call until 10s
			{at: 10*s - time.Millisecond, op: hb("b"), state: RoundOpen},
			{at: 10 * s, round: 1, state: RoundOpen}, // a expired at 10s: below min again
			{at: 14 * s, op: join("c")},
			{at: 19 * s, round: 1, state: RoundClosed, ranks: []string{"b", "c"}},
		}},
		{"lowering max re-forms a larger running round", testConfig(1, 4), []step{
			{at: 0, op: join("a")}, {at: 0, op: join("b")}, {at: 0, op: join("c")},
			{at: 5 * s, ranks: []string{"a", "b", "c"}},
			{at: 6 * s, op: configure(testConfig(1, 2)), round: 2, ranks: []string{"a", "b"}, standby: []string{"c"}},
			{at: 7 * s, op: configure(testConfig(1, 4)), round: 2}, // room again: c is merged after last call
			{at: 12 * s, round: 3, ranks: []string{"a", "b", "c"}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.cfg)
			for i, st := range tc.steps {
				h.advance(t0.Add(st.at))
				var eff Effects
				var v View
				if st.op != nil {
					eff, v = st.op(h.m, h.now)
					h.events = append(h.events, eff.Events...)
					checkInvariants(t, h.m)
				}
				where := fmt.Sprintf("step %d (at %s)", i, st.at)
				round, state := h.m.Round()
				if st.round != 0 && round != st.round {
					t.Fatalf("%s: round %d, want %d", where, round, st.round)
				}
				if st.state != "" && state != st.state {
					t.Fatalf("%s: state %s, want %s", where, state, st.state)
				}
				if st.ranks != nil && !slices.Equal(ranks(h.m), st.ranks) {
					t.Fatalf("%s: ranks %v, want %v", where, ranks(h.m), st.ranks)
				}
				if st.standby != nil && !slices.Equal(standbys(h.m), st.standby) {
					t.Fatalf("%s: standby %v, want %v", where, standbys(h.m), st.standby)
				}
				if st.view != "" && v.State != st.view {
					t.Fatalf("%s: view %s, want %s", where, v.State, st.view)
				}
				if st.changed != nil && eff.Changed != *st.changed {
					t.Fatalf("%s: changed %v, want %v", where, eff.Changed, *st.changed)
				}
				if st.lastEvent != "" && (len(h.events) == 0 || h.events[len(h.events)-1].Kind != st.lastEvent) {
					t.Fatalf("%s: events %v, want last %s", where, h.events, st.lastEvent)
				}
			}
		})
	}
}

func TestAssignmentRanksFollowTorchrun(t *testing.T) {
	cfg := testConfig(3, 3)
	cfg.MasterPort = 29511
	m, err := NewMachine(cfg, "bert-7f", t0)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct {
		id    string
		nproc int
	}{{"a", 2}, {"b", 4}, {"c", 1}} {
		if _, _, err := m.Join(t0, JoinRequest{NodeID: n.id, Addr: addrOf(n.id), Zone: "z", Nproc: n.nproc}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]Assignment{
		"a": {GroupRank: 0, RankOffset: 0, LocalWorldSize: 2},
		"b": {GroupRank: 1, RankOffset: 2, LocalWorldSize: 4},
		"c": {GroupRank: 2, RankOffset: 6, LocalWorldSize: 1},
	}
	for id, w := range want {
		v := m.View(id)
		if v.State != NodeAssigned || v.Assignment == nil {
			t.Fatalf("%s: view %+v", id, v)
		}
		w.Round, w.RunID, w.GroupWorldSize, w.WorldSize = 1, "bert-7f", 3, 7
		w.MasterAddr, w.MasterPort = addrOf("a"), 29511 // round 1: the configured port
		w.Members = MembersSummary{Nodes: 3, Zones: []ZoneCount{{Zone: "z", Nodes: 3}}}
		if !reflect.DeepEqual(*v.Assignment, w) {
			t.Errorf("%s: assignment\n got %+v\nwant %+v", id, *v.Assignment, w)
		}
	}
	// RANK = prefix sum of LOCAL_WORLD_SIZE + LOCAL_RANK covers 0..WORLD_SIZE-1 once.
	seen := map[int]bool{}
	for id := range want {
		a := m.View(id).Assignment
		for l := range a.LocalWorldSize {
			if seen[a.Rank(l)] {
				t.Fatalf("rank %d assigned twice", a.Rank(l))
			}
			seen[a.Rank(l)] = true
		}
	}
	if len(seen) != 7 {
		t.Fatalf("%d ranks, want 7", len(seen))
	}
}

func TestMachineNext(t *testing.T) {
	cfg := testConfig(2, 3)
	cfg.DeadAfter = 10 * time.Second
	m, _ := NewMachine(cfg, "r", t0)
	if n := m.Next(t0); !n.IsZero() {
		t.Fatalf("empty machine wants a tick at %s", n)
	}
	m.Join(t0, JoinRequest{NodeID: "a", Addr: "10.0.0.1", Nproc: 1})
	if n := m.Next(t0); !n.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("Next = %s, want a's expiry", n.Sub(t0))
	}
	m.Join(t0.Add(time.Second), JoinRequest{NodeID: "b", Addr: "10.0.0.2", Nproc: 1})
	if n := m.Next(t0); !n.Equal(t0.Add(6 * time.Second)) {
		t.Fatalf("Next = %s, want the last call at 6s", n.Sub(t0))
	}
	m.Heartbeat(t0.Add(2*time.Second), HeartbeatRequest{NodeID: "a"})
	if n := m.Next(t0.Add(2 * time.Second)); !n.Equal(t0.Add(6 * time.Second)) {
		t.Fatalf("Next = %s, want 6s", n.Sub(t0))
	}
	m.Tick(t0.Add(6 * time.Second))
	if _, st := m.Round(); st != RoundClosed {
		t.Fatalf("state %s", st)
	}
	if n := m.Next(t0.Add(6 * time.Second)); !n.Equal(t0.Add(11 * time.Second)) {
		t.Fatalf("Next = %s, want b's expiry at 11s", n.Sub(t0))
	}
	if n := m.Next(t0.Add(time.Minute)); !n.Equal(t0.Add(time.Minute)) {
		t.Fatalf("overdue Next = %s, want now", n.Sub(t0))
	}
	m.Finish(t0.Add(7*time.Second), true)
	if n := m.Next(t0); !n.IsZero() {
		t.Fatalf("finished machine wants a tick at %s", n)
	}
}

func TestJoinValidation(t *testing.T) {
	m, _ := NewMachine(testConfig(1, 2), "r", t0)
	bad := []JoinRequest{
		{NodeID: "", Addr: "10.0.0.1", Nproc: 1},
		{NodeID: "a b", Addr: "10.0.0.1", Nproc: 1},
		{NodeID: "a", Addr: "node-a.internal", Nproc: 1},
		{NodeID: "a", Addr: "0.0.0.0", Nproc: 1},
		{NodeID: "a", Addr: "10.0.0.1", Nproc: 0},
		{NodeID: "a", Addr: "10.0.0.1", Nproc: 1, Zone: "us east"},
	}
	for _, r := range bad {
		if _, _, err := m.Join(t0, r); err == nil {
			t.Errorf("Join(%+v) accepted", r)
		}
	}
	if len(m.members) != 0 {
		t.Fatal("an invalid join changed the membership")
	}
	if _, _, err := m.Join(t0, JoinRequest{NodeID: "a", Addr: "fd00::1", Nproc: 8}); err != nil {
		t.Fatalf("IPv6 join: %v", err)
	}
}

func TestConfigValidateAndJSON(t *testing.T) {
	good := testConfig(2, 4)
	b, err := json.Marshal(good)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"min_nodes":2,"max_nodes":4,"last_call":"5s","heartbeat":"1s","dead_after":"1h0m0s","master_port":29500}`; string(b) != want {
		t.Fatalf("json %s, want %s", b, want)
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil || back != good {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	for _, mut := range []func(*Config){
		func(c *Config) { c.MinNodes = 0 },
		func(c *Config) { c.MaxNodes = 1 },
		func(c *Config) { c.LastCall = -1 },
		func(c *Config) { c.Heartbeat = 0 },
		func(c *Config) { c.DeadAfter = c.Heartbeat },
		func(c *Config) { c.MasterPort = 70000 },
	} {
		c := good
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%+v validated", c)
		}
	}
}

func TestRoundPortCyclesPerRound(t *testing.T) {
	tests := []struct {
		base, round, want int
	}{
		{29500, 1, 29500}, {29500, 2, 29501}, {29500, 8, 29507}, {29500, 9, 29500}, {29500, 17, 29500},
		{65535, 1, 65535}, {65535, 2, 65528}, {65530, 6, 65535}, {65530, 7, 65528}, {1, 0, 8},
	}
	for _, tt := range tests {
		if got := RoundPort(tt.base, tt.round); got != tt.want {
			t.Errorf("RoundPort(%d, %d) = %d, want %d", tt.base, tt.round, got, tt.want)
		}
	}
	// Consecutive rounds never share a port: a lingering worker of round
	// N cannot reach round N+1's store.
	cfg := testConfig(1, 2)
	m, err := NewMachine(cfg, "r", t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Join(t0, JoinRequest{NodeID: "a", Addr: addrOf("a"), Zone: "z", Nproc: 1}); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(cfg.LastCall)
	m.Tick(now)
	prev := 0
	for i := range 3 {
		v := m.View("a")
		if v.Assignment == nil || v.Assignment.MasterPort != RoundPort(cfg.MasterPort, v.Round) || v.Assignment.MasterPort == prev {
			t.Fatalf("round %d: assignment %+v (previous port %d)", v.Round, v.Assignment, prev)
		}
		prev = v.Assignment.MasterPort
		// A new session re-forms the round at once (a worker failure).
		if _, _, err := m.Join(now, JoinRequest{NodeID: "a", Addr: addrOf("a"), Zone: "z", Nproc: 1, Session: fmt.Sprint("s", i)}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMasterListeningIsReportedOncePerRound(t *testing.T) {
	cfg := testConfig(2, 2)
	m, err := NewMachine(cfg, "r", t0)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if _, _, err := m.Join(t0, JoinRequest{NodeID: id, Addr: addrOf(id), Zone: "z", Nproc: 1}); err != nil {
			t.Fatal(err)
		}
	}
	master := m.order[0]
	other := m.order[1]
	tests := []struct {
		name          string
		node          string
		round         int
		changed       bool
		listening     bool
		listensBefore bool
	}{
		{name: "not the master", node: other, round: 1},
		{name: "another round", node: master, round: 2},
		{name: "the master", node: master, round: 1, changed: true, listening: true, listensBefore: true},
		{name: "again", node: master, round: 1, listening: true, listensBefore: true},
	}
	for _, tt := range tests {
		eff := m.MasterListening(tt.node, tt.round)
		v := m.View(other)
		if eff.Changed != tt.changed || v.MasterListening != tt.listening || v.MasterListens != tt.listensBefore {
			t.Errorf("%s: changed %v, view listening %v listens %v; want %v %v %v", tt.name, eff.Changed,
				v.MasterListening, v.MasterListens, tt.changed, tt.listening, tt.listensBefore)
		}
	}
	// A new round starts without its master's report, remembering that
	// masters of this run do report.
	if _, _, err := m.Join(t0, JoinRequest{NodeID: other, Addr: addrOf(other), Zone: "z", Nproc: 1, Session: "new"}); err != nil {
		t.Fatal(err)
	}
	if v := m.View(other); v.Round != 2 || v.MasterListening || !v.MasterListens {
		t.Errorf("next round's view %+v, want round 2, not listening, listens", v)
	}
}

// TestNoticeCause: the round that replaced a running round because of an
// exclusion tells its waiting and assigned members why (their agents ask
// the workers to checkpoint); any later change clears it.
func TestNoticeCause(t *testing.T) {
	s := time.Second
	h := newHarness(t, testConfig(2, 3))
	at := func(d time.Duration, o op) {
		t.Helper()
		h.advance(t0.Add(d))
		if o != nil {
			o(h.m, h.now)
			checkInvariants(t, h.m)
		}
	}
	want := func(id string, round int, state NodeState, cause, reason string) {
		t.Helper()
		if v := h.m.View(id); v.Round != round || v.State != state || v.Cause != cause || v.Reason != reason {
			t.Fatalf("view of %s: %+v; want round %d %s, cause %q, reason %q", id, v, round, state, cause, reason)
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		at(0, join(id))
	}
	want("a", 1, NodeAssigned, "", "")
	at(s, exclude("b"))
	want("a", 2, NodeAssigned, CauseNotice, "node b excluded: spot interruption notice")
	want("c", 2, NodeAssigned, CauseNotice, "node b excluded: spot interruption notice")
	want("b", 2, NodeExcluded, "", "spot interruption notice")
	// Excluding a node outside the running round re-forms nothing.
	at(2*s, exclude("x"))
	want("a", 2, NodeAssigned, CauseNotice, "node b excluded: spot interruption notice")
	// It survives a daemon restart.
	r, err := Restore(h.m.Snapshot(), h.now)
	if err != nil {
		t.Fatal(err)
	}
	if v := r.View("c"); v.Cause != CauseNotice {
		t.Fatalf("restored view %+v lost the cause", v)
	}
	// A standby merge is another change: no cause.
	at(3*s, join("d"))
	at(8*s, nil)
	want("a", 3, NodeAssigned, "", "")
	// Below min_nodes the new round stays open: its waiting members see the cause too.
	at(9*s, leave("d"))
	at(10*s, exclude("c"))
	want("a", 5, NodeWaiting, CauseNotice, "node c excluded: spot interruption notice")
}
