// Command agentboot measures how nodes get their agent from the daemon
// (issue 30): the boot path from "instance running" to "agent registered",
// and the daemon under many concurrent agent downloads.
//
//	go run ./bench/agentboot -mode boot  -agent-dir DIR [-rate 12.5e6] [-gzip] [-nodes 3]
//	go run ./bench/agentboot -mode serve -agent-dir DIR [-n 200] [-gzip]
//	go run ./bench/agentboot -mode all   -agent-dir DIR    (what `make bench` runs)
//
// DIR holds the agent builds the daemon serves, named as `make release`
// names them: fleetd-agent-linux-ARCH (slim; "after") or only
// fleetd-linux-ARCH (the full fleetd every node downloaded before).
//
// boot: a real daemon (in this process, on the mem provider, whose nodes
// wait in "booting" for their agent like a VM's) launches the nodes; for
// each, the bench does what the user-data does on a VM: real curl
// downloads the agent from the daemon (through a bandwidth-limited TCP
// proxy with -rate, bytes/s: a cross-region link), checks its sha256,
// starts it with the node's config, and waits until the daemon has the
// node "joined". It prints download size and time and running→registered.
//
// serve: the daemon runs in a child process; -n clients download the agent
// at once while one client polls GET /v1/status every 10 ms. It prints the
// daemon's peak RSS (VmHWM and sampled VmRSS), the downloads' p50/p99 and
// the status calls' p50/p99/max.
package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/bootstrap"
	"github.com/fleetd/fleetd/fleet/fleettest"
	"github.com/fleetd/fleetd/fleet/state"
)

func main() {
	mode := flag.String("mode", "boot", "boot, serve, all (sizes, boot on loopback and at -rate, serve; a summary for bench/run.sh), or daemon (the serve mode's child)")
	agentDir := flag.String("agent-dir", "", "directory with the agent builds the daemon serves")
	rate := flag.Float64("rate", 0, "boot: bytes/s of the link between node and daemon (0: loopback, unlimited)")
	gz := flag.Bool("gzip", true, "clients accept gzip (curl --compressed), as the user-data does")
	nodes := flag.Int("nodes", 3, "boot: nodes to boot, one after the other")
	n := flag.Int("n", 200, "serve: concurrent downloads")
	flag.Parse()
	ctx := context.Background()
	var err error
	switch *mode {
	case "boot":
		_, err = boot(ctx, *agentDir, *rate, *gz, *nodes)
	case "serve":
		_, err = serve(ctx, *agentDir, *n, *gz)
	case "all":
		err = all(ctx, *agentDir, *rate, *nodes, *n)
	case "daemon":
		err = runDaemon(ctx, *agentDir)
	default:
		err = fmt.Errorf("unknown -mode %q", *mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentboot:", err)
		os.Exit(1)
	}
}

// startDaemon runs a real daemon on 127.0.0.1 serving the agents in
// agentDir; its mem provider's nodes wait in "booting" like VMs.
func startDaemon(ctx context.Context, agentDir, dataDir string) (*fleet.Daemon, func(), error) {
	return fleettest.Start(ctx, fleettest.Options{DataDir: dataDir, AgentDir: agentDir, Version: "bench"})
}

func boot(ctx context.Context, agentDir string, rate float64, gz bool, nodes int) (time.Duration, error) {
	if _, err := exec.LookPath("curl"); err != nil {
		return 0, fmt.Errorf("boot mode runs curl, as the user-data does: %w", err)
	}
	work, err := os.MkdirTemp("", "agentboot-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(work)
	d, stop, err := startDaemon(ctx, agentDir, filepath.Join(work, "data"))
	if err != nil {
		return 0, err
	}
	defer stop()
	waitGzip(agentDir, filepath.Join(work, "data"))
	index := bootstrap.IndexAgents([]string{agentDir}, "")
	bin, ok := index.Lookup(runtime.GOARCH)
	if !ok {
		return 0, fmt.Errorf("no agent for linux/%s in %s", runtime.GOARCH, agentDir)
	}
	downloadBase := d.URL()
	if rate > 0 {
		p, err := newThrottle(strings.TrimPrefix(d.URL(), "http://"), rate)
		if err != nil {
			return 0, err
		}
		defer p.Close()
		downloadBase = "http://" + p.Addr()
	}
	client, err := api.NewClient(d.URL(), api.ClientOptions{Token: d.Token()})
	if err != nil {
		return 0, err
	}
	if _, err := client.Apply(ctx, api.ApplyRequest{Filename: "boot.hcl", Source: fleettest.Spec("boot", nodes, "sleep", "600")}); err != nil {
		return 0, err
	}
	booting, err := waitNodes(ctx, d, nodes, state.NodeBooting, 30*time.Second)
	if err != nil {
		return 0, err
	}
	fmt.Printf("agent: %s (%s, %.1f MB), link: %s, gzip: %v\n", filepath.Base(bin.Path), bin.Flavor, mb(bin.Size), linkName(rate), gz)
	var totals, downloads []time.Duration
	for _, id := range booting {
		r, err := bootNode(ctx, d, work, downloadBase, id, gz, bin)
		if err != nil {
			return 0, fmt.Errorf("node %s: %w", id, err)
		}
		fmt.Printf("  %s: downloaded %.1f MB (%s) in %s; running → registered %s\n", id, mb(r.bytes), cmp.Or(r.encoding, "identity"), r.download.Round(time.Millisecond), r.total.Round(time.Millisecond))
		totals, downloads = append(totals, r.total), append(downloads, r.download)
	}
	fmt.Printf("median: download %s, running → registered %s\n", median(downloads).Round(time.Millisecond), median(totals).Round(time.Millisecond))
	return median(totals), nil
}

type bootResult struct {
	bytes           int64
	encoding        string
	download, total time.Duration
}

// bootNode plays one VM from the moment it runs: download, verify, start
// the agent, until the daemon records the node joined.
func bootNode(ctx context.Context, d *fleet.Daemon, work, base, node string, gz bool, bin bootstrap.AgentBinary) (bootResult, error) {
	root := filepath.Join(work, node)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return bootResult{}, err
	}
	exe := filepath.Join(root, "fleetd-agent")
	q := url.Values{"fleet": {"boot"}, "node": {node}, "arch": {runtime.GOARCH}}
	start := time.Now()
	args := []string{"-fsSL", "-w", "%{size_download} %header{content-encoding}", "-H", "Authorization: Bearer " + d.NodeToken("boot", node), "-o", exe + ".download"}
	if gz {
		args = append(args, "--compressed")
	}
	out, err := exec.CommandContext(ctx, "curl", append(args, base+"/v1/agent/binary?"+q.Encode())...).Output()
	if err != nil {
		return bootResult{}, fmt.Errorf("curl: %w", err)
	}
	// size_download is what crossed the wire (compressed, when gzip).
	sizeStr, enc, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	size, _ := strconv.ParseFloat(sizeStr, 64)
	if sum, err := fileSHA256(exe + ".download"); err != nil || sum != bin.SHA256 {
		return bootResult{}, fmt.Errorf("sha256 %s, want %s (%v)", sum, bin.SHA256, err)
	}
	if err := os.Chmod(exe+".download", 0o755); err != nil {
		return bootResult{}, err
	}
	if err := os.Rename(exe+".download", exe); err != nil {
		return bootResult{}, err
	}
	download := time.Since(start)
	cfg := bootstrap.AgentConfig{Fleet: "boot", NodeID: node, DaemonURL: d.URL(), Token: d.NodeToken("boot", node),
		Metadata: bootstrap.MetadataConfig{Kind: "none"}}
	cb, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(root, "agent.json")
	if err := os.WriteFile(cfgPath, cb, 0o600); err != nil {
		return bootResult{}, err
	}
	cmd := exec.Command(exe, "agent", "-config", cfgPath, "-root", root)
	cmd.Env = append(os.Environ(), "FLEETD_NODE_ADDR=127.0.0.1")
	logf, _ := os.Create(filepath.Join(root, "agent.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return bootResult{}, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); logf.Close() }()
	for {
		var st state.NodeState
		_ = d.Store().View(ctx, func(tx state.Tx) error {
			n, err := tx.Node("boot", node)
			st = n.State
			return err
		})
		if st != state.NodeBooting && st != "" {
			return bootResult{bytes: int64(size), encoding: enc, download: download, total: time.Since(start)}, nil
		}
		if time.Since(start) > 10*time.Minute {
			b, _ := os.ReadFile(filepath.Join(root, "agent.log"))
			return bootResult{}, fmt.Errorf("not registered after 10 min; agent log:\n%s", b)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitNodes(ctx context.Context, d *fleet.Daemon, n int, st state.NodeState, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var ids []string
		_ = d.Store().View(ctx, func(tx state.Tx) error {
			nodes, err := tx.Nodes("boot")
			for _, x := range nodes {
				if x.State == st {
					ids = append(ids, x.ID)
				}
			}
			return err
		})
		if len(ids) >= n {
			slices.Sort(ids)
			return ids[:n], nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, fmt.Errorf("%d nodes not %s after %s", n, st, timeout)
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// waitGzip waits (up to a minute) for the gzip copies of the agent builds
// the daemon makes at start, so every node or client is measured against
// a daemon in its steady state.
func waitGzip(agentDir, dataDir string) {
	for _, b := range bootstrap.IndexAgents([]string{agentDir}, "").All() {
		if b.Flavor == bootstrap.FlavorFull {
			continue
		}
		for range 600 {
			if _, err := os.Stat(filepath.Join(dataDir, "cache", "agents", b.SHA256+".gz")); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// runDaemon is the serve mode's child: a daemon that prints its URL and
// admin token and runs until stdin closes.
func runDaemon(ctx context.Context, agentDir string) error {
	work, err := os.MkdirTemp("", "agentboot-daemon-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	d, stop, err := startDaemon(ctx, agentDir, filepath.Join(work, "data"))
	if err != nil {
		return err
	}
	defer stop()
	waitGzip(agentDir, filepath.Join(work, "data"))
	fmt.Printf("URL=%s TOKEN=%s\n", d.URL(), d.Token())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// serveFigures are the serve mode's results.
type serveFigures struct {
	hwmMB  float64
	apiP99 time.Duration
	ok     int
}

func serve(ctx context.Context, agentDir string, n int, gz bool) (serveFigures, error) {
	self, err := os.Executable()
	if err != nil {
		return serveFigures{}, err
	}
	child := exec.Command(self, "-mode", "daemon", "-agent-dir", agentDir)
	child.Stderr = os.Stderr
	stdin, _ := child.StdinPipe()
	stdout, _ := child.StdoutPipe()
	if err := child.Start(); err != nil {
		return serveFigures{}, err
	}
	defer func() { stdin.Close(); _ = child.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return serveFigures{}, fmt.Errorf("daemon: %w", err)
	}
	var base, token string
	if _, err := fmt.Sscanf(strings.TrimSpace(line), "URL=%s TOKEN=%s", &base, &token); err != nil {
		return serveFigures{}, fmt.Errorf("daemon said %q: %w", line, err)
	}
	pid := child.Process.Pid
	rssBefore := procKB(pid, "VmRSS")

	tr := &http.Transport{DisableCompression: true, MaxConnsPerHost: 0, MaxIdleConnsPerHost: n}
	hc := &http.Client{Transport: tr}
	stop := make(chan struct{})
	var peakRSS int64
	var wg sync.WaitGroup
	wg.Go(func() { // RSS sampler
		for {
			peakRSS = max(peakRSS, procKB(pid, "VmRSS"))
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	var apiLat []time.Duration
	var apiErrs int
	wg.Go(func() { // an operator's dashboard, meanwhile
		sc := &http.Client{Timeout: 30 * time.Second}
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			req, _ := http.NewRequest("GET", base+"/v1/status", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			t0 := time.Now()
			resp, err := sc.Do(req)
			if err != nil {
				apiErrs++
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				apiErrs++
				continue
			}
			apiLat = append(apiLat, time.Since(t0))
		}
	})
	time.Sleep(200 * time.Millisecond) // a baseline of status calls
	lat := make([]time.Duration, n)
	sizes := make([]int64, n)
	codes := make([]int, n)
	var dl sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		dl.Go(func() {
			req, _ := http.NewRequest("GET", base+"/v1/agent/binary?arch="+runtime.GOARCH, nil)
			req.Header.Set("Authorization", "Bearer "+token)
			if gz {
				req.Header.Set("Accept-Encoding", "gzip")
			}
			s := time.Now()
			resp, err := hc.Do(req)
			if err != nil {
				return
			}
			sizes[i], _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i], lat[i] = resp.StatusCode, time.Since(s)
		})
	}
	dl.Wait()
	wall := time.Since(t0)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	hwm := procKB(pid, "VmHWM")
	ok, total := 0, int64(0)
	for i := range n {
		if codes[i] == 200 {
			ok++
			total += sizes[i]
		}
	}
	slices.Sort(lat)
	slices.Sort(apiLat)
	fmt.Printf("%d concurrent downloads (gzip %v) from %s: %d ok, %.1f MB each, %.0f MB in %s (%.0f MB/s)\n",
		n, gz, agentDir, ok, mb(sizes[0]), mb(total), wall.Round(time.Millisecond), mb(total)/wall.Seconds())
	fmt.Printf("  download time p50 %s p99 %s\n", pct(lat, 50).Round(time.Millisecond), pct(lat, 99).Round(time.Millisecond))
	fmt.Printf("  daemon RSS: %.0f MB before, peak %.0f MB sampled, VmHWM %.0f MB\n", float64(rssBefore)/1024, float64(peakRSS)/1024, float64(hwm)/1024)
	fmt.Printf("  GET /v1/status meanwhile: %d calls, p50 %s p99 %s max %s, %d errors\n", len(apiLat),
		pct(apiLat, 50).Round(time.Microsecond), pct(apiLat, 99).Round(time.Microsecond), pct(apiLat, 100).Round(time.Microsecond), apiErrs)
	return serveFigures{hwmMB: float64(hwm) / 1024, apiP99: pct(apiLat, 99), ok: ok}, nil
}

// maxAgentMB is the slim agent's size target per architecture.
const maxAgentMB = 20

// all runs every measurement against the agents in agentDir and prints a
// summary in bench/run.sh's FIGURE format.
func all(ctx context.Context, agentDir string, rate float64, nodes, n int) error {
	if rate <= 0 {
		rate = 12.5e6 // 100 Mbit/s: a single TCP stream across regions
	}
	var figs []string
	verdict := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "FAIL"
	}
	for _, arch := range bootstrap.AgentArches {
		st, err := os.Stat(filepath.Join(agentDir, bootstrap.AgentFlavorFileName(bootstrap.FlavorSlim, arch)))
		if err != nil {
			return err
		}
		figs = append(figs, fmt.Sprintf("FIGURE agent_size_linux_%s = %.1f MB (target <= %d) %s", arch, mb(st.Size()), maxAgentMB, verdict(mb(st.Size()) <= maxAgentMB)))
	}
	loop, err := boot(ctx, agentDir, 0, true, nodes)
	if err != nil {
		return err
	}
	figs = append(figs, fmt.Sprintf("FIGURE agent_boot_loopback = %.3f s (running → registered, median of %d)", loop.Seconds(), nodes))
	slow, err := boot(ctx, agentDir, rate, true, nodes)
	if err != nil {
		return err
	}
	figs = append(figs, fmt.Sprintf("FIGURE agent_boot_%s = %.3f s (running → registered, median of %d)", strings.ReplaceAll(linkName(rate), " ", ""), slow.Seconds(), nodes))
	sf, err := serve(ctx, agentDir, n, true)
	if err != nil {
		return err
	}
	figs = append(figs, fmt.Sprintf("FIGURE agent_serve_%d_rss = %.0f MB (daemon VmHWM)", n, sf.hwmMB),
		fmt.Sprintf("FIGURE agent_serve_%d_status_p99 = %.1f ms (GET /v1/status during the downloads)", n, float64(sf.apiP99.Microseconds())/1000),
		fmt.Sprintf("FIGURE agent_serve_%d_ok = %d of %d %s", n, sf.ok, n, verdict(sf.ok == n)))
	fmt.Println("==== agent: summary ====")
	missed := 0
	for _, f := range figs {
		fmt.Println(f)
		if strings.HasSuffix(f, " FAIL") {
			missed++
		}
	}
	// Like every benchmark program: a missed target is a failed run.
	if missed > 0 {
		return fmt.Errorf("%d agent targets missed", missed)
	}
	return nil
}

// procKB reads a "Vm…: N kB" line of /proc/pid/status.
func procKB(pid int, key string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

func pct(s []time.Duration, p int) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return s[max(i, 0)]
}

func median(s []time.Duration) time.Duration {
	c := slices.Clone(s)
	slices.Sort(c)
	return pct(c, 50)
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }

func linkName(rate float64) string {
	if rate <= 0 {
		return "loopback"
	}
	return fmt.Sprintf("%.0f Mbit/s", rate*8/1e6)
}

// throttle is a TCP proxy whose daemon→node direction is paced to rate
// bytes/s per connection: a cross-region link.
type throttle struct {
	ln   net.Listener
	to   string
	rate float64
}

func newThrottle(to string, rate float64) (*throttle, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &throttle{ln: ln, to: to, rate: rate}
	go t.serve()
	return t, nil
}

func (t *throttle) Addr() string { return t.ln.Addr().String() }
func (t *throttle) Close() error { return t.ln.Close() }

func (t *throttle) serve() {
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			up, err := net.Dial("tcp", t.to)
			if err != nil {
				return
			}
			defer up.Close()
			go func() { _, _ = io.Copy(up, c) }()
			// Paced copy: after each 16 KiB chunk, sleep until the bytes
			// sent so far fit the rate.
			buf := make([]byte, 16<<10)
			start, sent := time.Now(), 0
			for {
				n, err := up.Read(buf)
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
					sent += n
					if d := time.Duration(float64(sent)/t.rate*float64(time.Second)) - time.Since(start); d > 0 {
						time.Sleep(d)
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}
