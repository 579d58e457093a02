package rendezvous

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/testutil"
)

// fuzzReader hands out the bytes of a fuzz input; past the end it yields
// zeros, so every input is a complete program.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) next() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) done() bool { return len(r.b) == 0 }

var fuzzZones = []string{"us-east-1a", "us-east-1b", ""}

// FuzzMachine runs arbitrary sequences of join, heartbeat, leave, exclude,
// reconfigure, finish and the passage of time through one Machine, and
// checks after every step that it is self-consistent: closed rounds have
// ranks 0..n-1 on distinct nodes, RANK ranges partition 0..WORLD_SIZE-1
// with WORLD_SIZE = Σ nproc, a closed round never changes without a new
// round number, rounds never go back, invalid requests change nothing, and
// the snapshot survives a restore exactly.
func FuzzMachine(f *testing.F) {
	f.Add([]byte{2, 3, 5, 0, 0, 0, 0, 1, 0, 0, 1, 1, 2, 0, 0, 2, 4, 60, 3, 1, 4, 60})
	f.Add([]byte{1, 2, 0, 0, 1, 0, 3, 0, 0, 2, 1, 1, 0, 0, 3, 1, 0, 4, 200, 2, 0, 6, 1, 1, 0, 9, 5, 0})
	f.Add([]byte{3, 4, 1, 0, 0, 1, 0, 0, 1, 1, 1, 0, 0, 2, 2, 2, 0, 0, 3, 0, 3, 0, 0, 4, 1, 1, 7, 0, 0, 4, 255, 4, 255})
	f.Add([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 5, 1, 0, 0, 2, 0, 0})
	f.Fuzz(func(t *testing.T, prog []byte) {
		r := &fuzzReader{b: prog}
		cfg := fuzzConfig(r)
		if err := cfg.Validate(); err != nil {
			t.Fatalf("fuzzConfig made an invalid config: %v", err)
		}
		m, err := NewMachine(cfg, "run-fuzz", t0)
		if err != nil {
			t.Fatal(err)
		}
		now := t0
		lastRound := 1
		for step := 0; !r.done() && step < 200; step++ {
			beforeRound, beforeState := m.Round()
			beforeOrder := append([]string(nil), m.order...)
			beforeSnap, _ := json.Marshal(m.Snapshot())
			var eff Effects
			what := ""
			switch r.next() % 8 {
			case 0:
				req := JoinRequest{NodeID: fmt.Sprintf("n%d", r.next()%6), Zone: fuzzZones[r.next()%3], Nproc: 1 + int(r.next()%4), Session: fmt.Sprintf("s%d", r.next()%3)}
				req.Addr = addrOf(req.NodeID)
				what = fmt.Sprintf("join %+v", req)
				_, eff, err = m.Join(now, req)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			case 1:
				req := HeartbeatRequest{NodeID: fmt.Sprintf("n%d", r.next()%6), Round: int(r.next() % 5)}
				what = fmt.Sprintf("heartbeat %+v", req)
				if _, err := m.Heartbeat(now, req); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			case 2:
				node := fmt.Sprintf("n%d", r.next()%6)
				what = "leave " + node
				eff = m.Leave(now, node)
			case 3:
				node := fmt.Sprintf("n%d", r.next()%6)
				what = "exclude " + node
				eff = m.Exclude(now, node, "spot-interruption notice")
			case 4:
				d := time.Duration(r.next()) * 250 * time.Millisecond
				what = fmt.Sprintf("advance %s", d)
				now, eff = advance(t, m, now, now.Add(d))
			case 5:
				if r.next()%4 != 0 { // rare: finishing ends the interesting part
					continue
				}
				what = "finish"
				eff = m.Finish(now, r.next()%2 == 0)
			case 6:
				c := fuzzConfig(r)
				what = fmt.Sprintf("configure %+v", c)
				eff, err = m.Configure(now, c)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			case 7:
				// Requests a hostile or broken agent might send: refused,
				// and nothing changes.
				bad := []JoinRequest{
					{NodeID: "", Addr: "10.0.0.1", Nproc: 1},
					{NodeID: "n1", Addr: "not-an-ip", Nproc: 1},
					{NodeID: "n1", Addr: "0.0.0.0", Nproc: 1},
					{NodeID: "n1", Addr: "10.0.0.1", Nproc: 0},
					{NodeID: "n1", Addr: "10.0.0.1", Nproc: maxNproc + 1},
					{NodeID: "n 1", Addr: "10.0.0.1", Nproc: 1},
					{NodeID: strings.Repeat("x", maxIDLen+1), Addr: "10.0.0.1", Nproc: 1},
					{NodeID: "n1", Addr: "fe80::1%eth0", Nproc: 1},
				}[r.next()%8]
				what = fmt.Sprintf("bad join %+v", bad)
				if _, _, err := m.Join(now, bad); err == nil {
					t.Fatalf("%s accepted", what)
				}
				if _, err := m.Heartbeat(now, HeartbeatRequest{NodeID: "n1", Round: -1}); err == nil {
					t.Fatal("heartbeat with a negative round accepted")
				}
				if _, err := m.Configure(now, Config{MinNodes: 2, MaxNodes: 1, Heartbeat: time.Second, DeadAfter: 2 * time.Second, MasterPort: 1}); err == nil {
					t.Fatal("max_nodes < min_nodes accepted")
				}
				if after, _ := json.Marshal(m.Snapshot()); !bytes.Equal(after, beforeSnap) {
					t.Fatalf("%s changed the machine:\n%s\n%s", what, beforeSnap, after)
				}
			}
			checkInvariants(t, m)
			checkAssignments(t, m, what)
			round, st := m.Round()
			if round < lastRound {
				t.Fatalf("%s: round went back from %d to %d", what, lastRound, round)
			}
			lastRound = round
			if round == beforeRound && beforeState == RoundClosed && st == RoundClosed && !reflect.DeepEqual(m.order, beforeOrder) {
				t.Fatalf("%s: closed round %d changed from %v to %v", what, round, beforeOrder, m.order)
			}
			if (round != beforeRound || st != beforeState) && !eff.Persist {
				t.Fatalf("%s: round %d/%s → %d/%s without Persist", what, beforeRound, beforeState, round, st)
			}
			checkRestore(t, m, now)
		}
	})
}

// fuzzConfig reads a valid Config: durations in steps the advance op can
// reach.
func fuzzConfig(r *fuzzReader) Config {
	minN := 1 + int(r.next()%4)
	maxN := minN + int(r.next()%4)
	hb := time.Duration(1+r.next()%4) * time.Second
	return Config{MinNodes: minN, MaxNodes: maxN, LastCall: time.Duration(r.next()%8) * time.Second,
		Heartbeat: hb, DeadAfter: hb + time.Duration(1+r.next()%20)*time.Second, MasterPort: 29500}
}

// advance lets time pass the way the Service does: Tick exactly when Next
// asks for it.
func advance(t *testing.T, m *Machine, now, to time.Time) (time.Time, Effects) {
	t.Helper()
	var all Effects
	for range 1000 {
		n := m.Next(now)
		if n.IsZero() || n.After(to) {
			return to, all
		}
		now = n
		eff := m.Tick(n)
		all.Changed = all.Changed || eff.Changed
		all.Persist = all.Persist || eff.Persist
		all.Events = append(all.Events, eff.Events...)
		if after := m.Next(n); !after.IsZero() && !after.After(n) {
			t.Fatalf("after Tick at %s Next is %s: the timer would spin", n.Sub(t0), after.Sub(t0))
		}
		checkInvariants(t, m)
	}
	t.Fatal("more than 1000 ticks in one advance")
	return to, all
}

// checkAssignments: every ranked node's view is consistent with the round
// and together they give torchrun a valid world.
func checkAssignments(t *testing.T, m *Machine, what string) {
	t.Helper()
	round, st := m.Round()
	if st != RoundClosed {
		return
	}
	world := 0
	for _, id := range m.order {
		world += m.members[id].Nproc
	}
	seen := make([]bool, world)
	for g, id := range m.order {
		v := m.View(id)
		a := v.Assignment
		if v.State != NodeAssigned || a == nil {
			t.Fatalf("%s: ranked node %s has view %+v", what, id, v)
		}
		if a.Round != round || a.GroupRank != g || a.GroupWorldSize != len(m.order) || a.WorldSize != world ||
			a.LocalWorldSize != m.members[id].Nproc || a.MasterAddr != m.members[m.order[0]].Addr {
			t.Fatalf("%s: node %s (group rank %d of %d, world %d) got %+v", what, id, g, len(m.order), world, a)
		}
		for lr := 0; lr < a.LocalWorldSize; lr++ {
			rk := a.Rank(lr)
			if rk < 0 || rk >= world || seen[rk] {
				t.Fatalf("%s: RANK %d of node %s is out of range or taken (world %d)", what, rk, id, world)
			}
			seen[rk] = true
		}
	}
	for id, mb := range m.members {
		if mb.standby {
			if v := m.View(id); v.State != NodeStandby {
				t.Fatalf("%s: standby %s has view %s", what, id, v.State)
			}
		}
	}
	for id := range m.excluded {
		if v := m.View(id); v.State != NodeExcluded {
			t.Fatalf("%s: excluded %s has view %s", what, id, v.State)
		}
	}
}

// checkRestore restores m's snapshot, through JSON, at now: the restored
// machine, which it returns, must snapshot to the same JSON.
func checkRestore(t *testing.T, m *Machine, now time.Time) *Machine {
	t.Helper()
	b1, s := snapshotJSON(t, m)
	r, err := Restore(s, now)
	if err != nil {
		t.Fatalf("restore of a live machine's snapshot: %v\n%s", err, b1)
	}
	if b2, _ := json.Marshal(r.Snapshot()); !bytes.Equal(b1, b2) {
		t.Fatalf("snapshot changed by a restore:\n%s\n%s", b1, b2)
	}
	return r
}

// snapshotJSON is m's snapshot as JSON and decoded back from it: what a
// state file holds and a restarted daemon reads.
func snapshotJSON(t *testing.T, m *Machine) ([]byte, Snapshot) {
	t.Helper()
	b, err := json.Marshal(m.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return b, s
}

// FuzzRestore feeds arbitrary snapshot JSON (what a damaged state file
// could hold) to Restore: it refuses, or returns a machine that is
// consistent, survives every operation and snapshots stably.
func FuzzRestore(f *testing.F) {
	for _, b := range seedSnapshots() {
		f.Add(b)
	}
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"config":{"min_nodes":1,"max_nodes":1,"last_call":"0s","heartbeat":"1s","dead_after":"2s","master_port":1},"round":1,"state":"closed","order":["a"],"members":[{"node_id":"a","addr":"10.0.0.1","nproc":1,"seq":1}],"seq":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Snapshot
		if err := json.Unmarshal(b, &s); err != nil {
			return
		}
		now := t0.Add(time.Hour)
		m, err := Restore(s, now)
		if err != nil {
			return
		}
		checkInvariants(t, m)
		checkAssignments(t, m, "restore")
		checkRestore(t, m, now)
		_ = m.Status()
		for _, id := range []string{"a", "b", "n0", "zz"} {
			_ = m.View(id)
		}
		// It keeps working: a join, a heartbeat, an exclusion and time.
		if _, _, err := m.Join(now, JoinRequest{NodeID: "n0", Addr: "10.9.9.9", Nproc: 2}); err != nil {
			t.Fatal(err)
		}
		checkInvariants(t, m)
		checkAssignments(t, m, "join after restore")
		m.Exclude(now, "a", "notice")
		checkInvariants(t, m)
		checkAssignments(t, m, "exclude after restore")
		now, _ = advance(t, m, now, now.Add(time.Hour))
		checkInvariants(t, m)
		checkAssignments(t, m, "an hour after restore")
	})
}

// seedSnapshots are snapshots of a machine along a typical life: open,
// closed, closed with a standby and an exclusion, re-formed, finished.
func seedSnapshots() [][]byte {
	m, err := NewMachine(testConfig(2, 3), "run-seed", t0)
	if err != nil {
		panic(err)
	}
	var out [][]byte
	snap := func() {
		b, _ := json.Marshal(m.Snapshot())
		out = append(out, b)
	}
	j := func(id, zone string) {
		if _, _, err := m.Join(t0, JoinRequest{NodeID: id, Addr: addrOf(id), Zone: zone, Nproc: 2, Session: "s-" + id}); err != nil {
			panic(err)
		}
	}
	j("a", "z1")
	snap()
	j("b", "z2")
	j("c", "z1")
	snap()
	j("d", "z2")
	m.Exclude(t0, "zz", "notice")
	snap()
	m.Exclude(t0, "a", "notice")
	snap()
	m.Finish(t0, true)
	snap()
	return out
}

// FuzzHandler drives the agents' HTTP API with arbitrary methods, bodies,
// query strings and tokens. Answers are never 5xx, always JSON with an
// error code when not 2xx, a long-poll ends with its request, and a
// refused request changes nothing.
func FuzzHandler(f *testing.F) {
	join := func(id string) string {
		b, _ := json.Marshal(JoinRequest{NodeID: id, Addr: addrOf(id), Zone: "z1", Nproc: 2, Session: "s"})
		return string(b)
	}
	f.Add(uint8(0), uint8(0), join("n0"), "")
	f.Add(uint8(0), uint8(1), join("n0"), "")
	f.Add(uint8(1), uint8(0), `{"node_id":"n0","round":1,"step":5,"workers":"running"}`, "")
	f.Add(uint8(2), uint8(0), "", "node=n0&after=1&state=assigned&wait=10ms")
	f.Add(uint8(2), uint8(0), "", "node=n0&after=-1&wait=1h")
	f.Add(uint8(3), uint8(0), `{"node_id":"n0"}`, "")
	f.Add(uint8(0), uint8(0), `{"node_id":"n0","addr":"10.0.0.1","nproc":1}{"x":1}`, "")
	f.Add(uint8(0), uint8(0), `{"node_id":"n0","addr":"10.0.0.1","nproc":1,"evil":true}`, "")
	f.Add(uint8(4), uint8(2), `[]`, "node=n0")
	f.Fuzz(func(t *testing.T, route, tokenSel uint8, body, query string) {
		svc := fuzzService(t)
		h := svc.Handler(testAuth("f", "n0", "n1"))
		// Two members so heartbeats, watches and leaves have a target.
		for _, id := range []string{"n0", "n1"} {
			if _, err := svc.Join(context.Background(), "f", JoinRequest{NodeID: id, Addr: addrOf(id), Zone: "z1", Nproc: 2, Session: "s"}); err != nil {
				t.Fatal(err)
			}
		}
		method, path := http.MethodPost, ""
		switch route % 6 {
		case 0:
			path = "/v1/rendezvous/f/join"
		case 1:
			path = "/v1/rendezvous/f/heartbeat"
		case 2:
			method, path = http.MethodGet, "/v1/rendezvous/f/watch"
		case 3:
			path = "/v1/rendezvous/f/leave"
		case 4:
			method, path = http.MethodGet, "/v1/rendezvous/"+url.PathEscape(body)+"/watch"
		case 5:
			path = "/v1/rendezvous/other/join"
		}
		target := path
		if query != "" {
			target += "?" + url.PathEscape(query)
			if q, err := url.ParseQuery(query); err == nil {
				target = path + "?" + q.Encode()
			}
		}
		req := httptest.NewRequest(method, "http://fleetd"+target, strings.NewReader(body))
		switch tokenSel % 4 {
		case 0:
			req.Header.Set("Authorization", "Bearer tok-n0")
		case 1:
			req.Header.Set("Authorization", "Bearer tok-n1")
		case 2:
			req.Header.Set("Authorization", "Bearer "+body)
		}
		before := statusJSON(t, svc)
		rec := testutil.ServeWithin(t, h, req, 50*time.Millisecond)
		code := rec.Code
		if code >= 500 {
			t.Fatalf("%s %s: HTTP %d %s", method, target, code, rec.Body)
		}
		if code >= 400 {
			var eb ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil && code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
				t.Fatalf("HTTP %d with a non-JSON body %q", code, rec.Body)
			}
			if after := statusJSON(t, svc); !bytes.Equal(before, after) {
				t.Fatalf("refused request (HTTP %d %s) changed the rendezvous:\n%s\n%s", code, rec.Body, before, after)
			}
		}
	})
}

func fuzzService(t *testing.T) *Service {
	t.Helper()
	// A frozen clock: no timer ever finds a deadline due, so nothing
	// changes between two looks except by a request.
	svc := newService(t, Options{Now: func() time.Time { return t0 }, NewRunID: func(string) string { return "run" }})
	if err := svc.Configure(context.Background(), "f", testConfig(3, 4)); err != nil {
		t.Fatal(err)
	}
	return svc
}

func statusJSON(t *testing.T, svc *Service) []byte {
	t.Helper()
	st, err := svc.Status("f")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(st)
	return b
}
