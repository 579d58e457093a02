package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/plugins/handshake"
	"github.com/fleetd/fleetd/providers"
	"github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
)

// ExternalPrefix is the file name prefix of an external provider plugin:
// provider NAME is the executable <PluginDir>/fleetd-provider-NAME.
const ExternalPrefix = "fleetd-provider-"

// ErrManagerClosed is returned by Get and by provider calls after Close.
var ErrManagerClosed = errors.New("plugin manager closed")

// ErrNoChecksum is wrapped by the error for an external plugin without a
// sha256 pin: fleetd never runs an unpinned binary.
var ErrNoChecksum = errors.New("no sha256 pin")

// ChecksumError reports an external plugin whose file does not match its
// pin. It matches go-plugin's ErrChecksumsDoNotMatch with errors.Is.
type ChecksumError struct {
	Name, Path       string
	Expected, Actual string // lower-case hex
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("provider plugin %q: %s does not match its sha256 pin: expected %s, actual %s; refusing to run it",
		e.Name, e.Path, e.Expected, e.Actual)
}

func (e *ChecksumError) Is(target error) bool { return target == plugin.ErrChecksumsDoNotMatch }

// ManagerOptions configures a Manager.
type ManagerOptions struct {
	// SelfExe is the fleetd binary built-in providers re-execute.
	// Default: os.Executable().
	SelfExe string
	// SelfArgs are the arguments that make SelfExe serve built-in provider
	// name. Default: plugin provider NAME.
	SelfArgs func(name string) []string
	// Builtins names the providers compiled into SelfExe.
	Builtins []string
	// PluginDir holds external providers as fleetd-provider-NAME.
	// Empty: no external providers.
	PluginDir string
	// Checksums pins every external provider: name → sha256 of the file, hex
	// (an optional "sha256:" prefix is accepted).
	Checksums map[string]string
	// Env returns extra environment for plugin name's process. The daemon's
	// own environment is passed too and wins on a duplicate key. Optional.
	Env func(name string) []string
	// Logger receives the manager's and the plugins' log lines (plugins log
	// JSON on stderr; go-plugin re-levels them here). Default: info on stderr.
	Logger hclog.Logger
	// StartTimeout bounds starting one plugin process. Default: 30s.
	StartTimeout time.Duration
}

// Manager starts provider plugin processes on first use, restarts them
// when they die and kills them all on Close. It is safe for concurrent use.
type Manager struct {
	opts     ManagerOptions
	logger   hclog.Logger
	builtins map[string]bool

	mu     sync.Mutex
	closed bool
	provs  map[string]*managedProvider
}

// NewManager returns a Manager; no process starts before Get.
func NewManager(opts ManagerOptions) *Manager {
	if opts.SelfArgs == nil {
		opts.SelfArgs = func(name string) []string { return []string{"plugin", "provider", name} }
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 30 * time.Second
	}
	logger := opts.Logger
	if logger == nil {
		logger = hclog.New(&hclog.LoggerOptions{Name: "plugins", Level: hclog.Info, Output: os.Stderr})
	}
	m := &Manager{opts: opts, logger: logger, builtins: map[string]bool{}, provs: map[string]*managedProvider{}}
	for _, b := range opts.Builtins {
		m.builtins[b] = true
	}
	return m
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// Get returns provider name, starting its plugin process if it is not
// running. The returned provider restarts the process when it dies and
// retries the failed call once; it also implements providers.Interrupter
// (returning an errors.ErrUnsupported error if the plugin cannot interrupt).
// Repeated Gets return the same provider.
func (m *Manager) Get(ctx context.Context, name string) (providers.Provider, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("invalid provider name %q: want lower-case letters, digits, '-' and '_'", name)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrManagerClosed
	}
	mp := m.provs[name]
	if mp == nil {
		mp = &managedProvider{m: m, name: name, sem: make(chan struct{}, 1)}
		m.provs[name] = mp
	}
	m.mu.Unlock()
	if _, err := mp.ensure(ctx, nil); err != nil {
		return nil, err
	}
	return mp, nil
}

// PIDs returns the process id of every running plugin by provider name.
// Tests use it to kill a plugin behind the manager's back.
func (m *Manager) PIDs() map[string]int {
	m.mu.Lock()
	provs := make([]*managedProvider, 0, len(m.provs))
	for _, mp := range m.provs {
		provs = append(provs, mp)
	}
	m.mu.Unlock()
	out := map[string]int{}
	for _, mp := range provs {
		mp.mu.Lock()
		cur := mp.cur
		mp.mu.Unlock()
		if cur != nil && !cur.client.Exited() {
			out[mp.name] = cur.pid
		}
	}
	return out
}

// Close kills every plugin process and waits for them to exit (the
// semantics of go-plugin's CleanupClients, scoped to this manager). Later
// calls on providers from Get fail with ErrManagerClosed.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	provs := make([]*managedProvider, 0, len(m.provs))
	for _, mp := range m.provs {
		provs = append(provs, mp)
	}
	m.mu.Unlock()

	var wg sync.WaitGroup
	for _, mp := range provs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Taking the start slot waits out a start in flight, which
			// then sees closed and kills its own process, or stores it
			// for us to kill here.
			mp.sem <- struct{}{}
			defer func() { <-mp.sem }()
			mp.mu.Lock()
			cur := mp.cur
			mp.cur = nil
			mp.mu.Unlock()
			if cur != nil {
				cur.kill()
			}
		}()
	}
	wg.Wait()
	return nil
}

func (m *Manager) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// pluginProcess is one running plugin process.
type pluginProcess struct {
	client *plugin.Client
	prov   *GRPCClient
	pid    int
	socket string // the plugin's unix socket, if it listens on one
}

func processOf(client *plugin.Client) *pluginProcess {
	p := &pluginProcess{client: client}
	if rc := client.ReattachConfig(); rc != nil {
		p.pid = rc.Pid
		if ua, ok := rc.Addr.(*net.UnixAddr); ok {
			p.socket = ua.Name
		}
	}
	return p
}

// kill stops the process and removes its socket file, which a plugin that
// died by SIGKILL could not remove itself.
func (p *pluginProcess) kill() {
	p.client.Kill()
	if p.socket == "" {
		return
	}
	if st, err := os.Lstat(p.socket); err == nil && st.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(p.socket)
	}
}

// command builds the command for provider name: a re-exec of the fleetd
// binary for built-ins, a pinned external executable otherwise.
func (m *Manager) command(name string) (*exec.Cmd, *plugin.SecureConfig, error) {
	if m.builtins[name] {
		exe := m.opts.SelfExe
		if exe == "" {
			var err error
			if exe, err = os.Executable(); err != nil {
				return nil, nil, fmt.Errorf("built-in provider %q: locate the fleetd binary: %w", name, err)
			}
		}
		return exec.Command(exe, m.opts.SelfArgs(name)...), nil, nil
	}
	builtins := slices.Sorted(maps.Keys(m.builtins))
	if m.opts.PluginDir == "" {
		return nil, nil, fmt.Errorf("provider %q is not built in (built in: %s) and no plugin directory is configured", name, strings.Join(builtins, ", "))
	}
	path := filepath.Join(m.opts.PluginDir, ExternalPrefix+name)
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("provider %q is neither built in (built in: %s) nor installed as %s", name, strings.Join(builtins, ", "), path)
		}
		return nil, nil, fmt.Errorf("provider plugin %q: %w", name, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return nil, nil, fmt.Errorf("provider plugin %q: %s is not an executable file", name, path)
	}
	actual, err := fileSHA256(path)
	if err != nil {
		return nil, nil, fmt.Errorf("provider plugin %q: %w", name, err)
	}
	pin, ok := m.opts.Checksums[name]
	if !ok || strings.TrimSpace(pin) == "" {
		return nil, nil, fmt.Errorf("provider plugin %q (%s): %w; fleetd never runs an unpinned plugin: once you trust this file, pin it in the daemon config: plugin %q { sha256 = %q }",
			name, path, ErrNoChecksum, name, actual)
	}
	expected := strings.ToLower(strings.TrimPrefix(strings.TrimSpace(pin), "sha256:"))
	want, err := hex.DecodeString(expected)
	if err != nil || len(want) != sha256.Size {
		return nil, nil, fmt.Errorf("provider plugin %q: pin %q is not a sha256 hex digest", name, pin)
	}
	if actual != expected {
		return nil, nil, &ChecksumError{Name: name, Path: path, Expected: expected, Actual: actual}
	}
	// go-plugin hashes the file again right before exec, narrowing the
	// window in which it could be swapped after our check.
	return exec.Command(path), &plugin.SecureConfig{Checksum: want, Hash: sha256.New()}, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// start launches and connects to one plugin process and checks that it
// serves the provider it was started for.
func (m *Manager) start(name string) (*pluginProcess, error) {
	cmd, secure, err := m.command(name)
	if err != nil {
		return nil, err
	}
	setProcAttr(cmd)
	if m.opts.Env != nil {
		cmd.Env = append(cmd.Env, m.opts.Env(name)...)
	}
	logger := m.logger.Named(name)
	stdio := logger.StandardWriter(&hclog.StandardLoggerOptions{InferLevels: true})
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  handshake.HandshakeConfig,
		VersionedPlugins: pluginSets(nil, nil),
		Cmd:              cmd,
		SecureConfig:     secure,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		// The daemon kills its plugins itself (Close, restarts), so they
		// are not registered with go-plugin's process-global list, which
		// is never pruned and would grow with every restart.
		Managed:      false,
		AutoMTLS:     true,
		Logger:       logger,
		StartTimeout: m.opts.StartTimeout,
		SyncStdout:   stdio,
		SyncStderr:   stdio,
	})
	fail := func(err error) (*pluginProcess, error) {
		processOf(client).kill()
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			return nil, fmt.Errorf("provider plugin %q: %s changed since it was checked: %w", name, cmd.Path, err)
		}
		return nil, fmt.Errorf("start provider plugin %q (%s): %w", name, cmd.Path, err)
	}
	rpc, err := client.Client()
	if err != nil {
		return fail(err)
	}
	raw, err := rpc.Dispense(handshake.PluginName)
	if err != nil {
		return fail(err)
	}
	prov, ok := raw.(*GRPCClient)
	if !ok {
		return fail(fmt.Errorf("dispensed %T, want *GRPCClient", raw))
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.StartTimeout)
	defer cancel()
	info, err := prov.Info(ctx)
	if err != nil {
		return fail(fmt.Errorf("Info: %w", err))
	}
	if info.Name != name {
		return fail(fmt.Errorf("plugin serves provider %q, not %q", info.Name, name))
	}
	p := processOf(client)
	p.prov = prov
	logger.Debug("provider plugin started", "path", cmd.Path, "pid", p.pid, "protocol", client.NegotiatedVersion())
	return p, nil
}

// managedProvider is what Manager.Get returns: a provider whose plugin
// process is (re)started on demand.
type managedProvider struct {
	m    *Manager
	name string
	// sem is a one-slot semaphore held by whoever (re)starts the process,
	// so concurrent callers share one start and one restart.
	sem chan struct{}

	mu  sync.Mutex
	cur *pluginProcess
}

var (
	_ providers.Provider    = (*managedProvider)(nil)
	_ providers.Interrupter = (*managedProvider)(nil)
	_ providers.Checker     = (*managedProvider)(nil)

	_ providers.NetworkReleaser = (*managedProvider)(nil)
)

func (mp *managedProvider) usable(p, stale *pluginProcess) bool {
	return p != nil && p != stale && !p.client.Exited()
}

// ensure returns a running process, starting one if there is none, the
// current one has exited, or it is stale (the caller saw it fail).
func (mp *managedProvider) ensure(ctx context.Context, stale *pluginProcess) (*pluginProcess, error) {
	mp.mu.Lock()
	cur := mp.cur
	mp.mu.Unlock()
	if mp.usable(cur, stale) {
		return cur, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start provider plugin %q: %w", mp.name, err)
	}
	select {
	case mp.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("start provider plugin %q: %w", mp.name, ctx.Err())
	}
	if mp.m.isClosed() {
		<-mp.sem
		return nil, ErrManagerClosed
	}
	mp.mu.Lock()
	cur = mp.cur
	mp.mu.Unlock()
	if mp.usable(cur, stale) { // someone else restarted it meanwhile
		<-mp.sem
		return cur, nil
	}

	type result struct {
		p   *pluginProcess
		err error
	}
	done := make(chan result, 1)
	// The start runs on its own goroutine, holding the slot, so a caller
	// whose context ends stops waiting while the process still comes up
	// for the next caller, and the slot is never leaked.
	go func() {
		defer func() { <-mp.sem }()
		if cur != nil {
			if cur.client.Exited() {
				mp.m.logger.Warn("provider plugin exited; restarting it", "provider", mp.name, "pid", cur.pid)
			}
			cur.kill() // reap the dead or unreachable process
		}
		p, err := mp.m.start(mp.name)
		if err == nil && mp.m.isClosed() {
			p.kill()
			p, err = nil, ErrManagerClosed
		}
		mp.mu.Lock()
		mp.cur = p
		mp.mu.Unlock()
		done <- result{p, err}
	}()
	select {
	case r := <-done:
		return r.p, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("start provider plugin %q: %w", mp.name, ctx.Err())
	}
}

// call runs f on the plugin; if the plugin is unreachable (it died or its
// connection broke), it restarts the process and runs f once more. That is
// safe because every provider call is idempotent by contract.
func call[T any](ctx context.Context, mp *managedProvider, method string, f func(*GRPCClient) (T, error)) (T, error) {
	var zero T
	p, err := mp.ensure(ctx, nil)
	if err != nil {
		return zero, err
	}
	v, err := f(p.prov)
	if err == nil || !IsTransportError(err) || ctx.Err() != nil {
		return v, err
	}
	mp.m.logger.Warn("provider plugin unreachable; restarting it and retrying once",
		"provider", mp.name, "method", method, "pid", p.pid, "error", err)
	p2, rerr := mp.ensure(ctx, p)
	if rerr != nil {
		return zero, fmt.Errorf("%w; restarting the plugin failed: %w", err, rerr)
	}
	return f(p2.prov)
}

func (mp *managedProvider) Info(ctx context.Context) (providers.Info, error) {
	return call(ctx, mp, "Info", func(c *GRPCClient) (providers.Info, error) { return c.Info(ctx) })
}

func (mp *managedProvider) Offerings(ctx context.Context, cfg providers.Config) ([]providers.Offering, error) {
	return call(ctx, mp, "Offerings", func(c *GRPCClient) ([]providers.Offering, error) { return c.Offerings(ctx, cfg) })
}

func (mp *managedProvider) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	return call(ctx, mp, "Create", func(c *GRPCClient) ([]providers.Instance, error) { return c.Create(ctx, cfg, req) })
}

func (mp *managedProvider) Get(ctx context.Context, cfg providers.Config, id string) (providers.Instance, error) {
	return call(ctx, mp, "Get", func(c *GRPCClient) (providers.Instance, error) { return c.Get(ctx, cfg, id) })
}

func (mp *managedProvider) List(ctx context.Context, cfg providers.Config, tags map[string]string) ([]providers.Instance, error) {
	return call(ctx, mp, "List", func(c *GRPCClient) ([]providers.Instance, error) { return c.List(ctx, cfg, tags) })
}

func (mp *managedProvider) Delete(ctx context.Context, cfg providers.Config, id string) error {
	_, err := call(ctx, mp, "Delete", func(c *GRPCClient) (struct{}, error) { return struct{}{}, c.Delete(ctx, cfg, id) })
	return err
}

func (mp *managedProvider) Interrupt(ctx context.Context, cfg providers.Config, id string, info providers.InterruptionInfo) error {
	_, err := call(ctx, mp, "Interrupt", func(c *GRPCClient) (struct{}, error) { return struct{}{}, c.Interrupt(ctx, cfg, id, info) })
	return err
}

func (mp *managedProvider) Check(ctx context.Context, cfg providers.Config, opts providers.CheckOptions) ([]providers.CheckResult, error) {
	return call(ctx, mp, "Check", func(c *GRPCClient) ([]providers.CheckResult, error) { return c.Check(ctx, cfg, opts) })
}

func (mp *managedProvider) ReleaseNetwork(ctx context.Context, cfg providers.Config, group string) error {
	_, err := call(ctx, mp, "ReleaseNetwork", func(c *GRPCClient) (struct{}, error) { return struct{}{}, c.ReleaseNetwork(ctx, cfg, group) })
	return err
}
