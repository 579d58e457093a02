package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/interruption/gcemeta"
	"github.com/fleetd/fleetd/interruption/imds"
)

// Files the agent keeps in its work dir.
const (
	PIDFileName   = "agent.pid"  // written once the agent is up; removed on clean exit
	DrainFileName = "drain.json" // written on a terminal interruption notice
	LogFileName   = "agent.log"  // in the log dir: JSON lines
	// CheckpointRequestFileName exists while the agent asks the workers to
	// checkpoint before they stop (FLEETD_CHECKPOINT_REQUEST).
	CheckpointRequestFileName = "checkpoint-request.json"
)

// NoticeReporter delivers notices to the control daemon. It is called
// from the metadata watch loop, so an implementation that may block for
// long must queue. With a daemon configured and no Options.Reporter, the
// agent's own queue (retried until the daemon accepts each notice) is
// used. Without any reporter the agent still drains locally, which is what
// keeps training safe when the daemon is unreachable.
type NoticeReporter interface {
	ReportNotice(ctx context.Context, n interruption.Notice) error
}

// Options configure one agent run.
type Options struct {
	Config Config
	// Root prefixes every VM path of the config (work_dir, log_dir); empty
	// on a real VM, the node's directory under the local provider.
	Root string
	// MetadataURL overrides Config.Metadata.URL (env FLEETD_METADATA_URL).
	MetadataURL string
	// NodeAddr is the node's private address (env FLEETD_NODE_ADDR); when
	// empty it comes from the instance metadata or the first non-loopback
	// IPv4. It is advertised to the rendezvous (MASTER_ADDR on rank 0).
	NodeAddr string
	// Stderr receives the log lines too; default os.Stderr.
	Stderr io.Writer
	// Reporter, if set, receives every notice instead of the daemon queue.
	Reporter NoticeReporter
	// PollInterval of the metadata watcher; default imds.DefaultInterval.
	PollInterval time.Duration
	// Version is sent to the daemon at registration.
	Version string
	// HTTPClient talks to the daemon; default NewHTTPClient(daemon_url,
	// ca_fingerprint).
	HTTPClient *http.Client

	// PeerLostWindow: after a worker exits 3 (lost peer), how long a new
	// round may take before the exit counts as a failure; default
	// DefaultPeerLostWindow. Keep it above the fleet's dead_after.
	PeerLostWindow time.Duration
	// RestartGrace caps the SIGTERM→SIGKILL grace of membership restarts
	// (drain_grace applies to drains and shutdown); default DefaultRestartGrace.
	RestartGrace time.Duration
	// DoneMarkerWait: after every local worker exited 0 without a DONE
	// marker in a local checkpoint dir, how long to wait for another node
	// to finish the job before reporting it done; default DefaultDoneMarkerWait.
	DoneMarkerWait time.Duration
	// LeaveTimeout bounds the rendezvous Leave at shutdown; default DefaultLeaveTimeout.
	LeaveTimeout time.Duration
	// MaxBackoff caps the retry delay of every daemon call; default DefaultMaxBackoff.
	MaxBackoff time.Duration
	// PeerPort is the port a node serves its staged data to peers on
	// (agent/peerstage.go) when the fleet's training.peer_port is not
	// set; 0 picks a free one, reported to the daemon.
	PeerPort int
	// WarmJoinWait bounds how long a starting agent waits for its warm
	// interpreters before it joins the rendezvous; default DefaultWarmJoinWait.
	WarmJoinWait time.Duration
	// MasterListenWait bounds how long a node's warm workers wait for the
	// master's store to listen after a new round; default
	// DefaultMasterListenWait.
	MasterListenWait time.Duration
	// NoticeMargin: workers asked to checkpoint on a notice must be gone
	// this long before the notice's deadline; default DefaultNoticeMargin.
	NoticeMargin time.Duration
	// TransferClient moves checkpoint bytes to and from signed store URLs
	// (not the daemon's pinned client: the URLs name the cloud's store);
	// default a plain client.
	TransferClient *http.Client
	// CheckpointPoll is how often the checkpoint dir is scanned for a new
	// complete checkpoint; default 1s.
	CheckpointPoll time.Duration
	// CheckpointFlush bounds the upload of the last checkpoint when the
	// job finishes; default DefaultCheckpointFlush.
	CheckpointFlush time.Duration
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.PeerLostWindow, DefaultPeerLostWindow)
	def(&o.MasterListenWait, DefaultMasterListenWait)
	def(&o.RestartGrace, DefaultRestartGrace)
	def(&o.DoneMarkerWait, DefaultDoneMarkerWait)
	def(&o.LeaveTimeout, DefaultLeaveTimeout)
	def(&o.MaxBackoff, DefaultMaxBackoff)
	def(&o.WarmJoinWait, DefaultWarmJoinWait)
	def(&o.NoticeMargin, DefaultNoticeMargin)
	def(&o.CheckpointFlush, DefaultCheckpointFlush)
	o.MaxBackoff = max(o.MaxBackoff, minBackoff)
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	return o
}

// DrainExcluded is the drain file's kind when the rendezvous excluded the
// node without a notice of its own (the daemon learned of the
// interruption elsewhere, e.g. from the cloud's event stream).
const DrainExcluded interruption.Kind = "excluded"

// Drain is the content of the drain file: the earliest-deadline terminal
// notice the node has received. Workers (through FLEETD_DRAIN_FILE) and
// the supervisor read it to checkpoint and stop in time.
type Drain struct {
	Kind      interruption.Kind `json:"kind"`
	Deadline  time.Time         `json:"deadline,omitzero"`
	Source    string            `json:"source"`
	ID        string            `json:"id,omitempty"`
	Detail    string            `json:"detail,omitempty"`
	NoticedAt time.Time         `json:"noticed_at"`
}

// ReadDrain reads a drain file.
func ReadDrain(file string) (Drain, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return Drain{}, err
	}
	var d Drain
	if err := json.Unmarshal(b, &d); err != nil {
		return Drain{}, fmt.Errorf("drain file %s: %w", file, err)
	}
	return d, nil
}

// CheckpointRequest is the content of the checkpoint request file
// (FLEETD_CHECKPOINT_REQUEST): on a round change caused by an interruption
// notice the agent writes it, then SIGTERMs the workers of the round being
// replaced, on the node that got the notice and on every survivor. A worker
// that honours it finishes its step, checkpoints, writes the step to
// FLEETD_CHECKPOINT_DONE and exits 0 before Deadline; at Deadline the agent
// SIGKILLs what is left. See docs/agent.md, "Checkpoint on notice".
type CheckpointRequest struct {
	// Round is the round whose workers are asked (their FLEETD_ROUND).
	Round int `json:"round"`
	// Reason is why: "notice" (rendezvous.CauseNotice).
	Reason string `json:"reason"`
	// Detail says which node and notice, for logs.
	Detail string `json:"detail,omitempty"`
	// Leaving: this node is the one with the notice; it will not rejoin.
	Leaving bool `json:"leaving"`
	// Deadline: the workers must have exited by then (SIGKILL follows).
	Deadline time.Time `json:"deadline"`
	// NoticeDeadline is when the node with the notice goes away, when
	// known: this node's own notice (drain file), else the rendezvous
	// view's (the daemon's notice).
	NoticeDeadline time.Time `json:"notice_deadline,omitzero"`
	RequestedAt    time.Time `json:"requested_at"`
}

// Paths are the host paths of the agent's files for a config and root.
type Paths struct {
	WorkDir, LogDir, PIDFile, DrainFile, LogFile string
	// CheckpointRequest is FLEETD_CHECKPOINT_REQUEST.
	CheckpointRequest string
	// ElasticFile is FLEETD_ELASTIC_FILE (in-process mode); HelperDir holds
	// fleetd_elastic.py.
	ElasticFile, HelperDir string
}

// PathsFor re-roots the config's VM paths under root.
func PathsFor(cfg Config, root string) Paths {
	cfg = cfg.WithDefaults()
	work := filepath.Join(root, filepath.FromSlash(cfg.WorkDir))
	logs := filepath.Join(root, filepath.FromSlash(cfg.LogDir))
	return Paths{
		WorkDir:   work,
		LogDir:    logs,
		PIDFile:   filepath.Join(work, PIDFileName),
		DrainFile: filepath.Join(work, DrainFileName),
		LogFile:   filepath.Join(logs, LogFileName),

		CheckpointRequest: filepath.Join(work, CheckpointRequestFileName),
		ElasticFile:       filepath.Join(work, ElasticFileName),
		HelperDir:         filepath.Join(work, HelperDirName),
	}
}

type agent struct {
	opts     Options
	paths    Paths
	log      *slog.Logger
	reporter NoticeReporter
	// runCtx ends when the agent stops (signal or finished job).
	runCtx context.Context
	// reconnected is signalled when the daemon answers after an outage.
	reconnected chan struct{}

	mu    sync.Mutex
	drain *Drain
}

// Run runs the agent until ctx is cancelled (SIGTERM: workers are stopped
// within drain_grace and the node leaves the rendezvous) or, with a
// daemon, until the job is finished; both return nil. Setup problems (bad
// paths, an unsupported metadata kind, a refused registration) are
// returned as errors.
//
// Without daemon_url the agent is standalone: it watches the metadata and
// writes the drain file, nothing else.
func Run(ctx context.Context, opts Options) error {
	cfg := opts.Config.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("agent config: %w", err)
	}
	opts.Config = cfg
	opts = opts.withDefaults()
	a := &agent{opts: opts, paths: PathsFor(cfg, opts.Root), reporter: opts.Reporter, reconnected: make(chan struct{}, 1)}
	for _, d := range []string{a.paths.WorkDir, a.paths.LogDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
	}
	logFile, err := os.OpenFile(a.paths.LogFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer logFile.Close()
	a.log = slog.New(slog.NewJSONHandler(io.MultiWriter(logFile, opts.Stderr), nil)).
		With("fleet", cfg.Fleet, "node", cfg.NodeID)

	watch, metaURL, err := a.watcher()
	if err != nil {
		a.log.Error("agent cannot start", "err", err)
		return err
	}
	var dc *daemonClient
	var hc *http.Client
	if cfg.DaemonURL != "" {
		hc = opts.HTTPClient
		if hc == nil {
			if hc, err = NewHTTPClient(cfg.DaemonURL, cfg.CAFingerprint, cfg.DaemonURLs...); err != nil {
				a.log.Error("agent cannot start", "err", err)
				return fmt.Errorf("agent: %w", err)
			}
		}
		// Every daemon call goes through one reachability probe: when the
		// daemon answers again after an outage, the controller re-registers
		// and re-joins.
		hc = withReachability(hc, func() {
			select {
			case a.reconnected <- struct{}{}:
			default:
			}
		})
		dc = &daemonClient{base: strings.TrimRight(cfg.DaemonURL, "/"), fleet: cfg.Fleet, node: cfg.NodeID, token: cfg.Token, hc: hc}
	}
	if d, err := ReadDrain(a.paths.DrainFile); err == nil {
		a.drain = &d // restarted after a notice: keep the earliest deadline known
	}
	// A request left by an agent that died while its workers stopped is
	// not addressed to the workers this agent starts.
	_ = os.Remove(a.paths.CheckpointRequest)
	_ = os.Remove(a.paths.ElasticFile) // nor is an old round's assignment
	if err := writeFileAtomic(a.paths.PIDFile, []byte(strconv.Itoa(os.Getpid())+"\n")); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer os.Remove(a.paths.PIDFile)

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	a.runCtx = runCtx
	var wg sync.WaitGroup
	if dc != nil && a.reporter == nil {
		q := newNoticeQueue(dc, backoff{min: minBackoff, max: opts.MaxBackoff})
		prog := every{d: progressEvery}
		q.onError = func(n interruption.Notice, attempt int, err error) {
			if attempt < 0 {
				a.log.Error("daemon refused notice", "key", n.Key(), "err", err)
			} else if prog.ok() {
				a.log.Warn("reporting notice to daemon failed; retrying", "key", n.Key(), "attempt", attempt, "err", err)
			}
		}
		q.onSent = func(n interruption.Notice) { a.log.Info("notice reported to daemon", "key", n.Key()) }
		a.reporter = q
		wg.Go(func() { q.run(runCtx) })
	}
	a.log.Info("agent started", "pid", os.Getpid(), "metadata", cfg.Metadata.Kind, "metadata_url", metaURL,
		"address", opts.NodeAddr, "daemon_url", cfg.DaemonURL, "reporter", a.reporter != nil, "version", opts.Version)

	if watch != nil {
		wg.Go(func() { _ = watch(runCtx, func(n interruption.Notice) { a.handle(runCtx, n) }) })
	}
	var runErr error
	if dc == nil {
		<-runCtx.Done()
	} else {
		runErr = a.runElastic(runCtx, dc, hc, &wg)
	}
	stop()
	wg.Wait()
	reason := "job finished"
	if ctx.Err() != nil {
		reason = context.Cause(ctx).Error()
	}
	if runErr != nil {
		reason = runErr.Error()
	}
	a.log.Info("agent stopped", "reason", reason)
	return runErr
}

// runElastic runs the elastic agent against the daemon: identity,
// registration, rendezvous and the worker supervisor.
func (a *agent) runElastic(ctx context.Context, dc *daemonClient, hc *http.Client, wg *sync.WaitGroup) error {
	id := a.discoverIdentity(ctx)
	if id.Addr == "" {
		return errors.New("agent: no node address (set FLEETD_NODE_ADDR or make the instance metadata reachable)")
	}
	shipper := newLogShipper(dc.logs)
	prog := every{d: progressEvery}
	shipper.onError = func(err error, dropped int) {
		if prog.ok() {
			a.log.Warn("shipping worker logs failed", "err", err, "dropped_lines", dropped)
		}
	}
	wg.Go(func() { shipper.run(ctx) })
	sup := &supervisor{
		log: a.log, logDir: a.paths.LogDir, drainFile: a.paths.DrainFile, requestFile: a.paths.CheckpointRequest,
		fleet: a.opts.Config.Fleet, node: a.opts.Config.NodeID, ifname: id.Ifname, root: a.opts.Root,
		ship:  shipper.add,
		exits: make(chan workerExit, 16), quit: make(chan struct{}),
	}
	var err error
	if err := writeElasticHelper(a.paths.HelperDir); err != nil {
		a.log.Warn("in-process elastic mode unavailable: writing fleetd_elastic.py failed", "err", err)
	} else {
		sup.elasticFile, sup.helperDir = a.paths.ElasticFile, a.paths.HelperDir
	}
	if sup.warm, err = newWarmPool(a.paths.WorkDir); err != nil {
		a.log.Warn("warm starts unavailable", "err", err)
	}
	e := newElastic(a, dc, hc, sup)
	e.id = id
	sup.onStep = func(s int64) {
		e.step.Store(s)
		e.hasStep.Store(true)
	}
	return e.run(ctx)
}

type watchFunc func(ctx context.Context, emit func(interruption.Notice)) error

func (a *agent) watcher() (watchFunc, string, error) {
	cfg := a.opts.Config
	u := a.metadataURL()
	switch cfg.Metadata.Kind {
	case MetadataNone:
		return nil, "", nil
	case MetadataAWSIMDS:
		c, u, err := imdsClient(u)
		if err != nil {
			return nil, "", err
		}
		w := &imds.Watcher{Client: c, Interval: a.opts.PollInterval, Node: cfg.NodeID, OnError: a.pollError()}
		return w.Run, u, nil
	case MetadataGCE:
		c := gcemeta.NewClient(gceBaseURL(u))
		w := &gcemeta.Watcher{Client: c, Node: cfg.NodeID, OnError: a.pollError()}
		return w.Run, c.BaseURL, nil
	}
	return nil, "", fmt.Errorf("metadata kind %q is not supported by this agent", cfg.Metadata.Kind)
}

// metadataURL is the metadata service's URL: the option's (tests) over the
// config's; "" means the kind's default.
func (a *agent) metadataURL() string {
	if a.opts.MetadataURL != "" {
		return a.opts.MetadataURL
	}
	return a.opts.Config.Metadata.URL
}

// imdsClient is the EC2 metadata client at u (imds.DefaultBaseURL when
// empty), with the URL it uses.
func imdsClient(u string) (*imds.Client, string, error) {
	if u == "" {
		u = imds.DefaultBaseURL
	}
	c, err := imds.NewClient(u)
	return c, u, err
}

// gceBaseURL turns a configured GCE metadata URL into the v1 root the
// client wants; a bare host ("http://169.254.169.254") gets the path
// appended. Empty stays empty: gcemeta's default (or $GCE_METADATA_HOST).
func gceBaseURL(u string) string {
	if u == "" || strings.Contains(u, "/computeMetadata/v1") {
		return u
	}
	return strings.TrimRight(u, "/") + "/computeMetadata/v1/"
}

// pollError logs watcher errors, repeating an unchanged error at most once
// a minute so an unreachable IMDS does not flood the log at 1 line/s.
func (a *agent) pollError() func(error) {
	var last string
	var at time.Time
	return func(err error) {
		msg := err.Error()
		if msg == last && time.Since(at) < time.Minute {
			return
		}
		last, at = msg, time.Now()
		a.log.Warn("metadata poll failed", "err", msg)
	}
}

func (a *agent) handle(ctx context.Context, n interruption.Notice) {
	a.log.Info("notice", "kind", string(n.Kind), "deadline", n.Deadline, "source", n.Source,
		"id", n.ID, "detail", n.Detail, "instance", n.Instance, "key", n.Key())
	if n.Kind.Terminal() {
		if err := a.startDrain(n); err != nil {
			a.log.Error("writing drain file failed", "err", err)
		}
	}
	if a.reporter != nil {
		if err := a.reporter.ReportNotice(ctx, n); err != nil && ctx.Err() == nil {
			a.log.Warn("reporting notice to daemon failed", "err", err, "key", n.Key())
		}
	}
}

// startDrain records the notice in the drain file unless an earlier
// deadline is already there (a maintenance event after a spot notice must
// not postpone the drain).
func (a *agent) startDrain(n interruption.Notice) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.drain != nil && !a.drain.Deadline.IsZero() && (n.Deadline.IsZero() || !n.Deadline.Before(a.drain.Deadline)) {
		return nil
	}
	d := Drain{Kind: n.Kind, Deadline: n.Deadline, Source: n.Source, ID: n.ID, Detail: n.Detail, NoticedAt: time.Now().UTC()}
	if err := writeJSONAtomic(a.paths.DrainFile, d); err != nil {
		return err
	}
	a.drain = &d
	a.log.Info("drain started", "kind", string(d.Kind), "deadline", d.Deadline, "file", a.paths.DrainFile)
	return nil
}

// noticeDeadline is the deadline of the node's own terminal notice, if it
// has one.
func (a *agent) noticeDeadline() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.drain == nil {
		return time.Time{}
	}
	return a.drain.Deadline
}

// drainForExclusion writes the drain file when the rendezvous excluded the
// node and no local notice did already: the workers checkpoint on it as
// on any notice.
func (a *agent) drainForExclusion(reason string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.drain != nil {
		return nil
	}
	d := Drain{Kind: DrainExcluded, Source: "rendezvous", Detail: reason, NoticedAt: time.Now().UTC()}
	if err := writeJSONAtomic(a.paths.DrainFile, d); err != nil {
		return err
	}
	a.drain = &d
	a.log.Info("drain started", "kind", string(d.Kind), "reason", reason, "file", a.paths.DrainFile)
	return nil
}

// writeJSONAtomic writes v as indented JSON with writeFileAtomic.
func writeJSONAtomic(file string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(file, append(b, '\n'))
}
