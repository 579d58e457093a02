// Package fleet is the fleetd control daemon's setup and HTTP surface: it
// opens the state store (bbolt, or etcd for a cluster), builds the parts
// that own each concern — fleet/controller (the running fleets and their
// reconcile passes), fleet/stats, fleet/agentapi, fleet/intake, the
// rendezvous host (rendezvous.go) — wires them to each other through small
// shims (wiring.go), starts the leader's duties per term (leader.go), and
// serves the API: plan, apply and destroy (apply.go), status (status.go),
// offerings, tokens, checks. It owns no fleet's state itself.
package fleet

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/agentapi"
	"github.com/fleetd/fleetd/fleet/allocator"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/api/dashboard"
	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/cluster"
	"github.com/fleetd/fleetd/fleet/controller"
	"github.com/fleetd/fleetd/fleet/intake"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/stats"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/rendezvous"
)

// Options are the daemon's injected dependencies.
type Options struct {
	Config  Config
	Version string
	Logger  *slog.Logger
	// Schema looks up a provider's config schema for decoding spec blocks.
	Schema func(provider string) (providers.ConfigSchema, bool)
	// Now is the clock; time.Now when nil. Injected so tests and the
	// simulator control time.
	Now func() time.Time
	// Providers hands out providers by name (the plugin manager in
	// production, in-process providers in tests).
	Providers ProviderSource
	// Tick is the periodic reconcile interval (default 2s).
	Tick time.Duration
	// Params tune the reconciler (zero values mean its defaults).
	Params reconcile.Params
	// Autoscale tunes the goodput autoscaler; zero fields take the
	// config's autoscale block, then the defaults.
	Autoscale autoscale.Params
	// PollInterval is how often provider-side interruption sources (GCE
	// zone operations) are polled; default 10s.
	PollInterval time.Duration
	// StrayScan is how often the leader looks for instances with its
	// daemon id that no fleet it knows owns (strays.go); default 5 min.
	StrayScan time.Duration
	// Allocation tunes the allocator that sizes fleets within projects
	// and budgets (zero fields: its defaults; docs/projects.md).
	Allocation allocator.Params
}

// mergeAllocation: Options' fields first, then the config's allocation block.
func mergeAllocation(a, b allocator.Params) allocator.Params {
	for _, f := range []struct{ to, from *time.Duration }{{&a.MinInterval, &b.MinInterval}, {&a.Horizon, &b.Horizon},
		{&a.AgingEvery, &b.AgingEvery}, {&a.ReserveAfter, &b.ReserveAfter}} {
		if *f.to == 0 {
			*f.to = *f.from
		}
	}
	a.Fairness = cmp.Or(a.Fairness, b.Fairness)
	return a
}

// ProviderSource is what the daemon needs from the plugin manager.
type ProviderSource interface {
	Get(ctx context.Context, name string) (providers.Provider, error)
}

// Daemon is one running fleetd control daemon.
type Daemon struct {
	strays strayScan
	cfg    Config
	opts   Options
	log    *slog.Logger
	store  Store
	// cl is the HA cluster this server belongs to; nil for a single server.
	cl      *clusterState
	now     func() time.Time
	started time.Time

	daemonID string
	token    string
	tokens   *scopedTokens // scoped tokens (tokens.go)
	// projects are daemon.hcl's with the admin's stored changes (projectbook.go).
	projects *projectBook
	// scope checks what tokens limited to a project reach (scope.go).
	scope      fleetScope
	nodeSecret []byte
	ca         *CA
	// agents are the agent binaries nodes download, by architecture;
	// indexed at start (agentbinaries.go).
	agents *agentBinaries
	// check answers `fleetd check` and the preflight of apply (check.go).
	check *checker
	// agentAPI serves the nodes' agents (fleet/agentapi): registration,
	// notices, logs, checkpoint store access and reports.
	agentAPI *agentapi.API

	api      *api.Server
	listener net.Listener
	httpSrv  *http.Server

	// eventLog wakes event followers at every committed write and
	// tallies the log (events.go); its Events and EventsChanged serve the
	// API.
	*eventLog
	// fleetViews answer status and fleet detail (status.go).
	*fleetViews

	// rdzv hosts the rendezvous service; a server that becomes the leader
	// of a cluster replaces it with one loaded from the store.
	rdzv   *rdzvHost
	params reconcile.Params
	// autoscaleParams tune the goodput autoscaler (training.go).
	autoscaleParams autoscale.Params
	// stats are the in-memory measurements (recoveries, provider calls,
	// prices, the event log's tally: fleet/stats); metrics is the
	// Prometheus registry behind /metrics.
	stats   *stats.Stats
	metrics *Metrics
	stream  *api.Stream

	intake *intake.Intake
	// ctrl owns the running fleets and their reconcile passes
	// (fleet/controller); it runs only while this server leads (leader.go).
	ctrl *controller.Controller

	specMu    sync.Mutex
	specCache map[string]cachedSpec
}

// New opens the state and prepares the API; it does not listen yet.
func New(ctx context.Context, opts Options) (*Daemon, error) {
	cfg := opts.Config
	if cfg.DataDir == "" {
		return nil, errors.New("data_dir is not set")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	var st Store
	var cl *clusterState
	if cfg.Cluster != nil {
		var err error
		if cl, st, err = openCluster(ctx, cfg, log, now); err != nil {
			return nil, err
		}
	} else {
		bolt, err := state.Open(filepath.Join(cfg.DataDir, "state.db"), state.Options{Now: now})
		if err != nil {
			return nil, err
		}
		st = bolt
	}
	var err error
	d := &Daemon{cl: cl, cfg: cfg, opts: opts, log: log, now: now, started: now(), specCache: map[string]cachedSpec{},
		params: opts.Params}
	d.metrics = newMetrics(opts.Version)
	d.stats = stats.New(d.metrics.reg)
	d.eventLog = newEventLog(&d.stats.Tally, log)
	d.store = notifyingStore{Store: st, notify: d.notifyEvents}
	d.eventLog.store = d.store
	d.rdzv = newRdzvHost(d.store, st, now, log, d.stats, func() { d.ctrl.Kick() })
	d.projects = &projectBook{store: d.store, base: &d.cfg.Projects, log: log}
	d.tokens = &scopedTokens{store: d.store, now: now, log: log, projectExists: func(name string) bool {
		_, ok := d.projects.Config().Get(name)
		return ok
	}}
	d.intake = intake.New(intakeDeps{d}, log, opts.PollInterval)
	d.autoscaleParams = mergeAutoscale(opts.Autoscale, cfg.Autoscale.Params())
	d.opts.Allocation = mergeAllocation(opts.Allocation, cfg.Allocation.Params())
	if d.params.MaxLaunchesPerPass == 0 {
		// The reconciler's default (8) paces growth; replacements after an
		// interruption storm must not queue behind it. Launches run 16 at a
		// time anyway.
		d.params.MaxLaunchesPerPass = 64
	}
	if d.params.OrphanGrace == 0 {
		d.params.OrphanGrace = cfg.OrphanGraceDuration()
	}
	if err := d.initIdentity(ctx); err != nil {
		st.Close()
		return nil, err
	}
	d.ctrl = d.newController()
	if err := d.loadNodeSecret(); err != nil {
		st.Close()
		return nil, fmt.Errorf("node secret: %w", err)
	}
	if cfg.TLSEnabled() && cfg.TLS.CertFile == "" {
		if d.cl != nil {
			d.ca, err = d.sharedCA(ctx)
		} else {
			d.ca, err = loadOrCreateCA(cfg.DataDir)
		}
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("tls: %w", err)
		}
	}
	if err := d.rdzv.loadRendezvous(ctx); err != nil {
		st.Close()
		return nil, err
	}
	d.agents = indexAgents(d.cfg, d.log, d.opts.Providers)
	d.check = &checker{providers: d.opts.Providers, agents: d.agents, url: d.URL, parse: d.parseRequest}
	d.agentAPI = agentapi.New(agentDeps{d}, log, d.now, d.token, d.nodeSecret)
	d.agentAPI.WarmBinaryCache()
	if err := d.agentAPI.LoadStaging(ctx); err != nil {
		st.Close()
		return nil, err
	}
	d.rdzv.auth = rendezvous.AuthorizerFunc(d.agentAPI.AuthorizeNode)
	d.fleetViews = &fleetViews{store: d.store, ctrl: d.ctrl, stats: d.stats, rdzv: d.rdzv, agentAPI: d.agentAPI, cl: d.cl, log: log, now: now,
		spec: d.fleetSpec, moveCost: d.moveCost, version: opts.Version, daemonID: d.daemonID, started: d.started}
	d.metrics.reg.MustRegister(newFleetCollector(d), newOpsCollector(d), checkpointCollector{d}, newProjectCollector(d))
	d.api = api.NewServer(d, d.token, log)
	d.api.Scoped = d.tokens.verifyScopedToken
	d.scope = fleetScope{store: d.store, spec: d.fleetSpec}
	d.api.FleetProject = d.scope.fleetProject
	d.api.Extra.Handle("/v1/rendezvous/", http.HandlerFunc(d.rdzv.serveRendezvous))
	d.mountRoutes(d.api.Extra)
	// Observability: the event stream and /metrics need a read token (or
	// better); the dashboard's static files carry no data and are served
	// without one (the page sends the token on its API calls).
	d.stream = d.api.EventStream()
	d.api.Extra.Handle("GET /v1/events/stream", d.stream)
	d.api.Extra.Handle("GET /metrics", d.api.Require(api.RoleRead, d.metrics.Handler().ServeHTTP))
	dashboard.Mount(d.api.Extra)
	return d, nil
}

// initIdentity loads or creates the daemon id (in state) and admin token (file, 0600).
func (d *Daemon) initIdentity(ctx context.Context) error {
	err := d.store.Update(ctx, func(tx state.Tx) error {
		id, err := tx.Meta("daemon_id")
		if err != nil {
			return err
		}
		if len(id) == 0 {
			id = []byte("d-" + randHex(6))
			if err := tx.SetMeta("daemon_id", id); err != nil {
				return err
			}
		}
		d.daemonID = string(id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("daemon id: %w", err)
	}
	if d.cl != nil {
		// Every server of a cluster accepts the same admin token: it lives
		// in the shared state (the first server to start makes it), and
		// each server writes it to its token file for the CLI on that VM.
		tok, err := sharedSecret(ctx, d.store, "admin_token", func() (string, error) {
			if b, err := os.ReadFile(d.cfg.TokenFile); err == nil && len(strings.TrimSpace(string(b))) >= 16 {
				return strings.TrimSpace(string(b)), nil
			}
			return "fleetd_" + randHex(24), nil
		})
		if err != nil {
			return fmt.Errorf("admin token: %w", err)
		}
		d.token = tok
		return writeFileAtomic(d.cfg.TokenFile, []byte(d.token+"\n"), 0o600)
	}
	b, err := os.ReadFile(d.cfg.TokenFile)
	switch {
	case err == nil:
		d.token = strings.TrimSpace(string(b))
		if len(d.token) < 16 {
			return fmt.Errorf("token file %s: token too short (need ≥ 16 characters)", d.cfg.TokenFile)
		}
	case errors.Is(err, os.ErrNotExist):
		d.token = "fleetd_" + randHex(24)
		if err := writeFileAtomic(d.cfg.TokenFile, []byte(d.token+"\n"), 0o600); err != nil {
			return fmt.Errorf("write token: %w", err)
		}
	default:
		return fmt.Errorf("read token: %w", err)
	}
	return nil
}

// sharedSecret returns the meta value key, creating it with mk when
// absent; concurrent first starts of several servers agree on one value
// (the store's transactions serialize them).
func sharedSecret(ctx context.Context, st state.Store, key string, mk func() (string, error)) (string, error) {
	var out string
	err := st.Update(ctx, func(tx state.Tx) error {
		v, err := tx.Meta(key)
		if err != nil {
			return err
		}
		if len(v) > 0 {
			out = string(v)
			return nil
		}
		if out, err = mk(); err != nil {
			return err
		}
		return tx.SetMeta(key, []byte(out))
	})
	return out, err
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}

// Token is the admin token (never logged).
func (d *Daemon) Token() string { return d.token }

// DaemonID identifies this deployment's daemon in instance tags.
func (d *Daemon) DaemonID() string { return d.daemonID }

// Store is the daemon's state store.
func (d *Daemon) Store() state.Store { return d.store }

// CA is the daemon's CA, or nil when TLS uses configured certificates or is off.
func (d *Daemon) CA() *CA { return d.ca }

// Handler is the HTTP handler of the API (for tests that serve it themselves).
func (d *Daemon) Handler() http.Handler { return d.api }

// Listen binds the API address; Addr is valid afterwards.
func (d *Daemon) Listen() error {
	ln, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", d.cfg.Listen, err)
	}
	if d.cfg.TLSEnabled() {
		var cert tls.Certificate
		if d.cfg.TLS.CertFile != "" {
			cert, err = tls.LoadX509KeyPair(d.cfg.TLS.CertFile, d.cfg.TLS.KeyFile)
		} else {
			host, _, _ := net.SplitHostPort(ln.Addr().String())
			cert, err = d.ca.ServerCert(d.cfg.certHosts(host))
		}
		if err != nil {
			ln.Close()
			return fmt.Errorf("tls: %w", err)
		}
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	}
	d.listener = ln
	return nil
}

// URL is the base URL clients and agents use.
func (d *Daemon) URL() string {
	if d.cfg.AdvertiseURL != "" {
		return d.cfg.AdvertiseURL
	}
	scheme := "http"
	if d.cfg.TLSEnabled() {
		scheme = "https"
	}
	addr := d.cfg.Listen
	if d.listener != nil {
		addr = d.listener.Addr().String()
	}
	return scheme + "://" + addr
}

// Run serves until ctx is cancelled, then shuts down gracefully.
func (d *Daemon) Run(ctx context.Context) error {
	if d.listener == nil {
		if err := d.Listen(); err != nil {
			return err
		}
	}
	d.httpSrv = &http.Server{Handler: d.clusterHandler(d.api), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}
	// Event streams end at once on shutdown instead of holding it up until
	// its deadline.
	d.httpSrv.RegisterOnShutdown(d.stream.Close)
	errc := make(chan error, 1)
	go func() { errc <- d.httpSrv.Serve(d.listener) }()
	var leading sync.WaitGroup
	var single *term // a single server leads for its whole life
	if d.cl == nil {
		single = d.establishLeadership(ctx)
	} else {
		self := cluster.Server{Name: d.cl.cfg.Name, URL: d.URL()}
		leading.Add(1)
		go func() {
			defer leading.Done()
			d.lead(ctx, self)
		}()
		go d.watchLeaderDeath(ctx, self)
	}
	go d.followEvents(ctx)
	d.log.Info("fleetd daemon serving", "url", d.URL(), "daemon_id", d.daemonID, "data_dir", d.cfg.DataDir)
	select {
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	case <-ctx.Done():
	}
	d.log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if d.cfg.Dev && d.cl.isLeader() {
		// A throwaway daemon takes its nodes with it; a real one never does
		// (training must not depend on the daemon being up).
		d.terminateAll(sctx)
	}
	// In a cluster the leader flushes before it resigns (lead), and both
	// happen before the API closes: the other servers depose a leader
	// whose port refuses connections (watchLeaderDeath), which would fence
	// the flush's writes.
	leading.Wait()
	// Long-polls are cut short by Shutdown's deadline; that is fine: clients retry.
	if err := d.httpSrv.Shutdown(sctx); err != nil {
		d.httpSrv.Close()
	}
	if single != nil {
		// After the API closed: no notice or registration changes a
		// runtime while it is flushed.
		d.revokeLeadership(single, true)
	}
	return nil
}

// Close releases the rendezvous service and the state store; call after Run returns.
func (d *Daemon) Close() error {
	if d.rdzv.rz() != nil {
		d.rdzv.rz().Close()
	}
	err := d.store.Close()
	d.cl.close()
	return err
}

// terminateAll deletes every instance of every fleet (dev mode shutdown).
func (d *Daemon) terminateAll(ctx context.Context) {
	fleets, _ := state.Read(ctx, d.store, state.Tx.Fleets)
	d.eachProvider(ctx, fleets, func(f state.Fleet, name string, p providers.Provider, cfg providers.Config) {
		who := reconcile.FleetIdentity(f, d.daemonID)
		insts, err := p.List(ctx, cfg, map[string]string{providers.TagFleet: f.Name, providers.TagDaemonID: d.daemonID})
		if err != nil {
			d.log.Warn("dev shutdown: list", "fleet", f.Name, "err", err)
			return
		}
		for _, in := range insts {
			if in.State == providers.StateTerminated || who.Of(in) != reconcile.Ours {
				continue
			}
			if err := p.Delete(ctx, cfg, in.ID); err != nil {
				d.log.Warn("dev shutdown: delete", "instance", in.ID, "err", err)
			}
		}
	})
}

// eachProvider calls fn with every provider block of every fleet whose
// spec decodes and whose provider is available; the others are skipped.
func (d *Daemon) eachProvider(ctx context.Context, fleets []state.Fleet, fn func(f state.Fleet, name string, p providers.Provider, cfg providers.Config)) {
	for _, f := range fleets {
		fl, err := d.fleetSpec(f)
		if err != nil {
			continue
		}
		for _, pb := range fl.Providers {
			if p, cfg, err := d.providerFor(ctx, f, pb.Name); err == nil {
				fn(f, pb.Name, p, cfg)
			}
		}
	}
}
