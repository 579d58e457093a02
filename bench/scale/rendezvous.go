package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/fleetd/fleetd/bench/internal/report"
	"github.com/fleetd/fleetd/fleet/state"
)

// rendezvousTargets are the bounds: last join → every agent
// assigned, and daemon CPU with every agent heartbeating every 2 s.
var rendezvousTargets = map[int]float64{1000: 1, 5000: 3}

const cpuTargetCores = 0.5 // for 5,000 agents

// swarmProc is the agent swarm child process.
type swarmProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startSwarm(ctx context.Context, cfgPath string, logTo io.Writer) (*swarmProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, "agents", cfgPath)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logTo
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	return &swarmProc{cmd: cmd, in: in, out: sc}, nil
}

// call sends one command and decodes its reply.
func (s *swarmProc) call(c swarmCmd, reply any) error {
	b, _ := json.Marshal(c)
	if _, err := s.in.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("swarm %s: %w", c.Cmd, err)
	}
	if !s.out.Scan() {
		return fmt.Errorf("swarm %s: no reply (exited: %v)", c.Cmd, s.out.Err())
	}
	if err := json.Unmarshal(s.out.Bytes(), reply); err != nil {
		return fmt.Errorf("swarm %s reply %q: %w", c.Cmd, s.out.Text(), err)
	}
	return nil
}

func (s *swarmProc) stop() error {
	b, _ := json.Marshal(swarmCmd{Cmd: "stop"})
	_, _ = s.in.Write(append(b, '\n'))
	_ = s.in.Close()
	return s.cmd.Wait()
}

// benchRendezvous: n agents join and heartbeat against the real daemon.
func benchRendezvous(ctx context.Context, r *report.Reporter, n int, p params) error {
	name := fmt.Sprintf("rendezvous.%d", n)
	target := rendezvousTargets[n]
	if target == 0 {
		target = 3
	}
	dir, ctx, done, err := scratch(ctx, "rdzv", 5*time.Minute)
	if err != nil {
		return err
	}
	defer done()

	// The nodes are recorded running, as a daemon restarted under a running
	// fleet finds them: the benchmark is the rendezvous, not n one-off
	// node transitions (one durable write each; see the state figures).
	bd, err := newBenchDaemon(ctx, filepath.Join(dir, "data"), "rdzv", n, state.NodeRunning, 10*time.Second)
	if err != nil {
		return err
	}
	defer bd.stop()
	if err := bd.start(ctx); err != nil {
		return err
	}
	cfg := swarmConfig{URL: bd.URL(), Fleet: bd.fleet, Zone: "mem-1a"}
	for i := range n {
		id := bd.nodeID(i)
		cfg.Nodes = append(cfg.Nodes, swarmNode{ID: id, Token: bd.NodeToken(bd.fleet, id), Addr: agentAddr(i)})
	}
	cfgPath := filepath.Join(dir, "swarm.json")
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return err
	}
	sw, err := startSwarm(ctx, cfgPath, os.Stderr)
	if err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = sw.stop()
		}
	}()

	var jr joinReport
	if err := sw.call(swarmCmd{Cmd: "join"}, &jr); err != nil {
		return err
	}
	fmt.Printf("%s: join burst %.2fs (first join sent → last join answered); join → assigned p50 %.2fs p99 %.2fs; round %d world size %d\n",
		name, jr.BurstS, jr.AssignP50S, jr.AssignP99S, jr.Round, jr.WorldSize)
	if jr.Rejoins > 0 {
		fmt.Printf("%s: %d agents were dropped while waiting and joined again\n", name, jr.Rejoins)
	}
	if jr.Failed > 0 || jr.WorldSize != n {
		bd.diagnose(ctx, name)
		r.Missing(name+".last_join_to_all_assigned", "s", report.Less, target,
			fmt.Sprintf("%d agents failed (world size %d), first error: %s", jr.Failed, jr.WorldSize, jr.FirstError))
		return nil
	}
	// The round closes inside the last join (max_nodes reached) and is
	// persisted before that join is answered; from then on it is the
	// announcement to every waiting agent that is measured.
	r.Check(name+".last_join_to_all_assigned", jr.LastJoinDoneS, "s", report.Less, target)
	r.Info(name+".join_burst", jr.BurstS, "s")
	r.Info(name+".all_joins_sent_to_all_assigned", jr.LastJoinSentS, "s")

	// Let the round's side effects (its events, a reconcile pass) pass
	// before the CPU window.
	time.Sleep(4 * time.Second)

	var c0, c1 countReport
	if err := sw.call(swarmCmd{Cmd: "count"}, &c0); err != nil {
		return err
	}
	cpu0, err := report.CPUTime()
	if err != nil {
		return err
	}
	t0 := time.Now()
	time.Sleep(p.CPUWindow)
	cpu1, _ := report.CPUTime()
	wall := time.Since(t0)
	if err := sw.call(swarmCmd{Cmd: "count"}, &c1); err != nil {
		return err
	}
	cores := (cpu1 - cpu0).Seconds() / wall.Seconds()
	hbRate := float64(c1.Heartbeats-c0.Heartbeats) / (float64(c1.UnixNano-c0.UnixNano) / 1e9)
	r.Info(name+".steady_heartbeats_per_s", hbRate, "heartbeats/s")
	if n >= 5000 {
		r.Check(name+".daemon_cpu_heartbeat_2s", cores, "cores", report.Less, cpuTargetCores)
	} else {
		r.Info(name+".daemon_cpu_heartbeat_2s", cores, "cores")
	}
	if c1.Errors > 0 {
		fmt.Printf("%s: %d agent errors so far\n", name, c1.Errors)
	}

	// Flat out: 64 callers heartbeating as fast as they can.
	var fl floodReport
	fcpu0, _ := report.CPUTime()
	if err := sw.call(swarmCmd{Cmd: "flood", Seconds: p.Flood.Seconds()}, &fl); err != nil {
		return err
	}
	fcpu1, _ := report.CPUTime()
	floodSecs := fl.Seconds
	floodCores := (fcpu1 - fcpu0).Seconds() / floodSecs
	fmt.Printf("%s: flood: %.0f heartbeats/s with the daemon at %.2f cores (the swarm shares the same CPUs)\n", name, float64(fl.Heartbeats)/floodSecs, floodCores)
	// The handling rate per core of daemon CPU, from the flood (the most
	// heartbeats per CPU-second measured), is what the machine's CPUs
	// would sustain for the daemon alone.
	r.Info(name+".heartbeats_per_daemon_cpu_second", float64(fl.Heartbeats)/floodSecs/max(floodCores, 1e-9), "heartbeats/s/core")

	stopped = true
	if err := sw.stop(); err != nil {
		fmt.Printf("%s: swarm exit: %v\n", name, err)
	}
	for _, l := range bd.warns.Lines() {
		fmt.Printf("%s: daemon log: %s\n", name, l)
	}
	return nil
}
