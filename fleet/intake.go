package fleet

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/interruption/eventbridge"
	"github.com/fleetd/fleetd/providers"
	awsprov "github.com/fleetd/fleetd/providers/aws"
)

// Daemon-side interruption intake: AWS EventBridge events through SQS. One
// poller runs per (region, queue) that any fleet's `provider "aws"` block
// names; events are matched to nodes by instance id across all fleets, so
// one queue can serve several fleets.

type intakeKey struct{ region, queue string }

type intake struct {
	mu      sync.Mutex
	running map[intakeKey]context.CancelFunc
	gce     map[gceKey]context.CancelFunc
}

// intakeLoop keeps the set of running SQS pollers equal to what the
// applied specs ask for.
func (d *Daemon) intakeLoop(ctx context.Context) {
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	for {
		d.syncIntake(ctx)
		select {
		case <-ctx.Done():
			d.intake.mu.Lock()
			for _, cancel := range d.intake.running {
				cancel()
			}
			for _, cancel := range d.intake.gce {
				cancel()
			}
			d.intake.mu.Unlock()
			return
		case <-t.C:
		case <-d.intakeKick:
		}
	}
}

func (d *Daemon) syncIntake(ctx context.Context) {
	want := map[intakeKey]providers.Config{}
	var fleets []state.Fleet
	_ = d.store.View(ctx, func(tx state.Tx) error {
		var err error
		fleets, err = tx.Fleets()
		return err
	})
	d.syncGCEIntake(ctx, fleets)
	for _, f := range fleets {
		fl, err := d.fleetSpec(f)
		if err != nil || f.Destroying || f.Completed {
			continue
		}
		pb, ok := fl.Provider(awsprov.Name)
		if !ok {
			continue
		}
		cfg := providers.Config{Fleet: f.Name, Raw: pb.Config}
		qs, err := awsprov.InterruptionQueues(cfg)
		if err != nil {
			d.log.Warn("interruption queue config", "fleet", f.Name, "err", err)
			continue
		}
		for _, q := range qs {
			want[intakeKey{q.Region, q.Queue}] = cfg
		}
	}
	d.intake.mu.Lock()
	defer d.intake.mu.Unlock()
	if d.intake.running == nil {
		d.intake.running = map[intakeKey]context.CancelFunc{}
	}
	for k, cancel := range d.intake.running {
		if _, ok := want[k]; !ok {
			cancel()
			delete(d.intake.running, k)
		}
	}
	keys := make([]intakeKey, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].region+keys[i].queue < keys[j].region+keys[j].queue })
	for _, k := range keys {
		if _, ok := d.intake.running[k]; ok {
			continue
		}
		client, err := awsprov.NewSQSClient(ctx, want[k], k.region)
		if err != nil {
			d.log.Warn("sqs client", "region", k.region, "queue", k.queue, "err", err)
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		d.intake.running[k] = cancel
		p := &eventbridge.Poller{Client: client, Queue: k.queue, Handler: d.handleEventBridge, Logger: d.log.With("queue", k.queue, "region", k.region)}
		go func() {
			d.log.Info("interruption intake: polling SQS", "queue", k.queue, "region", k.region)
			if err := p.Run(pctx); err != nil {
				d.log.Error("interruption intake stopped", "queue", k.queue, "err", err)
				d.intake.mu.Lock()
				delete(d.intake.running, k)
				d.intake.mu.Unlock()
			}
		}()
	}
}

// handleEventBridge maps an event's instances to nodes and raises notices.
// Unknown instances (the queue gets every ITN of the account) are not ours.
func (d *Daemon) handleEventBridge(ctx context.Context, ev eventbridge.Event) (bool, error) {
	handled := false
	for _, n := range ev.Notices() {
		fleetName, node, ok, err := d.nodeByInstance(ctx, n.Instance)
		if err != nil {
			return false, err // keep the message: SQS redelivers it
		}
		if !ok {
			continue
		}
		n.Node = node
		if err := d.HandleNotice(ctx, fleetName, n); err != nil {
			return false, err
		}
		handled = true
	}
	return handled, nil
}

// eachNode calls fn for every node of every fleet in one read
// transaction, until fn returns false.
func (d *Daemon) eachNode(ctx context.Context, fn func(f state.Fleet, n state.Node) bool) error {
	return d.store.View(ctx, func(tx state.Tx) error {
		fleets, err := tx.Fleets()
		if err != nil {
			return err
		}
		for _, f := range fleets {
			nodes, err := tx.Nodes(f.Name)
			if err != nil {
				return err
			}
			for _, n := range nodes {
				if !fn(f, n) {
					return nil
				}
			}
		}
		return nil
	})
}

// nodeByInstance finds the fleet and node of an instance id.
func (d *Daemon) nodeByInstance(ctx context.Context, instanceID string) (string, string, bool, error) {
	var fleetName, nodeID string
	err := d.eachNode(ctx, func(f state.Fleet, n state.Node) bool {
		if n.InstanceID == instanceID {
			fleetName, nodeID = f.Name, n.ID
			return false
		}
		return true
	})
	return fleetName, nodeID, nodeID != "", err
}
