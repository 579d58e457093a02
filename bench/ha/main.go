// Command ha measures fleetd's failover with three real `fleetd serve`
// processes, each running an embedded etcd member on loopback, and the
// cost of state on etcd next to bbolt. It prints FIGURE lines (see
// bench/internal/report):
//
//		ha -fleetd bin/fleetd [-runs 3] [-ttl 5s] [-json out.json]
//
//	  - failover: the leader is SIGKILLed while a two-node local fleet runs;
//	    seconds until another server is elected, and until it has committed a
//	    write (an apply answered);
//	  - notice during failover: right after the kill a spot notice is injected
//	    into a node (`fleetd debug interrupt` through the surviving servers);
//	    seconds until the replacement node is requested;
//	  - writes: the latency of one durable state update (a node record and an
//	    event) on bbolt and on a three-member etcd.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/bench/internal/report"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/fleettest/clusterprobe"
	"github.com/fleetd/fleetd/internal/devcluster"
	"github.com/fleetd/fleetd/internal/freeport"
)

func main() {
	bin := flag.String("fleetd", "bin/fleetd", "the fleetd binary")
	runs := flag.Int("runs", 3, "leader kills (each on a fresh cluster)")
	ttl := flag.Duration("ttl", 3*time.Second, "cluster session_ttl (the default is 3s)")
	jsonOut := flag.String("json", "", "also write the figures to this JSON file")
	flag.Parse()
	r := report.New(os.Stdout)
	abs, err := filepath.Abs(*bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var elected, acting, replaced []float64
	for i := range *runs {
		fmt.Printf("\n---- failover run %d/%d (session_ttl %s) ----\n", i+1, *runs, *ttl)
		e, a, rep, err := failoverRun(abs, *ttl)
		if err != nil {
			fmt.Printf("run %d: ERROR: %v\n", i+1, err)
			continue
		}
		fmt.Printf("run %d: elected %.2fs, acting %.2fs, replacement requested %.2fs after the kill\n", i+1, e, a, rep)
		elected, acting, replaced = append(elected, e), append(acting, a), append(replaced, rep)
	}
	r.Info("ha.session_ttl", ttl.Seconds(), "s")
	if len(acting) == 0 {
		r.Missing("ha.failover.acting.max", "s", report.AtMost, 5, "no run completed")
	} else {
		r.Info("ha.failover.elected.median", median(elected), "s")
		r.Info("ha.failover.acting.median", median(acting), "s")
		r.Check("ha.failover.acting.max", maxOf(acting), "s", report.AtMost, 5)
		r.Info("ha.notice_during_failover.replacement_requested.median", median(replaced), "s")
		r.Info("ha.notice_during_failover.replacement_requested.max", maxOf(replaced), "s")
	}
	fmt.Printf("\n---- state writes: bbolt vs etcd ----\n")
	if err := benchWrites(r); err != nil {
		fmt.Println("writes: ERROR:", err)
	}
	if r.Finish("ha", *jsonOut) > 0 {
		os.Exit(1) // bench/run.sh counts a program that fails as a miss
	}
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func maxOf(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func freeAddr() string {
	addr, err := freeport.Addr()
	if err != nil {
		panic(err)
	}
	return addr
}

type server struct {
	name, url, dir string
	cmd            *exec.Cmd
	done           chan error
}

// startCluster starts three servers and returns them with the shared token.
func startCluster(bin string, ttl time.Duration, root string) ([]*server, string, error) {
	names := []string{"a", "b", "c"}
	servers := make([]*server, 3)
	for i, n := range names {
		servers[i] = &server{name: n, url: "http://" + freeAddr(), dir: filepath.Join(root, n)}
	}
	clusters := devcluster.EmbeddedEtcd(names, freeAddr, ttl)
	for _, s := range servers {
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			return nil, "", err
		}
		path := filepath.Join(s.dir, "daemon.hcl")
		if err := os.WriteFile(path, []byte(devcluster.DaemonConfig(s.url, s.dir, clusters[s.name])), 0o600); err != nil {
			return nil, "", err
		}
		log, err := os.Create(filepath.Join(s.dir, "serve.log"))
		if err != nil {
			return nil, "", err
		}
		s.cmd = exec.Command(bin, "serve", "-config", path)
		s.cmd.Stdout, s.cmd.Stderr = log, log
		if err := s.cmd.Start(); err != nil {
			return nil, "", err
		}
		s.done = make(chan error, 1)
		go func() { s.done <- s.cmd.Wait(); log.Close() }()
	}
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		var toks []string
		for _, s := range servers {
			b, err := os.ReadFile(filepath.Join(s.dir, "token"))
			if err == nil {
				toks = append(toks, strings.TrimSpace(string(b)))
			}
		}
		// A server writes its token file before its API listens: wait
		// until every one answers too.
		if len(toks) == 3 && toks[0] == toks[1] && toks[1] == toks[2] && toks[0] != "" && probe.AllAnswer(context.Background(), toks[0], urls(servers)...) {
			return servers, toks[0], nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopAll(servers)
	return nil, "", errors.New("cluster did not come up in 90s")
}

func stopAll(servers []*server) {
	for _, s := range servers {
		if s.cmd != nil && s.cmd.ProcessState == nil {
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.done:
			case <-time.After(15 * time.Second):
				_ = s.cmd.Process.Kill()
			}
		}
	}
}

// probe asks the servers who leads.
var probe = clusterprobe.Probe{Timeout: time.Second}

func urls(servers []*server) []string {
	var out []string
	for _, s := range servers {
		out = append(out, s.url)
	}
	return out
}

func leaderOf(servers []*server, token string) string {
	return probe.Leader(context.Background(), token, urls(servers)...)
}

const fleetSpec = `
fleet "ha" {
  min_nodes = 2
  max_nodes = 2
  node { gpus = 1 }
  placement { colocate = "region" }
  provider "local" {
    zones       = ["local-a", "local-b"]
    state_dir   = %q
    notice_lead = "20s"
  }
  training {
    command     = ["sleep", "600"]
    drain_grace = "5s"
    env         = { RUN = %q }
  }
}
`

// failoverRun starts a cluster, runs a two-node fleet, SIGKILLs the leader
// and at once injects a notice, and measures.
func failoverRun(bin string, ttl time.Duration) (elected, acting, replaced float64, err error) {
	root, err := os.MkdirTemp("", "fleetd-bench-ha-")
	if err != nil {
		return 0, 0, 0, err
	}
	defer os.RemoveAll(root)
	nodeDir := filepath.Join(root, "nodes")
	servers, token, err := startCluster(bin, ttl, root)
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() {
		stopAll(servers)
		killNodes(nodeDir)
	}()
	var leader string
	if err := waitFor(60*time.Second, func() bool { leader = leaderOf(servers, token); return leader != "" }); err != nil {
		return 0, 0, 0, fmt.Errorf("no leader: %w", err)
	}
	var lead *server
	var rest []*server
	for _, s := range servers {
		if s.name == leader {
			lead = s
		} else {
			rest = append(rest, s)
		}
	}
	addrs := rest[0].url + "," + rest[1].url
	client, err := api.NewClient(addrs, api.ClientOptions{Token: token, Timeout: 5 * time.Second})
	if err != nil {
		return 0, 0, 0, err
	}
	ctx := context.Background()
	apply := func(run string) error {
		_, err := client.Apply(ctx, api.ApplyRequest{Filename: "ha.hcl", Source: fmt.Sprintf(fleetSpec, nodeDir, run)})
		return err
	}
	if err := apply("0"); err != nil {
		return 0, 0, 0, fmt.Errorf("apply: %w", err)
	}
	var nodes []api.NodeInfo
	if err := waitFor(90*time.Second, func() bool {
		d, err := client.Fleet(ctx, "ha")
		if err != nil {
			return false
		}
		n := 0
		for _, x := range d.Nodes {
			if x.State == "running" {
				n++
			}
		}
		nodes = d.Nodes
		return n == 2
	}); err != nil {
		return 0, 0, 0, errors.New("the fleet never ran 2 nodes")
	}
	victim := nodes[0].ID
	// A leader of a real deployment has led for a while when it dies. The
	// followers depose a dead leader they have reached (its port then
	// refuses connections); one killed within a probe or two of its
	// election goes by its lease instead. Two seconds are four probes.
	time.Sleep(2 * time.Second)

	killed := time.Now()
	if err := lead.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return 0, 0, 0, err
	}
	// The notice goes in through whichever server leads next: the CLI
	// fails over and retries until one does.
	noticeErr := make(chan error, 1)
	go func() {
		noticeErr <- waitFor(60*time.Second, func() bool {
			cmd := exec.Command(bin, "debug", "interrupt", "-lead", "20s", "ha", victim)
			cmd.Env = append(os.Environ(), "FLEETD_ADDR="+addrs, "FLEETD_TOKEN="+token)
			return cmd.Run() == nil
		})
	}()
	var next string
	if err := waitFor(60*time.Second, func() bool { next = leaderOf(rest, token); return next != "" && next != leader }); err != nil {
		return 0, 0, 0, errors.New("no new leader")
	}
	elected = time.Since(killed).Seconds()
	if err := waitFor(60*time.Second, func() bool { return apply("1") == nil }); err != nil {
		return 0, 0, 0, errors.New("the new leader never committed a write")
	}
	acting = time.Since(killed).Seconds()
	if err := <-noticeErr; err != nil {
		return 0, 0, 0, errors.New("the notice could not be injected")
	}
	if err := waitFor(60*time.Second, func() bool {
		d, err := client.Fleet(ctx, "ha")
		if err != nil {
			return false
		}
		for _, x := range d.Nodes {
			if x.ID != victim && x.CreatedAt.After(killed) {
				return true
			}
		}
		return false
	}); err != nil {
		return 0, 0, 0, errors.New("no replacement requested")
	}
	replaced = time.Since(killed).Seconds()
	_, _ = client.Destroy(ctx, "ha")
	return elected, acting, replaced, nil
}

func waitFor(d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// killNodes kills every local node process whose command line names dir
// (their supervisors, agents and workers).
func killNodes(dir string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(dir)) {
			continue
		}
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
