// Package intake is the daemon's cloud-side interruption intake: AWS
// EventBridge events through SQS and GCE zone operations. It runs only on
// the server that leads (a single server always leads): followers must not
// consume queue messages they cannot act on. Every notice it finds goes to
// the daemon through Deps.Notice, which records it like an agent's notice.
package intake

import (
	"context"
	"encoding/json"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/interruption/eventbridge"
	"github.com/fleetd/fleetd/interruption/gceops"
	"github.com/fleetd/fleetd/providers"
	awsprov "github.com/fleetd/fleetd/providers/aws"
	gcpprov "github.com/fleetd/fleetd/providers/gcp"
)

// Fleet is what intake needs of an applied, live fleet: its name and its
// provider blocks (name → decoded config JSON).
type Fleet struct {
	Name      string
	Providers map[string][]byte
}

// Deps is what intake needs of the daemon.
type Deps interface {
	// LiveFleets lists applied fleets that are neither destroying nor
	// completed.
	LiveFleets(ctx context.Context) ([]Fleet, error)
	// NodeByInstance finds the fleet and node of an instance id; ok is
	// false for instances that are not fleetd's (a queue gets every
	// notice of the account).
	NodeByInstance(ctx context.Context, instanceID string) (fleet, node string, ok bool, err error)
	// GCEInUse lists the zones (zones=true) or the instance ids of GCP
	// nodes fleetd expects to be running.
	GCEInUse(ctx context.Context, zones bool) []string
	// Notice records a notice for a node of a fleet.
	Notice(ctx context.Context, fleet string, n interruption.Notice) error
}

// Intake keeps one poller per SQS queue and per GCE project that the
// applied specs name.
type Intake struct {
	Deps Deps
	Log  *slog.Logger
	// PollInterval is the GCE operations poll interval (0: the poller's
	// default).
	PollInterval time.Duration

	kick chan struct{}
	mu   sync.Mutex
	sqs  map[sqsKey]context.CancelFunc
	gce  map[gceKey]context.CancelFunc
}

type sqsKey struct{ region, queue string }

type gceKey struct{ project, endpoint string }

// New returns an intake for deps.
func New(deps Deps, log *slog.Logger, pollInterval time.Duration) *Intake {
	return &Intake{Deps: deps, Log: log, PollInterval: pollInterval, kick: make(chan struct{}, 1)}
}

// Kick makes a running intake look at the specs now (after an apply).
func (in *Intake) Kick() {
	select {
	case in.kick <- struct{}{}:
	default:
	}
}

// Run keeps the set of running pollers equal to what the applied specs
// ask for, every 15 s and on Kick, until ctx ends; then it stops them.
func (in *Intake) Run(ctx context.Context) {
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	for {
		in.sync(ctx)
		select {
		case <-ctx.Done():
			in.mu.Lock()
			for _, cancel := range in.sqs {
				cancel()
			}
			for _, cancel := range in.gce {
				cancel()
			}
			in.sqs, in.gce = nil, nil
			in.mu.Unlock()
			return
		case <-t.C:
		case <-in.kick:
		}
	}
}

func (in *Intake) sync(ctx context.Context) {
	fleets, err := in.Deps.LiveFleets(ctx)
	if err != nil {
		in.Log.Warn("interruption intake: list fleets", "err", err)
		return
	}
	in.syncGCE(ctx, fleets)
	want := map[sqsKey]providers.Config{}
	for _, f := range fleets {
		raw, ok := f.Providers[awsprov.Name]
		if !ok {
			continue
		}
		cfg := providers.Config{Fleet: f.Name, Raw: json.RawMessage(raw)}
		qs, err := awsprov.InterruptionQueues(cfg)
		if err != nil {
			in.Log.Warn("interruption queue config", "fleet", f.Name, "err", err)
			continue
		}
		for _, q := range qs {
			want[sqsKey{q.Region, q.Queue}] = cfg
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.sqs = keepOnly(in.sqs, want)
	keys := make([]sqsKey, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].region+keys[i].queue < keys[j].region+keys[j].queue })
	for _, k := range keys {
		if _, ok := in.sqs[k]; ok {
			continue
		}
		client, err := awsprov.NewSQSClient(ctx, want[k], k.region)
		if err != nil {
			in.Log.Warn("sqs client", "region", k.region, "queue", k.queue, "err", err)
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		in.sqs[k] = cancel
		p := &eventbridge.Poller{Client: client, Queue: k.queue, Handler: in.handleEventBridge, Logger: in.Log.With("queue", k.queue, "region", k.region)}
		go func() {
			in.Log.Info("interruption intake: polling SQS", "queue", k.queue, "region", k.region)
			if err := p.Run(pctx); err != nil {
				in.Log.Error("interruption intake stopped", "queue", k.queue, "err", err)
				in.mu.Lock()
				delete(in.sqs, k)
				in.mu.Unlock()
			}
		}()
	}
}

// keepOnly stops the pollers in running whose key want no longer names
// and returns running, made on first use; the caller starts the missing.
func keepOnly[K comparable, V any](running map[K]context.CancelFunc, want map[K]V) map[K]context.CancelFunc {
	if running == nil {
		running = map[K]context.CancelFunc{}
	}
	for k, cancel := range running {
		if _, ok := want[k]; !ok {
			cancel()
			delete(running, k)
		}
	}
	return running
}

// handleEventBridge maps an event's instances to nodes and raises notices.
// Unknown instances (the queue gets every ITN of the account) are not ours.
func (in *Intake) handleEventBridge(ctx context.Context, ev eventbridge.Event) (bool, error) {
	handled := false
	for _, n := range ev.Notices() {
		fleetName, node, ok, err := in.Deps.NodeByInstance(ctx, n.Instance)
		if err != nil {
			return false, err // keep the message: SQS redelivers it
		}
		if !ok {
			continue
		}
		n.Node = node
		if err := in.Deps.Notice(ctx, fleetName, n); err != nil {
			return false, err
		}
		handled = true
	}
	return handled, nil
}

// gceBlock is the part of a `provider "gcp"` block intake reads.
type gceBlock struct {
	Project  string `json:"project"`
	Endpoint string `json:"endpoint"`
}

// syncGCE runs one zone-operations poller per (project, endpoint) any
// fleet's gcp block names, polling the zones where fleetd has instances.
// Preemptions become notices for the node whose instance id
// ("ZONE/NAME") matches.
func (in *Intake) syncGCE(ctx context.Context, fleets []Fleet) {
	want := map[gceKey]bool{}
	for _, f := range fleets {
		raw, ok := f.Providers[gcpprov.Name]
		if !ok {
			continue
		}
		var b gceBlock
		if json.Unmarshal(raw, &b) != nil || b.Project == "" {
			continue
		}
		want[gceKey{b.Project, b.Endpoint}] = true
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.gce = keepOnly(in.gce, want)
	for k := range want {
		if _, ok := in.gce[k]; ok {
			continue
		}
		clients, err := gceops.NewClients(ctx, k.endpoint)
		if err != nil {
			in.Log.Warn("gce operations client", "project", k.project, "err", err)
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		in.gce[k] = cancel
		p := &gceops.Poller{Project: k.project, Lister: clients, Status: clients, Interval: in.PollInterval,
			Zones:   func() []string { return in.Deps.GCEInUse(pctx, true) },
			Watched: func() []string { return in.Deps.GCEInUse(pctx, false) },
			OnError: func(err error) { in.Log.Debug("gce operations poll", "project", k.project, "err", err) }}
		go func() {
			defer clients.Close()
			in.Log.Info("interruption intake: polling GCE zone operations", "project", k.project)
			_ = p.Run(pctx, func(n interruption.Notice) {
				fleetName, node, ok, err := in.Deps.NodeByInstance(pctx, n.Instance)
				if err != nil || !ok {
					return
				}
				n.Node = node
				if err := in.Deps.Notice(pctx, fleetName, n); err != nil {
					in.Log.Warn("gce notice", "instance", n.Instance, "err", err)
				}
			})
		}()
	}
}
