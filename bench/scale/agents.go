package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleetd/bench/internal/report"
	"github.com/fleetd/fleetd/rendezvous"
)

// The agent swarm runs in its own process (`scale agents FILE`), so the
// daemon's CPU time can be read from the daemon's process alone. Each
// simulated agent does what the real agent does in the rendezvous, over
// the real HTTP client: join, long-poll its view (joining again if it was
// dropped), heartbeat at the interval the daemon asks for. Registration
// (one durable state write per node) is not part of this benchmark; see
// the state figures. The parent drives the swarm with one JSON command per
// stdin line and reads one JSON reply per stdout line.

// swarmConfig is the file the parent writes for the swarm.
type swarmConfig struct {
	URL   string      `json:"url"`
	Fleet string      `json:"fleet"`
	Nodes []swarmNode `json:"nodes"`
	Zone  string      `json:"zone"`
}

type swarmNode struct {
	ID    string `json:"id"`
	Token string `json:"token"`
	Addr  string `json:"addr"`
}

// swarmCmd is one command from the parent.
type swarmCmd struct {
	Cmd     string  `json:"cmd"` // join | count | flood | stop
	Seconds float64 `json:"seconds,omitempty"`
}

// joinReport is the swarm's answer to join; durations are measured within
// the swarm, on its clock.
type joinReport struct {
	Agents        int     `json:"agents"`
	Failed        int     `json:"failed"`
	FirstError    string  `json:"first_error,omitempty"`
	LastJoinSentS float64 `json:"last_join_sent_to_all_assigned_s"`
	LastJoinDoneS float64 `json:"last_join_returned_to_all_assigned_s"`
	BurstS        float64 `json:"first_join_sent_to_last_join_returned_s"`
	AssignP50S    float64 `json:"join_to_assigned_p50_s"`
	AssignP99S    float64 `json:"join_to_assigned_p99_s"`
	Rejoins       int     `json:"rejoins"`
	Round         int     `json:"round"`
	WorldSize     int     `json:"world_size"`
}

// countReport answers count: heartbeats so far, at UnixNano.
type countReport struct {
	Heartbeats int64 `json:"heartbeats"`
	Errors     int64 `json:"errors"`
	UnixNano   int64 `json:"unix_nano"`
}

// floodReport answers flood: heartbeats answered during Seconds.
type floodReport struct {
	Heartbeats int64   `json:"heartbeats"`
	Seconds    float64 `json:"seconds"`
}

type swarm struct {
	cfg  swarmConfig
	hc   *http.Client
	out  *json.Encoder
	outM sync.Mutex

	heartbeats, errors atomic.Int64
	round              atomic.Int64 // the round the agents run, for flood heartbeats
	rejoins            atomic.Int64
	firstErr           atomic.Value
	ctx                context.Context
	cancel             context.CancelFunc
	wg                 sync.WaitGroup
}

func runSwarm(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var cfg swarmConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	n := len(cfg.Nodes)
	// One connection per agent for its long-poll and one for its
	// heartbeats, as n separate agents would hold.
	tr := &http.Transport{MaxIdleConns: 2*n + 64, MaxIdleConnsPerHost: 2*n + 64, IdleConnTimeout: 5 * time.Minute}
	s := &swarm{cfg: cfg, hc: &http.Client{Transport: tr}, out: json.NewEncoder(os.Stdout)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	defer s.cancel()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var c swarmCmd
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			return fmt.Errorf("command %q: %w", in.Text(), err)
		}
		switch c.Cmd {
		case "join":
			s.reply(s.joinAll())
		case "count":
			s.reply(countReport{Heartbeats: s.heartbeats.Load(), Errors: s.errors.Load(), UnixNano: time.Now().UnixNano()})
		case "flood":
			s.reply(s.flood(time.Duration(c.Seconds * float64(time.Second))))
		case "stop":
			s.cancel()
			s.wg.Wait()
			tr.CloseIdleConnections()
			return nil
		default:
			return fmt.Errorf("unknown command %q", c.Cmd)
		}
	}
	return in.Err()
}

func (s *swarm) reply(v any) {
	s.outM.Lock()
	defer s.outM.Unlock()
	_ = s.out.Encode(v)
}

func (s *swarm) fail(err error) {
	s.errors.Add(1)
	s.firstErr.CompareAndSwap(nil, err.Error())
}

// joinAll starts every agent at once: join, then heartbeat (from the
// moment it joined, as dead_after counts) and watch. It returns when every
// agent holds its assignment, or after a minute.
func (s *swarm) joinAll() joinReport {
	n := len(s.cfg.Nodes)
	sent := make([]time.Time, n)
	joined := make([]time.Time, n)
	assigned := make([]time.Time, n)
	views := make([]rendezvous.View, n)
	var done sync.WaitGroup
	var failed atomic.Int64
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	for i, nd := range s.cfg.Nodes {
		done.Add(1)
		s.wg.Go(func() {
			c := rendezvous.NewClient(s.cfg.URL, nd.Token, s.hc)
			req := rendezvous.JoinRequest{NodeID: nd.ID, Addr: nd.Addr, Zone: s.cfg.Zone, Nproc: 1, Session: rendezvous.NewSession()}
			sent[i] = time.Now()
			v, err := c.Join(ctx, s.cfg.Fleet, req)
			joined[i] = time.Now()
			if err == nil {
				s.wg.Go(func() { s.heartbeatLoop(c, nd.ID, v) })
			}
			for err == nil && v.State != rendezvous.NodeAssigned {
				if v.State == rendezvous.NodeUnknown {
					// Dropped (e.g. heartbeats answered too late): a real
					// agent joins again, with the same session.
					s.rejoins.Add(1)
					v, err = c.Join(ctx, s.cfg.Fleet, req)
					continue
				}
				v, err = c.Watch(ctx, s.cfg.Fleet, nd.ID, v)
			}
			assigned[i], views[i] = time.Now(), v
			if err != nil {
				failed.Add(1)
				s.fail(fmt.Errorf("agent %s: %w", nd.ID, err))
			}
			done.Done()
			// Like a real agent, keep watching for the next change.
			for err == nil && s.ctx.Err() == nil {
				v, err = c.Watch(s.ctx, s.cfg.Fleet, nd.ID, v)
			}
		})
	}
	done.Wait()
	rep := joinReport{Agents: n, Failed: int(failed.Load()), Rejoins: int(s.rejoins.Load())}
	if e, ok := s.firstErr.Load().(string); ok {
		rep.FirstError = e
	}
	var lastSent, lastJoined, firstSent, allAssigned time.Time
	var lat []time.Duration
	for i := range n {
		if firstSent.IsZero() || sent[i].Before(firstSent) {
			firstSent = sent[i]
		}
		if sent[i].After(lastSent) {
			lastSent = sent[i]
		}
		if joined[i].After(lastJoined) {
			lastJoined = joined[i]
		}
		if assigned[i].After(allAssigned) {
			allAssigned = assigned[i]
		}
		lat = append(lat, assigned[i].Sub(sent[i]))
	}
	rep.LastJoinSentS = allAssigned.Sub(lastSent).Seconds()
	rep.LastJoinDoneS = max(allAssigned.Sub(lastJoined), 0).Seconds()
	rep.BurstS = lastJoined.Sub(firstSent).Seconds()
	rep.AssignP50S = report.Quantile(lat, 0.5).Seconds()
	rep.AssignP99S = report.Quantile(lat, 0.99).Seconds()
	if a := views[0].Assignment; a != nil {
		rep.Round, rep.WorldSize = a.Round, a.WorldSize
		s.round.Store(int64(a.Round))
	}
	return rep
}

// heartbeatLoop heartbeats at the interval the daemon asks for, starting
// at a random point of the first interval (agents do not boot in lockstep).
func (s *swarm) heartbeatLoop(c *rendezvous.Client, node string, v rendezvous.View) {
	every := time.Duration(v.HeartbeatMS) * time.Millisecond
	if every <= 0 {
		every = 2 * time.Second
	}
	t := time.NewTimer(rand.N(every))
	defer t.Stop()
	step := int64(0)
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		step++
		r, err := c.Heartbeat(s.ctx, s.cfg.Fleet, rendezvous.HeartbeatRequest{NodeID: node, Round: v.Round, Step: &step, Workers: "running"})
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.fail(fmt.Errorf("heartbeat %s: %w", node, err))
		} else {
			s.heartbeats.Add(1)
			if r.HeartbeatMS > 0 {
				every = time.Duration(r.HeartbeatMS) * time.Millisecond
			}
			if r.State == rendezvous.NodeAssigned {
				v.Round = r.Round
			}
		}
		t.Reset(every)
	}
}

// flood heartbeats as fast as 64 concurrent callers can, round-robin over
// the agents, on top of the periodic heartbeats: the daemon's maximum
// heartbeat handling rate on this machine (both processes share its CPUs).
func (s *swarm) flood(d time.Duration) floodReport {
	before := s.heartbeats.Load()
	ctx, cancel := context.WithTimeout(s.ctx, d)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 64 {
		wg.Go(func() {
			step := int64(0)
			for ctx.Err() == nil {
				nd := s.cfg.Nodes[int(next.Add(1))%len(s.cfg.Nodes)]
				c := rendezvous.NewClient(s.cfg.URL, nd.Token, s.hc)
				step++
				if _, err := c.Heartbeat(ctx, s.cfg.Fleet, rendezvous.HeartbeatRequest{NodeID: nd.ID, Round: int(s.round.Load()), Step: &step, Workers: "running"}); err != nil {
					if ctx.Err() == nil {
						s.fail(err)
					}
					continue
				}
				s.heartbeats.Add(1)
			}
		})
	}
	wg.Wait()
	return floodReport{Heartbeats: s.heartbeats.Load() - before, Seconds: time.Since(start).Seconds()}
}
