package driver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleetd/bench/internal/devd"
	"github.com/fleetd/fleetd/bench/internal/procs"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
)

// Fleet is the benchmarks' fleet name.
const Fleet = "bench"

// Spec is the benchmarks' fleet: 3 nodes of 1 GPU, min 2, on the local
// provider, with fleetd's defaults for everything that affects recovery
// (rendezvous last_call 5 s, heartbeat 2 s, dead_after 10 s). Three zones
// so that a replacement has a spot offering once the lost node's offering
// is marked interrupted.
type Spec struct {
	StateDir      string
	AddressPrefix string // the nodes' loopback addresses, e.g. "127.0.77."
	Lead          time.Duration
	// Command is the worker's command line, the same as under torchrun.
	Command []string
	// Elastic is the training block's elastic mode ("": the default).
	Elastic string
}

// HCL renders the spec.
func (s Spec) HCL() string {
	cmd, _ := json.Marshal(s.Command)
	elastic := ""
	if s.Elastic != "" {
		elastic = fmt.Sprintf("\n    elastic        = %q", s.Elastic)
	}
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
    address_prefix = %q
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
    max_restarts   = 10%s
    env = {
      OMP_NUM_THREADS  = "1"
      PYTHONUNBUFFERED = "1"
    }
  }
}
`, Fleet, s.StateDir, s.AddressPrefix, s.Lead.String(), cmd, elastic)
}

// Fleetd is a real `fleetd serve -dev` with the embedded local provider
// running the benchmark's fleet: every node a real agent process tree in
// a session of its own, booted from the daemon's cloud-init user-data.
type Fleetd struct {
	Daemon *devd.Daemon
	Client *api.Client
	dir    string
	frozen procs.Frozen // sessions stopped by Silence, killed by Stop
}

// StateDir is the local provider's state directory under dir.
func StateDir(dir string) string { return filepath.Join(dir, "local") }

// StartFleetd runs bin's dev daemon with its data in dir and applies
// spec. The Fleetd is returned with the error too, for Stop.
func StartFleetd(ctx context.Context, bin, dir string, spec Spec) (*Fleetd, error) {
	f := &Fleetd{dir: dir}
	d, err := devd.Start(ctx, bin, dir)
	f.Daemon = d
	if err != nil {
		return f, err
	}
	f.Client = d.Client
	if _, err := f.Client.Apply(ctx, api.ApplyRequest{Filename: "bench.hcl", Source: spec.HCL()}); err != nil {
		return f, fmt.Errorf("apply: %w", err)
	}
	return f, nil
}

// Stop ends the dev daemon (which terminates its nodes) and then powers
// off whatever node is still up, silenced ones too.
func (f *Fleetd) Stop() {
	f.Daemon.Stop()
	for _, n := range f.Instances() {
		procs.KillSession(n.PID)
	}
	f.frozen.KillAll()
}

// Instances are the local provider's instances.
func (f *Fleetd) Instances() []devd.Instance { return devd.Instances(StateDir(f.dir)) }

// Find is node's instance.
func (f *Fleetd) Find(node string) (devd.Instance, error) { return devd.Find(StateDir(f.dir), node) }

// Follow rebuilds a timeline from every node's per-round worker log files
// (root/var/log/fleetd/round-N/rank-R.log, rounds in order) four times a
// second: fresh makes an empty one, publish hands over a full one.
func Follow[T interface{ Add(node, line string) }](ctx context.Context, f *Fleetd, fresh func() T, publish func(T)) {
	for ctx.Err() == nil {
		tl := fresh()
		for _, in := range f.Instances() {
			node := in.Tags[providers.TagNodeID]
			rounds, _ := filepath.Glob(filepath.Join(in.Dir, "root", "var", "log", "fleetd", "round-*"))
			sort.Slice(rounds, func(i, j int) bool { return roundNum(rounds[i]) < roundNum(rounds[j]) })
			for _, rd := range rounds {
				files, _ := filepath.Glob(filepath.Join(rd, "rank-*.log"))
				sort.Strings(files)
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
		}
		publish(tl)
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func roundNum(dir string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), "round-"))
	return n
}

// Running are the fleet's nodes the daemon has running, sorted.
func (f *Fleetd) Running(ctx context.Context) ([]string, error) {
	det, err := f.Client.Fleet(ctx, Fleet)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range det.Nodes {
		if n.State == "running" {
			out = append(out, n.ID)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Session is the session of node's instance.
func (f *Fleetd) Session(node string) (int, error) {
	for _, in := range f.Instances() {
		if in.Tags[providers.TagNodeID] == node && in.PID > 0 {
			return in.PID, nil
		}
	}
	return 0, fmt.Errorf("no local instance for node %s", node)
}

// Kill powers node off: SIGKILL to its session. It returns how many
// processes it killed.
func (f *Fleetd) Kill(node string) (int, error) {
	sid, err := f.Session(node)
	if err != nil {
		return 0, err
	}
	return procs.KillSession(sid), nil
}

// Silence stops every process of node's session (SIGSTOP) until Stop;
// it returns how many it stopped.
func (f *Fleetd) Silence(node string) int {
	sid, err := f.Session(node)
	if err != nil {
		return 0
	}
	return f.frozen.Stop(sid)
}

// Interrupt injects a spot notice with the lead into node's metadata
// service (the agent sees it there, as on EC2).
func (f *Fleetd) Interrupt(ctx context.Context, node string, lead time.Duration) error {
	err := f.Client.Do(ctx, http.MethodPost, "/v1/fleets/"+Fleet+"/nodes/"+node+"/interrupt", nil,
		api.InterruptRequest{Kind: "spot-interruption", Lead: lead}, nil)
	if err != nil {
		return fmt.Errorf("interrupt %s: %w", node, err)
	}
	return nil
}

// Events are the daemon's events (at most 200 pages of 500).
func (f *Fleetd) Events(ctx context.Context) []state.Event {
	var out []state.Event
	var from uint64
	for range 200 {
		resp, err := f.Client.Events(ctx, from, 500, 0)
		if err != nil || len(resp.Events) == 0 {
			break
		}
		out = append(out, resp.Events...)
		from = resp.Next
	}
	return out
}

// Explain is an agent log message that explains a change, with the
// attributes shown.
type Explain struct {
	Msg   string
	Attrs []string
}

// Notes are the daemon's events that explain a recovery (notices, node
// transitions, rendezvous rounds) and every node's agent log lines among
// explains.
func (f *Fleetd) Notes(ctx context.Context, explains []Explain) []Note {
	var out []Note
	for _, e := range f.Events(ctx) {
		if e.Type == "notice" || e.Type == "node.transition" || strings.HasPrefix(e.Type, "rendezvous.") {
			out = append(out, Note{e.Time, "daemon event " + e.Type + ": " + e.Message})
		}
	}
	for _, in := range f.Instances() {
		out = append(out, AgentNotes(in.Tags[providers.TagNodeID], in.AgentLog(), explains)...)
	}
	return out
}

// AgentNotes reads one node's agent log (JSON lines) for explains.
func AgentNotes(node, file string, explains []Explain) []Note {
	fh, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer fh.Close()
	var out []Note
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(l["time"]))
		if err != nil {
			continue
		}
		for _, x := range explains {
			if l["msg"] != x.Msg {
				continue
			}
			var kv []string
			for _, a := range x.Attrs {
				if v, ok := l[a]; ok {
					kv = append(kv, fmt.Sprintf("%s=%v", a, v))
				}
			}
			out = append(out, Note{at, fmt.Sprintf("agent %s: %s (%s)", node, x.Msg, strings.Join(kv, " "))})
		}
	}
	return out
}
