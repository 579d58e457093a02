package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/internal/ctxtime"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
)

// Defaults of Options.
const (
	DefaultStopGrace = 5 * time.Second
	DefaultRetention = time.Hour
)

// Options configure a local provider. The zero value works.
type Options struct {
	// StateDir holds instance records and node directories; a provider
	// block's state_dir overrides it. Default: <user cache dir>/fleetd/local.
	StateDir string
	// AgentBinary is the fleetd binary that runs `local-node` and `agent`;
	// default os.Executable().
	AgentBinary string
	// StopGrace is how long a stopping node's processes get between SIGTERM
	// and SIGKILL (Delete, reclaim at a notice deadline). Default 5 s.
	StopGrace time.Duration
	// Retention is how long terminated instances stay visible to Get and
	// List before their records and directories are removed. Default 1 h.
	Retention time.Duration
}

// Provider is the local provider. Nodes are process trees on this machine
// that outlive the Provider value and its process, like VMs outlive the
// API client that launched them: all state is in the state dir.
type Provider struct {
	opts Options
}

var (
	_ providers.Provider    = (*Provider)(nil)
	_ providers.Interrupter = (*Provider)(nil)
)

// New returns a local provider.
func New(opts Options) providers.Provider {
	if opts.StopGrace <= 0 {
		opts.StopGrace = DefaultStopGrace
	}
	if opts.Retention <= 0 {
		opts.Retention = DefaultRetention
	}
	return &Provider{opts: opts}
}

// Info implements providers.Provider.
func (p *Provider) Info(ctx context.Context) (providers.Info, error) {
	if err := ctx.Err(); err != nil {
		return providers.Info{}, err
	}
	return providers.Info{Name: Name, Schema: Schema, NoticeLead: DefaultNoticeLead}, nil
}

// setup decodes the block and finds the state dir. Every method starts
// with it, so it also refuses an already cancelled context: the local
// calls are too quick to notice cancellation later.
func (p *Provider) setup(ctx context.Context, cfg providers.Config) (settings, store, error) {
	if err := ctx.Err(); err != nil {
		return settings{}, store{}, err
	}
	s, err := decodeSettings(cfg)
	if err != nil {
		return settings{}, store{}, err
	}
	dir := s.StateDir
	if dir == "" {
		dir = p.opts.StateDir
	}
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return settings{}, store{}, fmt.Errorf("local provider: no state dir: %w", err)
		}
		dir = filepath.Join(cache, "fleetd", "local")
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return settings{}, store{}, err
	}
	return s, store{dir: dir}, nil
}

// Offerings implements providers.Provider. Spot offerings of zones with a
// capacity report how many more instances fit.
func (p *Provider) Offerings(ctx context.Context, cfg providers.Config) ([]providers.Offering, error) {
	s, st, err := p.setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	recs, err := st.all()
	if err != nil {
		return nil, err
	}
	return s.offerings(liveSpotByZone(recs)), nil
}

func liveSpotByZone(recs []record) map[string]int {
	n := map[string]int{}
	for _, r := range recs {
		if r.Offering.CapacityType == providers.Spot && r.TerminatedAt.IsZero() && alive(r.PID, r.PIDStart) {
			n[r.Offering.Zone]++
		}
	}
	return n
}

// Create implements providers.Provider: it boots req.Count nodes from the
// request's #cloud-config user-data. Idempotent under req.IdempotencyToken.
func (p *Provider) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	s, st, err := p.setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if req.Count < 1 {
		return nil, providers.InvalidConfig(fmt.Errorf("launch count %d: want at least 1", req.Count))
	}
	off, ok := s.offering(req.Offering)
	if !ok {
		return nil, providers.InvalidConfig(fmt.Errorf("offering %s is not offered by this provider block", req.Offering.Key()))
	}
	boot, err := bootDocument(req)
	if err != nil {
		return nil, providers.InvalidConfig(err)
	}

	unlock, err := st.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	st.gc(time.Now(), p.opts.Retention)

	// ids are all the request's instances; todo the ones to start now.
	var ids, todo []string
	resumed := false
	if req.IdempotencyToken != "" {
		tf, found, err := st.loadToken(req.IdempotencyToken)
		if err != nil {
			return nil, err
		}
		if found {
			if tf.Offering != off.Key() || tf.Count != req.Count {
				return nil, providers.InvalidConfig(fmt.Errorf("idempotency token reused with different parameters (first: %d x %s)", tf.Count, tf.Offering))
			}
			// Ids without a record were never started: the first call
			// died half-way. Start them now instead of new ones.
			for _, id := range tf.Instances {
				if _, err := st.load(id); providers.IsNotFound(err) {
					todo = append(todo, id)
				}
			}
			ids, resumed = tf.Instances, true
		}
	}
	if !resumed {
		ids = make([]string, req.Count)
		for i := range ids {
			ids[i] = newInstanceID()
		}
		todo = ids
	}
	if len(todo) == 0 {
		return p.instances(st, ids)
	}

	recs, err := st.all()
	if err != nil {
		return nil, err
	}
	if c, limited := s.Capacity[off.Zone]; limited && off.CapacityType == providers.Spot {
		if used := liveSpotByZone(recs)[off.Zone]; used+len(todo) > c {
			e := providers.InsufficientCapacity(fmt.Errorf("zone %s has spot capacity %d, %d in use, %d requested", off.Zone, c, used, len(todo)))
			e.Code, e.Offering = "InsufficientInstanceCapacity", off.Key()
			return nil, e
		}
	}
	taken := map[string]bool{}
	for _, r := range recs {
		if r.TerminatedAt.IsZero() && alive(r.PID, r.PIDStart) {
			taken[r.Address] = true
		}
	}

	// The ids are written to the token file before any node starts, so a
	// retry after a crash half-way starts the missing ones, never a second set.
	if req.IdempotencyToken != "" && !resumed {
		if err := st.saveToken(req.IdempotencyToken, tokenFile{Offering: off.Key(), Count: req.Count, Instances: ids, CreatedAt: time.Now().UTC()}); err != nil {
			return nil, err
		}
	}
	var started []string
	for _, id := range todo {
		if err := p.launch(ctx, st, s, cfg, req, off, id, boot, taken); err != nil {
			// The request failed as a whole: what this call started never
			// existed, and a fresh token file is released for a retry.
			for _, l := range started {
				_ = p.stopNode(context.WithoutCancel(ctx), st, l)
				_ = os.RemoveAll(st.instanceDir(l))
			}
			if req.IdempotencyToken != "" && !resumed {
				_ = os.Remove(st.tokenPath(req.IdempotencyToken))
			}
			return nil, err
		}
		started = append(started, id)
	}
	return p.instances(st, ids)
}

// bootDocument validates the user-data and returns the cloud-config the
// node boots from.
func bootDocument(req providers.LaunchRequest) (cloudConfig, error) {
	if strings.TrimSpace(req.UserData) == "" {
		return cloudConfig{}, nil
	}
	return parseCloudConfig([]byte(req.UserData))
}

// defaultAgentConfig is the agent config the local "machine image" ships
// at AgentConfigPath: a standalone agent watching the node's metadata.
// User-data that writes AgentConfigPath replaces it, as cloud-init would
// overwrite a file baked into an image.
func defaultAgentConfig(cfg providers.Config, req providers.LaunchRequest, id string) []byte {
	fleet := cfg.Fleet
	if fleet == "" {
		fleet = req.Tags[providers.TagFleet]
	}
	if fleet == "" {
		fleet = "default"
	}
	nodeID := req.Tags[providers.TagNodeID]
	if nodeID == "" {
		nodeID = id
	}
	b, _ := json.MarshalIndent(map[string]any{
		"fleet": fleet, "node_id": nodeID, "metadata": map[string]string{"kind": "aws-imds"},
	}, "", "  ")
	return append(b, '\n')
}

// launch prepares one node's directory and starts its supervisor. Called
// with the lock held.
func (p *Provider) launch(ctx context.Context, st store, s settings, cfg providers.Config, req providers.LaunchRequest, off providers.Offering, id string, boot cloudConfig, taken map[string]bool) (err error) {
	dir := st.instanceDir(id)
	started := false
	defer func() {
		if err != nil && !started {
			_ = os.RemoveAll(dir) // nothing runs: leave no record behind
		}
	}()
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "user-data"), []byte(req.UserData), 0o600); err != nil {
		return err
	}
	image := cloudConfig{WriteFiles: []writeFile{{Path: AgentConfigPath, Content: string(defaultAgentConfig(cfg, req, id)), Permissions: "0600"}}}
	if err := image.writeFiles(root); err != nil {
		return err
	}
	if err := boot.writeFiles(root); err != nil {
		return providers.InvalidConfig(fmt.Errorf("booting %s: %w", id, err))
	}

	ln, addr, err := allocateAddress(s.AddressPrefix, taken)
	if err != nil {
		e := providers.InsufficientCapacity(err)
		e.Offering = off.Key()
		return e
	}
	defer ln.Close()
	taken[addr] = true

	bin := p.opts.AgentBinary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return fmt.Errorf("local provider: fleetd binary: %w", err)
		}
	}
	rec := record{
		ID: id, Fleet: cfg.Fleet, Offering: off, Address: addr,
		TokenHash:   hashOrEmpty(req.IdempotencyToken),
		MetadataURL: "http://" + ln.Addr().String(),
		Tags:        copyTags(req.Tags),
		LaunchedAt:  time.Now().UTC(),
		Secret:      randomHex(32),
		AgentBinary: bin,
		StopGrace:   p.opts.StopGrace,
	}
	if err := st.save(rec); err != nil {
		return err
	}

	lf, err := ln.(*net.TCPListener).File()
	if err != nil {
		return err
	}
	defer lf.Close()
	console, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer console.Close()
	cmd := exec.Command(bin, NodeCommand, "-dir", dir)
	cmd.Dir = dir
	cmd.Env = append(nodeEnv(), envListenFD+"=3")
	cmd.ExtraFiles = []*os.File{lf}
	cmd.Stdout, cmd.Stderr = console, console
	// A session of its own: no signal aimed at the daemon (terminal ^C,
	// its process group) reaches the node, and no Pdeathsig: nodes outlive
	// the daemon like VMs do.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting node %s: %w", id, err)
	}
	started = true
	go func() { _ = cmd.Wait() }() // reap it while this process lives; init does afterwards
	start, err := startTime(cmd.Process.Pid)
	if err != nil {
		return fmt.Errorf("node %s exited at once (see %s): %w", id, filepath.Join(dir, "console.log"), err)
	}
	rec.PID, rec.PIDStart = cmd.Process.Pid, start
	return st.save(rec)
}

// allocateAddress returns a listener on the first free prefix+N. An
// address is free if no live node of this state dir has it and nothing
// listens on it (nodes of another state dir, other programs); binding it
// proves it is usable.
func allocateAddress(prefix string, taken map[string]bool) (net.Listener, string, error) {
	listening := listeningIPs()
	for i := 1; i <= 254; i++ {
		addr := prefix + strconv.Itoa(i)
		if taken[addr] || listening[addr] {
			continue
		}
		ln, err := net.Listen("tcp4", net.JoinHostPort(addr, "0"))
		if err != nil {
			continue
		}
		return ln, addr, nil
	}
	return nil, "", fmt.Errorf("no free address left in %s1-254", prefix)
}

// listeningIPs returns the IPv4 addresses with a listening TCP socket,
// from /proc/net/tcp (addresses are hex in host byte order).
func listeningIPs() map[string]bool {
	out := map[string]bool{}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return out
	}
	for _, line := range bytes.Split(b, []byte("\n"))[1:] {
		f := bytes.Fields(line)
		if len(f) < 4 || string(f[3]) != "0A" { // 0A = LISTEN
			continue
		}
		host, _, ok := bytes.Cut(f[1], []byte(":"))
		v, err := strconv.ParseUint(string(host), 16, 32)
		if !ok || err != nil {
			continue
		}
		var ip [4]byte
		binary.NativeEndian.PutUint32(ip[:], uint32(v))
		out[net.IP(ip[:]).String()] = true
	}
	return out
}

func hashOrEmpty(token string) string {
	if token == "" {
		return ""
	}
	return tokenHash(token)
}

func newInstanceID() string { return "i-" + randomHex(9)[:17] }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func copyTags(t map[string]string) map[string]string {
	out := make(map[string]string, len(t))
	for k, v := range t {
		out[k] = v
	}
	return out
}

// Get implements providers.Provider.
func (p *Provider) Get(ctx context.Context, cfg providers.Config, id string) (providers.Instance, error) {
	_, st, err := p.setup(ctx, cfg)
	if err != nil {
		return providers.Instance{}, err
	}
	rec, err := st.load(id)
	if err != nil {
		return providers.Instance{}, err
	}
	return p.observe(ctx, st, rec)
}

// List implements providers.Provider. Terminated instances are listed
// until the retention passes, so losses stay visible to crash adoption.
func (p *Provider) List(ctx context.Context, cfg providers.Config, tags map[string]string) ([]providers.Instance, error) {
	_, st, err := p.setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	unlock, err := st.lock(ctx)
	if err != nil {
		return nil, err
	}
	st.gc(time.Now(), p.opts.Retention)
	unlock()
	recs, err := st.all()
	if err != nil {
		return nil, err
	}
	var out []providers.Instance
	for _, r := range recs {
		if !providers.HasTags(r.Tags, tags) {
			continue
		}
		inst, err := p.observe(ctx, st, r)
		if providers.IsNotFound(err) {
			continue // removed since all() read it
		}
		if err != nil {
			return nil, err
		}
		out = append(out, inst)
	}
	return out, nil
}

func (p *Provider) instances(st store, ids []string) ([]providers.Instance, error) {
	out := make([]providers.Instance, 0, len(ids))
	for _, id := range ids {
		rec, err := st.load(id)
		if err != nil {
			return nil, err
		}
		inst, _ := p.view(st, rec)
		out = append(out, inst)
	}
	return out, nil
}

// view computes the instance as observed now, and whether the record has
// to be updated because the node died since it was last looked at.
func (p *Provider) view(st store, rec record) (providers.Instance, bool) {
	inst := providers.Instance{
		ID: rec.ID, Offering: rec.Offering, Address: rec.Address,
		Tags: copyTags(rec.Tags), LaunchedAt: rec.LaunchedAt, Interruption: rec.Interruption,
	}
	if !rec.TerminatedAt.IsZero() {
		inst.State = providers.StateTerminated
		return inst, false
	}
	stat := st.readStatus(rec.ID)
	if stat.Notice != nil {
		n := *stat.Notice
		inst.Interruption = &n
	}
	agentGone := stat.AgentPID != 0 && !alive(stat.AgentPID, stat.AgentStart)
	switch {
	case rec.PID == 0:
		// Never started (the launching process died half-way); only
		// possible to see here with the lock held, as Create holds it.
		inst.State = providers.StatePending
	case alive(rec.PID, rec.PIDStart) && !agentGone && !stat.Exited:
		inst.State = providers.StateRunning
		if stat.AgentPID == 0 {
			inst.State = providers.StatePending
		}
	default:
		inst.State = providers.StateTerminated
		return inst, true
	}
	return inst, false
}

// observe is view plus persisting a death, under the lock. A node that
// died without Delete is reported with Interruption kind "lost" (unless
// its own notice's deadline ended it), so the daemon can tell an announced
// reclaim from an unannounced loss.
func (p *Provider) observe(ctx context.Context, st store, rec record) (providers.Instance, error) {
	inst, changed := p.view(st, rec)
	if !changed && rec.PID != 0 {
		return inst, nil
	}
	unlock, err := st.lock(ctx)
	if err != nil {
		return providers.Instance{}, err
	}
	defer unlock()
	if rec, err = st.load(rec.ID); err != nil {
		return providers.Instance{}, err
	}
	inst, changed = p.view(st, rec)
	if rec.PID == 0 && rec.TerminatedAt.IsZero() {
		changed = true // Create is not running (we hold the lock): it crashed before the start
	}
	if !changed {
		return inst, nil
	}
	p.markTerminated(st, &rec)
	if err := st.save(rec); err != nil {
		return providers.Instance{}, err
	}
	// A terminated VM runs nothing: if only part of the node died (say the
	// supervisor was SIGKILLed), finish it off.
	if rec.PID != 0 && sessionIsOurs(rec.PID, rec.PIDStart) {
		signalSession(rec.PID, 0, syscall.SIGKILL)
	}
	inst, _ = p.view(st, rec)
	return inst, nil
}

func (p *Provider) markTerminated(st store, rec *record) {
	stat := st.readStatus(rec.ID)
	rec.TerminatedAt = time.Now().UTC()
	if stat.Exited && !stat.ExitedAt.IsZero() {
		rec.TerminatedAt = stat.ExitedAt
	}
	switch {
	case stat.Notice != nil && stat.Notice.Kind != string(interruption.Rebalance):
		n := *stat.Notice // announced, whoever ended it
		rec.Interruption = &n
	case !rec.Deleted:
		rec.Interruption = &providers.InterruptionInfo{Kind: string(interruption.Lost), Deadline: rec.TerminatedAt}
	}
}

// Delete implements providers.Provider: SIGTERM to the node's process
// group and session, SIGKILL after the grace. Deleting an absent or
// terminated instance is not an error.
func (p *Provider) Delete(ctx context.Context, cfg providers.Config, id string) error {
	_, st, err := p.setup(ctx, cfg)
	if err != nil {
		return err
	}
	unlock, err := st.lock(ctx)
	if err != nil {
		return err
	}
	rec, err := st.load(id)
	if providers.IsNotFound(err) {
		unlock()
		return nil
	}
	if err != nil {
		unlock()
		return err
	}
	if rec.Deleted && !rec.TerminatedAt.IsZero() {
		unlock()
		return nil
	}
	// Mark first, so a concurrent observer does not take the death for a loss.
	if !rec.Deleted {
		rec.Deleted, rec.DeletedAt = true, time.Now().UTC()
		if err := st.save(rec); err != nil {
			unlock()
			return err
		}
	}
	unlock() // the stop can take the grace period; do not block others

	if err := p.stopNode(ctx, st, id); err != nil {
		return err
	}
	unlock, err = st.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if rec, err = st.load(id); err != nil {
		return err
	}
	if rec.TerminatedAt.IsZero() {
		p.markTerminated(st, &rec)
		return st.save(rec)
	}
	return nil
}

// stopNode stops a node's processes and waits until none is left.
func (p *Provider) stopNode(ctx context.Context, st store, id string) error {
	rec, err := st.load(id)
	if err != nil {
		return err
	}
	if rec.PID == 0 || !sessionIsOurs(rec.PID, rec.PIDStart) {
		return nil
	}
	sid := rec.PID
	if alive(rec.PID, rec.PIDStart) {
		_ = syscall.Kill(-sid, syscall.SIGTERM) // the supervisor and agent's group
	}
	signalSession(sid, 0, syscall.SIGTERM) // and anything that left the group
	grace := p.opts.StopGrace
	deadline := time.Now().Add(grace)
	for len(sessionMembers(sid, 0)) > 0 && time.Now().Before(deadline) {
		if err := ctxtime.Sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	for i := 0; i < 200; i++ {
		if !sessionIsOurs(sid, rec.PIDStart) || signalSession(sid, 0, syscall.SIGKILL) == 0 {
			return nil
		}
		if err := ctxtime.Sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("node %s: processes of session %d survived SIGKILL", id, sid)
}

// Interrupt implements providers.Interrupter: it publishes a notice on the
// node's metadata service and has the node's supervisor end the node at the
// deadline (info.Deadline, else now + the block's notice_lead). Kind
// defaults to spot-interruption; "lost" ends the node at once, unannounced.
func (p *Provider) Interrupt(ctx context.Context, cfg providers.Config, id string, info providers.InterruptionInfo) error {
	s, st, err := p.setup(ctx, cfg)
	if err != nil {
		return err
	}
	rec, err := st.load(id)
	if err != nil {
		return err
	}
	inst, err := p.observe(ctx, st, rec)
	if err != nil {
		return err
	}
	if inst.State == providers.StateTerminated {
		return providers.NotFound(fmt.Errorf("instance %s is terminated", id))
	}
	kind := info.Kind
	if kind == "" {
		kind = string(interruption.SpotInterruption)
	}
	if _, err := interruption.ParseKind(kind); err != nil {
		return providers.InvalidConfig(err)
	}
	deadline := info.Deadline
	if deadline.IsZero() {
		deadline = time.Now().Add(s.NoticeLead)
	}
	// IMDS publishes whole seconds; keep every view of the deadline equal.
	deadline = deadline.UTC().Truncate(time.Second)
	body, _ := json.Marshal(interruptRequest{Kind: kind, Deadline: deadline.UTC()})
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rec.MetadataURL+controlInterruptPath, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set(headerNodeSecret, rec.Secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return providers.Transient(fmt.Errorf("interrupting %s: %w", id, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		msg := make([]byte, 512)
		n, _ := resp.Body.Read(msg)
		return fmt.Errorf("interrupting %s: node supervisor answered HTTP %d: %s", id, resp.StatusCode, bytes.TrimSpace(msg[:n]))
	}
	return nil
}
