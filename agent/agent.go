package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/interruption/imds"
)

// Files the agent keeps in its work dir.
const (
	PIDFileName   = "agent.pid"  // written once the agent is up; removed on clean exit
	DrainFileName = "drain.json" // written on a terminal interruption notice
	LogFileName   = "agent.log"  // in the log dir: JSON lines
)

// NoticeReporter delivers notices to the control daemon. The daemon client
// (a later piece) implements it and owns its retries; it is called from the
// metadata watch loop, so an implementation that may block for long must
// queue. With no reporter the agent still drains locally, which is what
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
	// NodeAddr is the node's private address (env FLEETD_NODE_ADDR); logged
	// now, advertised to rendezvous later.
	NodeAddr string
	// Stderr receives the log lines too; default os.Stderr.
	Stderr io.Writer
	// Reporter, if set, receives every notice.
	Reporter NoticeReporter
	// PollInterval of the metadata watcher; default imds.DefaultInterval.
	PollInterval time.Duration
}

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

// Paths are the host paths of the agent's files for a config and root.
type Paths struct {
	WorkDir, LogDir, PIDFile, DrainFile, LogFile string
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
	}
}

type agent struct {
	opts  Options
	paths Paths
	log   *slog.Logger

	mu    sync.Mutex
	drain *Drain
}

// Run runs the agent until ctx is cancelled (SIGTERM), then cleans up and
// returns nil. Setup problems (bad paths, an unsupported metadata kind)
// are returned at once.
func Run(ctx context.Context, opts Options) error {
	cfg := opts.Config.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("agent config: %w", err)
	}
	opts.Config = cfg
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	a := &agent{opts: opts, paths: PathsFor(cfg, opts.Root)}
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
	if d, err := ReadDrain(a.paths.DrainFile); err == nil {
		a.drain = &d // restarted after a notice: keep the earliest deadline known
	}
	if err := writeFileAtomic(a.paths.PIDFile, []byte(strconv.Itoa(os.Getpid())+"\n")); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer os.Remove(a.paths.PIDFile)
	a.log.Info("agent started", "pid", os.Getpid(), "metadata", cfg.Metadata.Kind, "metadata_url", metaURL,
		"address", opts.NodeAddr, "daemon_url", cfg.DaemonURL, "reporter", opts.Reporter != nil)

	var wg sync.WaitGroup
	if watch != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = watch(ctx, func(n interruption.Notice) { a.handle(ctx, n) })
		}()
	}
	<-ctx.Done()
	wg.Wait()
	a.log.Info("agent stopped", "reason", context.Cause(ctx).Error())
	return nil
}

type watchFunc func(ctx context.Context, emit func(interruption.Notice)) error

func (a *agent) watcher() (watchFunc, string, error) {
	cfg := a.opts.Config
	u := cfg.Metadata.URL
	if a.opts.MetadataURL != "" {
		u = a.opts.MetadataURL
	}
	switch cfg.Metadata.Kind {
	case MetadataNone:
		return nil, "", nil
	case MetadataAWSIMDS:
		if u == "" {
			u = imds.DefaultBaseURL
		}
		c, err := imds.NewClient(u)
		if err != nil {
			return nil, "", err
		}
		w := &imds.Watcher{Client: c, Interval: a.opts.PollInterval, Node: cfg.NodeID, OnError: a.pollError()}
		return w.Run, u, nil
	}
	return nil, "", fmt.Errorf("metadata kind %q is not supported by this agent yet", cfg.Metadata.Kind)
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
	if a.opts.Reporter != nil {
		if err := a.opts.Reporter.ReportNotice(ctx, n); err != nil && ctx.Err() == nil {
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
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(a.paths.DrainFile, append(b, '\n')); err != nil {
		return err
	}
	a.drain = &d
	a.log.Info("drain started", "kind", string(d.Kind), "deadline", d.Deadline, "file", a.paths.DrainFile)
	return nil
}

// writeFileAtomic replaces file so readers never see a partial write.
func writeFileAtomic(file string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), file)
}
