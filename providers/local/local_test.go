package local_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/procstat"

	"github.com/fleetd/fleetd/agent"
	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/interruption/imds"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/local"
)

type env struct {
	t   *testing.T
	dir string
	p   providers.Provider
	cfg providers.Config
}

// newEnv returns a provider over a fresh state dir; every node it leaves
// running is deleted when the test ends.
func newEnv(t *testing.T, block string) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, dir: dir, cfg: providers.Config{Fleet: "test", Raw: json.RawMessage(block)}}
	e.p = e.provider()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		insts, err := e.p.List(ctx, e.cfg, nil)
		if err != nil {
			t.Errorf("cleanup list: %v", err)
		}
		for _, in := range insts {
			if err := e.p.Delete(ctx, e.cfg, in.ID); err != nil {
				t.Errorf("cleanup delete %s: %v", in.ID, err)
			}
		}
	})
	return e
}

// provider returns a new provider value over the same state dir, as a
// restarted daemon or plugin process would build.
func (e *env) provider() providers.Provider {
	return local.New(local.Options{StateDir: e.dir, StopGrace: 2 * time.Second})
}

func spot(zone string) providers.Offering {
	return providers.Offering{Provider: "local", Region: "local", Zone: zone, InstanceType: "local.gpu1", CapacityType: providers.Spot}
}

func (e *env) create(req providers.LaunchRequest) providers.Instance {
	e.t.Helper()
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Offering.Zone == "" {
		req.Offering = spot("local-a")
	}
	insts, err := e.p.Create(e.t.Context(), e.cfg, req)
	if err != nil {
		e.t.Fatalf("Create: %v", err)
	}
	if len(insts) != req.Count {
		e.t.Fatalf("Create returned %d instances, want %d", len(insts), req.Count)
	}
	return insts[0]
}

func (e *env) waitState(id string, want providers.InstanceState, limit time.Duration) providers.Instance {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		in, err := e.p.Get(e.t.Context(), e.cfg, id)
		if err != nil {
			e.t.Fatalf("Get %s: %v", id, err)
		}
		if in.State == want {
			return in
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s still %s after %v, want %s; console:\n%s", id, in.State, limit, want, e.console(id))
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (e *env) console(id string) string {
	var b strings.Builder
	for _, f := range []string{"console.log", "agent.console.log"} {
		data, _ := os.ReadFile(filepath.Join(e.dir, "instances", id, f))
		fmt.Fprintf(&b, "== %s\n%s", f, data)
	}
	return b.String()
}

// pids returns the node's supervisor and agent pids from the on-disk
// records (the layout is documented in docs/providers/local.md).
func (e *env) pids(id string) (supervisor, agentPID int) {
	e.t.Helper()
	var rec struct {
		PID int `json:"pid"`
	}
	var st struct {
		AgentPID int `json:"agent_pid"`
	}
	readJSON(e.t, filepath.Join(e.dir, "instances", id, "instance.json"), &rec)
	readJSON(e.t, filepath.Join(e.dir, "instances", id, "status.json"), &st)
	if rec.PID == 0 || st.AgentPID == 0 {
		e.t.Fatalf("node %s: pids not recorded (%d, %d)", id, rec.PID, st.AgentPID)
	}
	return rec.PID, st.AgentPID
}

func (e *env) root(id string) string { return filepath.Join(e.dir, "instances", id, "root") }

func readJSON(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// gone reports whether pid has exited (a zombie awaiting its parent's
// wait counts as exited).
func gone(pid int) bool {
	st, err := procstat.Read(pid)
	return err != nil || st.Exited()
}

// sessionSize counts the live processes whose session id is sid.
func sessionSize(sid int) int { return len(procstat.SessionMembers(sid)) }

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, limit, 25*time.Millisecond, what, cond)
}

func imdsClient(t *testing.T, in providers.Instance, e *env) *imds.Client {
	t.Helper()
	var rec struct {
		MetadataURL string `json:"metadata_url"`
	}
	readJSON(t, filepath.Join(e.dir, "instances", in.ID, "instance.json"), &rec)
	c, err := imds.NewClient(rec.MetadataURL)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCreateIsIdempotentAndNodesGetOwnAddresses(t *testing.T) {
	e := newEnv(t, `{}`)
	tags := map[string]string{providers.TagFleet: "test", providers.TagNodeID: "n1"}
	a := e.create(providers.LaunchRequest{IdempotencyToken: "tok-1", Tags: tags})
	again := e.create(providers.LaunchRequest{IdempotencyToken: "tok-1", Tags: tags})
	if again.ID != a.ID || again.Address != a.Address {
		t.Fatalf("retry with the same token launched %s (%s), first was %s (%s)", again.ID, again.Address, a.ID, a.Address)
	}
	b := e.create(providers.LaunchRequest{IdempotencyToken: "tok-2", Offering: spot("local-b")})
	if a.ID == b.ID || a.Address == b.Address {
		t.Fatalf("two nodes share id or address: %+v %+v", a, b)
	}
	for _, in := range []providers.Instance{a, b} {
		if !strings.HasPrefix(in.Address, "127.0.10.") {
			t.Fatalf("address %q not in 127.0.10.0/24", in.Address)
		}
	}
	if _, err := e.p.Create(t.Context(), e.cfg, providers.LaunchRequest{IdempotencyToken: "tok-1", Count: 2, Offering: spot("local-a")}); !providers.IsInvalidConfig(err) {
		t.Fatalf("token reused with another count: err = %v", err)
	}

	a = e.waitState(a.ID, providers.StateRunning, 10*time.Second)
	if a.Tags[providers.TagNodeID] != "n1" || a.Offering.PricePerHour != 0.30 || a.Offering.GPUs != 1 {
		t.Fatalf("instance %+v", a)
	}
	// Each node's metadata service is on its own address and knows who it is.
	c := imdsClient(t, a, e)
	if !strings.HasPrefix(c.BaseURL, "http://"+a.Address+":") {
		t.Fatalf("metadata URL %s not on the node's address %s", c.BaseURL, a.Address)
	}
	for path, want := range map[string]string{
		imds.PathInstanceID:                     a.ID,
		"meta-data/local-ipv4":                  a.Address,
		"meta-data/placement/availability-zone": "local-a",
		"meta-data/instance-life-cycle":         "spot",
		"meta-data/instance-type":               "local.gpu1",
	} {
		got, err := c.Get(t.Context(), path)
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", path, got, err, want)
		}
	}
	if _, err := c.Get(t.Context(), imds.PathInstanceAction); !errors.Is(err, imds.ErrNotFound) {
		t.Errorf("instance-action before any notice: %v", err)
	}
	// Without user-data the node booted a generated agent config.
	cfg, err := agent.LoadConfig(filepath.Join(e.root(a.ID), "etc/fleetd/agent.json"))
	if err != nil || cfg.Fleet != "test" || cfg.NodeID != "n1" || cfg.Metadata.Kind != agent.MetadataAWSIMDS {
		t.Fatalf("generated agent config %+v, %v", cfg, err)
	}
}

func TestCapacityLimitsConcurrentSpot(t *testing.T) {
	e := newEnv(t, `{"capacity": {"local-a": 1}}`)
	first := e.create(providers.LaunchRequest{})
	_, err := e.p.Create(t.Context(), e.cfg, providers.LaunchRequest{Offering: spot("local-a"), Count: 1})
	if !providers.IsCapacity(err) {
		t.Fatalf("second spot in a full zone: err = %v, want a capacity error", err)
	}
	var pe *providers.Error
	if !errors.As(err, &pe) || pe.Offering != "local/local/local-a/local.gpu1/spot" {
		t.Fatalf("capacity error does not name the offering: %#v", err)
	}
	od := spot("local-a")
	od.CapacityType = providers.OnDemand
	e.create(providers.LaunchRequest{Offering: od})              // on-demand is not limited
	e.create(providers.LaunchRequest{Offering: spot("local-b")}) // nor are other zones

	offs, err := e.p.Offerings(t.Context(), e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	avail := map[string]int{}
	for _, o := range offs {
		avail[o.Key()] = o.Available
	}
	if avail["local/local/local-a/local.gpu1/spot"] != 0 || avail["local/local/local-b/local.gpu1/spot"] != -1 || len(offs) != 4 {
		t.Fatalf("offerings availability %v", avail)
	}

	if err := e.p.Delete(t.Context(), e.cfg, first.ID); err != nil {
		t.Fatal(err)
	}
	e.create(providers.LaunchRequest{}) // capacity freed
}

func TestDeleteKillsTheNode(t *testing.T) {
	e := newEnv(t, `{}`)
	in := e.create(providers.LaunchRequest{})
	e.waitState(in.ID, providers.StateRunning, 10*time.Second)
	sup, ag := e.pids(in.ID)
	if gone(sup) || gone(ag) {
		t.Fatal("node processes not running before Delete")
	}
	if err := e.p.Delete(t.Context(), e.cfg, in.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "node processes to be reaped", func() bool { return gone(sup) && gone(ag) })
	if n := sessionSize(sup); n != 0 {
		t.Fatalf("%d processes left in the node's session", n)
	}
	got, err := e.p.Get(t.Context(), e.cfg, in.ID)
	if err != nil || got.State != providers.StateTerminated || got.Interruption != nil {
		t.Fatalf("after Delete: %+v, %v", got, err)
	}
	if err := e.p.Delete(t.Context(), e.cfg, in.ID); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if err := e.p.Delete(t.Context(), e.cfg, "i-00000000000000000"); err != nil {
		t.Fatalf("Delete of an unknown id: %v", err)
	}
	if _, err := e.p.Get(t.Context(), e.cfg, "i-00000000000000000"); !providers.IsNotFound(err) {
		t.Fatalf("Get of an unknown id: %v", err)
	}
	if _, err := e.p.Get(t.Context(), e.cfg, "../../etc"); !providers.IsNotFound(err) {
		t.Fatalf("Get of a path-like id: %v", err)
	}
}

// TestKilledProcessIsAnUnannouncedLoss: a node whose agent or supervisor
// is killed is lost, unannounced, and its other process goes too.
func TestKilledProcessIsAnUnannouncedLoss(t *testing.T) {
	cases := []struct {
		name       string
		killAgent  bool   // else the supervisor
		otherGoing string // what the other process's end is
	}{
		{"agent", true, "the supervisor to power the node off"},
		{"supervisor", false, "the orphaned agent to be killed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, `{}`)
			in := e.create(providers.LaunchRequest{})
			e.waitState(in.ID, providers.StateRunning, 10*time.Second)
			sup, ag := e.pids(in.ID)
			killed, other := sup, ag
			if tc.killAgent {
				killed, other = ag, sup
			}
			if err := syscall.Kill(killed, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			got := e.waitState(in.ID, providers.StateTerminated, 5*time.Second)
			if got.Interruption == nil || got.Interruption.Kind != string(interruption.Lost) {
				t.Fatalf("interruption %+v, want lost", got.Interruption)
			}
			waitFor(t, 5*time.Second, tc.otherGoing, func() bool { return gone(other) })
			// Still listed (crash adoption must see losses), and stays terminated.
			list, err := e.provider().List(t.Context(), e.cfg, nil)
			if err != nil || len(list) != 1 || list[0].State != providers.StateTerminated {
				t.Fatalf("List after loss: %+v, %v", list, err)
			}
		})
	}
}

func TestNewProviderFindsRunningNodes(t *testing.T) {
	e := newEnv(t, `{}`)
	fleetTags := map[string]string{providers.TagFleet: "test", providers.TagDaemonID: "d1"}
	ids := map[string]string{}
	for i := range 2 {
		tags := map[string]string{providers.TagNodeID: fmt.Sprint("n", i)}
		for k, v := range fleetTags {
			tags[k] = v
		}
		in := e.create(providers.LaunchRequest{Tags: tags, IdempotencyToken: fmt.Sprint("t", i)})
		ids[in.ID] = in.Address
	}
	e.create(providers.LaunchRequest{Tags: map[string]string{providers.TagFleet: "other"}})

	fresh := e.provider() // as after a daemon or plugin restart
	list, err := fresh.List(t.Context(), e.cfg, fleetTags)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("List by tags found %d instances, want 2: %+v", len(list), list)
	}
	for _, in := range list {
		if ids[in.ID] != in.Address || in.State == providers.StateTerminated {
			t.Fatalf("listed %+v", in)
		}
	}
	// The idempotency token still holds across the restart.
	insts, err := fresh.Create(t.Context(), e.cfg, providers.LaunchRequest{Offering: spot("local-a"), Count: 1, IdempotencyToken: "t0"})
	if err != nil || len(insts) != 1 || ids[insts[0].ID] == "" {
		t.Fatalf("Create with an old token after restart: %+v, %v", insts, err)
	}
}

// TestNodesOutliveTheirLauncher launches a node from a separate process
// that then exits, as a daemon would crash: the node must keep running
// and be found by this process.
func TestNodesOutliveTheirLauncher(t *testing.T) {
	e := newEnv(t, `{}`)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, err := runLauncher(t, exe, e.dir)
	if err != nil {
		t.Fatalf("launcher: %v\n%s", err, out)
	}
	id := strings.TrimSpace(out)
	in := e.waitState(id, providers.StateRunning, 10*time.Second)
	sup, _ := e.pids(in.ID)
	if gone(sup) {
		t.Fatal("node died with its launcher")
	}
}

func TestInterruptNoticeThenReclaim(t *testing.T) {
	e := newEnv(t, `{}`)
	in := e.create(providers.LaunchRequest{Tags: map[string]string{providers.TagNodeID: "n-int"}})
	e.waitState(in.ID, providers.StateRunning, 10*time.Second)
	sup, ag := e.pids(in.ID)

	intr, ok := e.p.(providers.Interrupter)
	if !ok {
		t.Fatal("local provider does not implement providers.Interrupter")
	}
	deadline := time.Now().Add(2500 * time.Millisecond).UTC().Truncate(time.Second).Add(time.Second)
	if err := intr.Interrupt(t.Context(), e.cfg, in.ID, providers.InterruptionInfo{Kind: "spot-interruption", Deadline: deadline}); err != nil {
		t.Fatal(err)
	}
	body, err := imdsClient(t, in, e).Get(t.Context(), imds.PathInstanceAction)
	if err != nil {
		t.Fatalf("instance-action after Interrupt: %v", err)
	}
	action, err := imds.ParseInstanceAction(body)
	if err != nil || action.Action != "terminate" || !action.Time.Equal(deadline) {
		t.Fatalf("instance-action %q: %+v, %v", body, action, err)
	}
	got, _ := e.p.Get(t.Context(), e.cfg, in.ID)
	if got.State != providers.StateRunning || got.Interruption == nil || got.Interruption.Kind != "spot-interruption" || !got.Interruption.Deadline.Equal(deadline) {
		t.Fatalf("during notice: %+v", got)
	}
	// The node's agent sees the notice and writes its drain file.
	drainFile := filepath.Join(e.root(in.ID), "var/lib/fleetd", agent.DrainFileName)
	waitFor(t, 5*time.Second, "drain file", func() bool { _, err := os.Stat(drainFile); return err == nil })
	if d, err := agent.ReadDrain(drainFile); err != nil || !d.Deadline.Equal(deadline) {
		t.Fatalf("drain %+v, %v", d, err)
	}

	// Nobody calls Delete: the node dies at the deadline anyway.
	got = e.waitState(in.ID, providers.StateTerminated, time.Until(deadline)+5*time.Second)
	if time.Now().Before(deadline) {
		t.Fatalf("node terminated before its deadline %v", deadline)
	}
	if got.Interruption == nil || got.Interruption.Kind != "spot-interruption" {
		t.Fatalf("reclaimed node: %+v", got.Interruption)
	}
	waitFor(t, 5*time.Second, "node processes gone", func() bool { return gone(sup) && gone(ag) })
	if err := intr.Interrupt(t.Context(), e.cfg, in.ID, providers.InterruptionInfo{}); !providers.IsNotFound(err) {
		t.Fatalf("Interrupt of a terminated node: %v", err)
	}
}

func TestInterruptKinds(t *testing.T) {
	e := newEnv(t, `{"notice_lead": "1h"}`)
	intr := e.p.(providers.Interrupter)
	a := e.create(providers.LaunchRequest{})
	b := e.create(providers.LaunchRequest{})
	e.waitState(a.ID, providers.StateRunning, 10*time.Second)
	e.waitState(b.ID, providers.StateRunning, 10*time.Second)

	// Rebalance: advisory, published, node keeps running.
	if err := intr.Interrupt(t.Context(), e.cfg, a.ID, providers.InterruptionInfo{Kind: "rebalance"}); err != nil {
		t.Fatal(err)
	}
	if body, err := imdsClient(t, a, e).Get(t.Context(), imds.PathRebalance); err != nil {
		t.Fatalf("rebalance after Interrupt: %v", err)
	} else if _, err := imds.ParseRebalance(body); err != nil {
		t.Fatal(err)
	}
	// Default kind and deadline: a spot notice notice_lead ahead.
	if err := intr.Interrupt(t.Context(), e.cfg, a.ID, providers.InterruptionInfo{}); err != nil {
		t.Fatal(err)
	}
	got, _ := e.p.Get(t.Context(), e.cfg, a.ID)
	if got.State != providers.StateRunning || got.Interruption == nil || got.Interruption.Kind != "spot-interruption" ||
		got.Interruption.Deadline.Before(time.Now().Add(59*time.Minute)) {
		t.Fatalf("default notice: %+v", got)
	}
	if err := intr.Interrupt(t.Context(), e.cfg, a.ID, providers.InterruptionInfo{Kind: "meteor"}); !providers.IsInvalidConfig(err) {
		t.Fatalf("unknown kind: %v", err)
	}
	// Lost: gone at once, without notice on the metadata service.
	if err := intr.Interrupt(t.Context(), e.cfg, b.ID, providers.InterruptionInfo{Kind: "lost"}); err != nil {
		t.Fatal(err)
	}
	got = e.waitState(b.ID, providers.StateTerminated, 5*time.Second)
	if got.Interruption == nil || got.Interruption.Kind != "lost" {
		t.Fatalf("lost node: %+v", got.Interruption)
	}
}

func TestBootFromCloudConfig(t *testing.T) {
	e := newEnv(t, `{}`)
	agentJSON := `{"fleet": "bert", "node_id": "node-42", "metadata": {"kind": "aws-imds"}, "work_dir": "/srv/fleetd", "log_dir": "/srv/log"}`
	userData := "#cloud-config\n" +
		"write_files:\n" +
		"  - path: /etc/fleetd/agent.json\n" +
		"    permissions: '0600'\n" +
		"    content: |\n      " + agentJSON + "\n" +
		"  - path: /opt/setup/hello.txt\n" +
		"    encoding: b64\n" +
		"    permissions: '0750'\n" +
		"    content: " + base64.StdEncoding.EncodeToString([]byte("hello node\n")) + "\n" +
		"runcmd:\n" +
		"  - [fleetd, agent, -config, /etc/fleetd/agent.json]\n"
	in := e.create(providers.LaunchRequest{UserData: userData})
	e.waitState(in.ID, providers.StateRunning, 10*time.Second)
	root := e.root(in.ID)

	for file, want := range map[string]struct {
		mode    os.FileMode
		content string
	}{
		"etc/fleetd/agent.json": {0o600, agentJSON + "\n"},
		"opt/setup/hello.txt":   {0o750, "hello node\n"},
	} {
		fi, err := os.Stat(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(root, file))
		if fi.Mode().Perm() != want.mode || string(b) != want.content {
			t.Errorf("%s: mode %v content %q; want %v %q", file, fi.Mode().Perm(), b, want.mode, want.content)
		}
	}
	// The agent runs with that config: its log is where the config says.
	waitFor(t, 5*time.Second, "agent log", func() bool {
		b, _ := os.ReadFile(filepath.Join(root, "srv/log/agent.log"))
		return strings.Contains(string(b), `"node":"node-42"`)
	})
	got, err := imdsClient(t, in, e).Get(t.Context(), "user-data")
	if err != nil || string(got) != userData {
		t.Fatalf("user-data from the metadata service: %q, %v", got, err)
	}

	// A document that does not write the agent config keeps the image's
	// default one (a standalone agent on the node's metadata).
	plain := e.create(providers.LaunchRequest{UserData: "#cloud-config\nwrite_files:\n  - path: /etc/motd\n    content: hi\n", Tags: map[string]string{providers.TagNodeID: "n-plain"}})
	e.waitState(plain.ID, providers.StateRunning, 10*time.Second)
	if b, err := os.ReadFile(filepath.Join(e.root(plain.ID), "etc/motd")); err != nil || string(b) != "hi" {
		t.Fatalf("motd %q, %v", b, err)
	}
	if cfg, err := agent.LoadConfig(filepath.Join(e.root(plain.ID), "etc/fleetd/agent.json")); err != nil || cfg.NodeID != "n-plain" {
		t.Fatalf("default agent config %+v, %v", cfg, err)
	}

	for name, bad := range map[string]string{
		"not cloud-config": "#!/bin/sh\necho hi\n",
		"relative path":    "#cloud-config\nwrite_files:\n  - path: etc/fleetd/agent.json\n    content: '{}'\n",
		"bad yaml":         "#cloud-config\nwrite_files: [\n",
		"too big":          "#cloud-config\n#" + strings.Repeat("x", local.MaxUserData) + "\n",
		"unknown encoding": "#cloud-config\nwrite_files:\n  - path: /etc/fleetd/agent.json\n    encoding: rot13\n    content: x\n",
		"bad permissions":  "#cloud-config\nwrite_files:\n  - path: /etc/fleetd/agent.json\n    permissions: 'rw-r--r--'\n    content: x\n",
	} {
		if _, err := e.p.Create(t.Context(), e.cfg, providers.LaunchRequest{Offering: spot("local-a"), Count: 1, UserData: bad}); !providers.IsInvalidConfig(err) {
			t.Errorf("%s: err = %v, want invalid config", name, err)
		}
	}
}

func TestCreateRejectsUnknownOfferings(t *testing.T) {
	e := newEnv(t, `{}`)
	for name, req := range map[string]providers.LaunchRequest{
		"unknown zone": {Offering: spot("us-east-1a"), Count: 1},
		"unknown type": {Offering: providers.Offering{Provider: "local", Region: "local", Zone: "local-a", InstanceType: "p5.48xlarge", CapacityType: providers.Spot}, Count: 1},
		"zero count":   {Offering: spot("local-a"), Count: 0},
	} {
		if _, err := e.p.Create(t.Context(), e.cfg, req); !providers.IsInvalidConfig(err) {
			t.Errorf("%s: err = %v, want invalid config", name, err)
		}
	}
	bad := providers.Config{Fleet: "x", Raw: json.RawMessage(`{"zones": ["a"], "capacity": {"b": 1}}`)}
	if _, err := e.p.Offerings(t.Context(), bad); !providers.IsInvalidConfig(err) {
		t.Errorf("capacity for an unknown zone: %v", err)
	}
}

func TestTerminatedInstancesAreForgottenAfterRetention(t *testing.T) {
	e := newEnv(t, `{}`)
	e.p = local.New(local.Options{StateDir: e.dir, StopGrace: 2 * time.Second, Retention: 50 * time.Millisecond})
	in := e.create(providers.LaunchRequest{IdempotencyToken: "tok"})
	if err := e.p.Delete(t.Context(), e.cfg, in.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if list, err := e.p.List(t.Context(), e.cfg, nil); err != nil || len(list) != 0 {
		t.Fatalf("List after retention: %+v, %v", list, err)
	}
	if _, err := e.p.Get(t.Context(), e.cfg, in.ID); !providers.IsNotFound(err) {
		t.Fatalf("Get after retention: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "instances", in.ID)); !os.IsNotExist(err) {
		t.Fatalf("node directory left behind: %v", err)
	}
	// The token expired with its instances: it launches anew.
	if again := e.create(providers.LaunchRequest{IdempotencyToken: "tok"}); again.ID == in.ID {
		t.Fatal("expired token returned the forgotten instance")
	}
}

func TestFailedLaunchLeavesNothing(t *testing.T) {
	e := newEnv(t, `{}`)
	e.p = local.New(local.Options{StateDir: e.dir, AgentBinary: filepath.Join(e.dir, "no-such-fleetd")})
	_, err := e.p.Create(t.Context(), e.cfg, providers.LaunchRequest{Offering: spot("local-a"), Count: 2, IdempotencyToken: "tok"})
	if err == nil {
		t.Fatal("Create with a missing binary succeeded")
	}
	if list, err := e.p.List(t.Context(), e.cfg, nil); err != nil || len(list) != 0 {
		t.Fatalf("List after a failed launch: %+v, %v", list, err)
	}
	e.p = e.provider() // a working binary: the token is free again
	if in := e.create(providers.LaunchRequest{IdempotencyToken: "tok"}); in.ID == "" {
		t.Fatal("no instance")
	}
}

// TestCreateResumesAfterACrash simulates a launcher that died after
// recording the token's ids but before starting the second node: the retry
// must start exactly the missing one.
func TestCreateResumesAfterACrash(t *testing.T) {
	e := newEnv(t, `{}`)
	req := providers.LaunchRequest{Offering: spot("local-a"), Count: 2, IdempotencyToken: "crash"}
	first, err := e.p.Create(t.Context(), e.cfg, req)
	if err != nil {
		t.Fatal(err)
	}
	// Undo the second launch as if it never happened.
	if err := e.p.Delete(t.Context(), e.cfg, first[1].ID); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(e.dir, "instances", first[1].ID)); err != nil {
		t.Fatal(err)
	}
	again, err := e.provider().Create(t.Context(), e.cfg, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 2 || again[0].ID != first[0].ID || again[1].ID != first[1].ID {
		t.Fatalf("retry returned %+v, want the ids %s and %s", again, first[0].ID, first[1].ID)
	}
	for _, in := range again {
		e.waitState(in.ID, providers.StateRunning, 10*time.Second)
	}
	if list, _ := e.p.List(t.Context(), e.cfg, nil); len(list) != 2 {
		t.Fatalf("%d instances after the retry, want 2", len(list))
	}
}
