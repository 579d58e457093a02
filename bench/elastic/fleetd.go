package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/bench/internal/devd"
	"github.com/fleetd/fleetd/bench/internal/procs"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// fleetdRun runs the job under a real `fleetd serve -dev` with the
// embedded local provider (every node a real agent process tree in a
// session of its own, booted from the daemon's user-data), in restart mode
// or in-process mode, with fleetd's defaults for everything that affects
// recovery (rendezvous last_call 5 s, heartbeat 2 s, dead_after 10 s).
type fleetdRun struct {
	cfg    config
	mode   string // "restart" or "in-process"
	dir    string
	daemon *devd.Daemon
	client *api.Client

	mu     sync.Mutex
	tl     *Timeline
	frozen procs.Frozen // sessions stopped by kill_silent, killed by stop
}

const benchFleet = "bench"

func newFleetd(cfg config, mode, dir string) *fleetdRun {
	return &fleetdRun{cfg: cfg, mode: mode, dir: dir, tl: NewTimeline()}
}

func (f *fleetdRun) name() string {
	return "fleetd " + f.mode
}

func (f *fleetdRun) stateDir() string { return filepath.Join(f.dir, "local") }

func (f *fleetdRun) spec() string {
	cmd, _ := json.Marshal(append([]string{f.cfg.python, f.cfg.script}, f.cfg.trainArgs(filepath.Join(f.dir, "ckpt"))...))
	return fmt.Sprintf(`
fleet %q {
  min_nodes     = 2
  max_nodes     = 3
  desired_nodes = 3

  node {
    gpus      = 1
    gpu_types = ["sim-gpu"]
    spot      = true
  }

  placement {
    colocate = "region"
  }

  provider "local" {
    zones          = ["local-a", "local-b", "local-c"]
    state_dir      = %q
    address_prefix = "127.0.78."
    instance_types = {
      "sim-gpu-1" = {
        gpus            = 1
        gpu_type        = "sim-gpu"
        vcpus           = 4
        memory_gib      = 16
        spot_price      = 0.35
        on_demand_price = 1.10
      }
    }
    notice_lead = %q
  }

  training {
    command        = %s
    nproc_per_node = 1
    max_restarts   = 10
    elastic        = %q
    env = {
      OMP_NUM_THREADS  = "1"
      PYTHONUNBUFFERED = "1"
    }
  }
}
`, benchFleet, f.stateDir(), f.cfg.lead.String(), cmd, f.mode)
}

func (f *fleetdRun) start(ctx context.Context) error {
	d, err := devd.Start(ctx, f.cfg.fleetd, f.dir)
	f.daemon = d
	if err != nil {
		return err
	}
	f.client = d.Client
	if _, err := f.client.Apply(ctx, api.ApplyRequest{Filename: "bench.hcl", Source: f.spec()}); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	go f.follow(ctx)
	say("%s: dev daemon up, fleet applied (3 local nodes, elastic = %q)", f.name(), f.mode)
	return nil
}

func (f *fleetdRun) stop() {
	f.daemon.Stop()
	for _, n := range f.instances() {
		procs.KillSession(n.PID)
	}
	f.frozen.KillAll()
}

func (f *fleetdRun) instances() []devd.Instance { return devd.Instances(f.stateDir()) }

// follow rebuilds the timeline from every node's worker logs
// (root/var/log/fleetd/round-N/rank-R.log) four times a second.
func (f *fleetdRun) follow(ctx context.Context) {
	for ctx.Err() == nil {
		tl := NewTimeline()
		for _, in := range f.instances() {
			node := in.Tags[providers.TagNodeID]
			files, _ := filepath.Glob(filepath.Join(in.Dir, "root", "var", "log", "fleetd", "round-*", "rank-*.log"))
			for _, p := range files {
				fh, err := os.Open(p)
				if err != nil {
					continue
				}
				sc := bufio.NewScanner(fh)
				sc.Buffer(make([]byte, 64*1024), 1<<20)
				for sc.Scan() {
					tl.Add(node, sc.Text())
				}
				fh.Close()
			}
		}
		f.mu.Lock()
		f.tl = tl
		f.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (f *fleetdRun) timeline() *Timeline {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tl
}

func (f *fleetdRun) live() []string {
	det, err := f.client.Fleet(context.Background(), benchFleet)
	if err != nil {
		return nil
	}
	var out []string
	for _, n := range det.Nodes {
		if n.State == "running" {
			out = append(out, n.ID)
		}
	}
	sort.Strings(out)
	return out
}

func (f *fleetdRun) victim() (string, error) {
	for _, n := range f.live() {
		if r, ok := f.timeline().Rank(n); ok && r != 0 {
			return n, nil
		}
	}
	return "", fmt.Errorf("no fleetd node other than rank 0's among %v", f.live())
}

func (f *fleetdRun) kill(node string) error {
	for _, in := range f.instances() {
		if in.Tags[providers.TagNodeID] == node && in.PID > 0 {
			procs.KillSession(in.PID)
			return nil
		}
	}
	return fmt.Errorf("no local instance for node %s", node)
}

// events returns the daemon's events since from (bounded).
func (f *fleetdRun) events(ctx context.Context) []state.Event {
	var out []state.Event
	var from uint64
	for range 200 {
		resp, err := f.client.Events(ctx, from, 500, 0)
		if err != nil || len(resp.Events) == 0 {
			break
		}
		out = append(out, resp.Events...)
		from = resp.Next
	}
	return out
}

// add waits for the replacement the daemon launched for the lost node to
// join the rendezvous (the daemon's member_joined event).
func (f *fleetdRun) add(ctx context.Context, since time.Time) (string, time.Time, time.Time, error) {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, e := range f.events(ctx) {
			if e.Type == "rendezvous.member_joined" && !e.Time.Before(since) {
				in, err := devd.Find(f.stateDir(), e.Node)
				if err != nil {
					return "", time.Time{}, time.Time{}, err
				}
				started, err := in.AgentStarted()
				if err != nil {
					return "", time.Time{}, time.Time{}, fmt.Errorf("%s: %w", e.Node, err)
				}
				return e.Node, e.Time, started, nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return "", time.Time{}, time.Time{}, errors.New("no replacement joined the rendezvous")
}

// silence stops every process of the node's session (SIGSTOP); stop kills it.
func (f *fleetdRun) silence(node string) int {
	in, err := devd.Find(f.stateDir(), node)
	if err != nil || in.PID <= 0 {
		return 0
	}
	return f.frozen.Stop(in.PID)
}

// notice injects a spot notice into the node's metadata service; known
// is when the daemon had it (its notice event).
func (f *fleetdRun) notice(ctx context.Context, node string) (time.Time, time.Time, error) {
	t0 := time.Now()
	err := f.client.Do(ctx, http.MethodPost, "/v1/fleets/"+benchFleet+"/nodes/"+node+"/interrupt", nil,
		api.InterruptRequest{Kind: "spot-interruption", Lead: f.cfg.lead}, nil)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("interrupt %s: %w", node, err)
	}
	say("%s: spot notice injected on node %s (deadline in %s)", f.name(), node, f.cfg.lead)
	return time.Time{}, f.lossKnown(node, t0), nil
}

// lossKnown is when the daemon learned of the node's notice or loss
// after since (its notice event), waiting a little for it.
func (f *fleetdRun) lossKnown(node string, since time.Time) time.Time {
	for range 100 {
		for _, e := range f.events(context.Background()) {
			if e.Type == "notice" && e.Node == node && !e.Time.Before(since) {
				return e.Time
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Time{}
}

// agentExplains are the agent log lines that explain a change.
var agentExplains = map[string][]string{
	"workers stopped":                                     {"round", "took", "sigkilled"},
	"workers checkpointed and stopped":                    {"round", "took", "checkpoint_step"},
	"worker started":                                      {"round", "rank", "warm"},
	"the master's store listens":                          {"round", "after"},
	"asking workers to checkpoint before they stop":       {"round", "bound"},
	"in-process: new round handed to the running workers": {"round", "world_size", "took"},
	"in-process: asking the workers to leave the job":     {"round"},
	"in-process: the workers left the job":                {"round", "took"},
	"fleetd_elastic: worker agreed":                       {"round", "step", "took"},
	"fleetd_elastic: worker joined":                       {"round", "world_size", "step", "took"},
	"fleetd_elastic: worker synced":                       {"round", "bytes", "seconds", "mib_per_s", "why"},
	"fleetd_elastic: worker collective-failed":            {"round", "step"},
	"fleetd_elastic: worker reconfigured":                 {"round", "took"},
}

func (f *fleetdRun) notes(from, to time.Time) []note {
	var out []note
	for _, e := range f.events(context.Background()) {
		if e.Time.Before(from) || e.Time.After(to) {
			continue
		}
		if e.Type == "notice" || e.Type == "node.transition" || strings.HasPrefix(e.Type, "rendezvous.") {
			out = append(out, note{e.Time, "daemon " + e.Type + ": " + e.Message})
		}
	}
	for _, in := range f.instances() {
		node := in.Tags[providers.TagNodeID]
		fh, err := os.Open(filepath.Join(in.Dir, "root", "var", "log", "fleetd", "agent.log"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for sc.Scan() {
			var l map[string]any
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue
			}
			msg, _ := l["msg"].(string)
			attrs, ok := agentExplains[msg]
			if !ok {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(l["time"]))
			if err != nil || at.Before(from) || at.After(to) {
				continue
			}
			var kv []string
			for _, a := range attrs {
				if v, ok := l[a]; ok {
					kv = append(kv, fmt.Sprintf("%s=%v", a, v))
				}
			}
			out = append(out, note{at, fmt.Sprintf("agent %s: %s (%s)", node, msg, strings.Join(kv, " "))})
		}
		fh.Close()
	}
	return out
}
