// Package devd runs the `fleetd serve -dev` daemon a benchmark drives, and
// reads the local provider's instance records (the "hypervisor's" view of
// the nodes the daemon launched).
package devd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/internal/freeport"
	"github.com/fleetd/fleetd/providers"
)

// Daemon is a running dev daemon.
type Daemon struct {
	// Client talks to it with the admin token it printed.
	Client *api.Client
	cmd    *exec.Cmd
	exited chan error
}

// Start runs `bin serve -dev` on a free loopback port with its data in
// dir/data and its log in dir/fleetd-daemon.log, reads the address and
// token it prints, and waits until it answers.
func Start(ctx context.Context, bin, dir string) (*Daemon, error) {
	port, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "fleetd-daemon.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", "-dev", "-listen", fmt.Sprintf("127.0.0.1:%d", port), "-data-dir", filepath.Join(dir, "data"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start fleetd: %w", err)
	}
	d := &Daemon{cmd: cmd, exited: make(chan error, 1)}
	sc := bufio.NewScanner(out)
	base, token := api.ScanDevExports(sc)
	go func() {
		for sc.Scan() {
		}
		d.exited <- cmd.Wait()
		logf.Close()
	}()
	if token == "" {
		return d, fmt.Errorf("fleetd did not start; see %s", logf.Name())
	}
	if d.Client, err = api.NewClient(base, api.ClientOptions{Token: token}); err != nil {
		return d, err
	}
	for i := 0; ; i++ {
		if _, err := d.Client.Status(ctx); err == nil {
			return d, nil
		}
		if i > 200 {
			return d, errors.New("fleetd daemon not answering")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop ends the daemon (a dev daemon terminates its nodes as it goes):
// SIGTERM, and SIGKILL after 30 s.
func (d *Daemon) Stop() {
	if d == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// Instance is the part of the local provider's instance.json a benchmark
// reads: which node, which session, and where its root is.
type Instance struct {
	ID   string            `json:"id"`
	PID  int               `json:"pid"`
	Tags map[string]string `json:"tags"`
	// Dir is the instance's directory; its filesystem is Dir/root.
	Dir string `json:"-"`
}

// Instances lists the node instances recorded under the local provider's
// state_dir.
func Instances(stateDir string) []Instance {
	files, _ := filepath.Glob(filepath.Join(stateDir, "instances", "*", "instance.json"))
	var out []Instance
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var in Instance
		if json.Unmarshal(b, &in) != nil || in.Tags[providers.TagNodeID] == "" {
			continue
		}
		in.Dir = filepath.Dir(p)
		out = append(out, in)
	}
	return out
}

// AgentLog is the node agent's log file (JSON lines) inside the instance.
func (in Instance) AgentLog() string {
	return filepath.Join(in.Dir, "root", "var", "log", "fleetd", "agent.log")
}

// AgentStarted is when the node's agent process logged its start: the
// event a joining node is timed from, as a torchrun agent's process start.
func (in Instance) AgentStarted() (time.Time, error) {
	fh, err := os.Open(in.AgentLog())
	if err != nil {
		return time.Time{}, fmt.Errorf("agent start: %w", err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		var l struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "agent started" {
			return l.Time, nil
		}
	}
	return time.Time{}, fmt.Errorf("agent start: no \"agent started\" line in %s", in.AgentLog())
}

// Find returns the instance of node.
func Find(stateDir, node string) (Instance, error) {
	for _, in := range Instances(stateDir) {
		if in.Tags[providers.TagNodeID] == node {
			return in, nil
		}
	}
	return Instance{}, fmt.Errorf("no local instance for node %s", node)
}
