package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/autoscale"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/spec/spectest"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/state/statetest"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

var passSpec = spectest.Fleet{Name: "train", Min: 2, Max: 3}.HCL()

// The controller's handles, as small as the interfaces: the in-memory
// provider, a spec parser, a counting recorder and a fixed user-data.

type memProviders struct{ mem *providertest.MemProvider }

func (p memProviders) Provider(_ context.Context, f state.Fleet, name string) (providers.Provider, providers.Config, error) {
	if name != providertest.MemName {
		return nil, providers.Config{}, fmt.Errorf("no provider %q", name)
	}
	return p.mem, providers.Config{Fleet: f.Name}, nil
}

type parsedSpecs struct{}

func (parsedSpecs) Spec(f state.Fleet) (*spec.Fleet, error) {
	file, diags := spec.Parse(f.Filename, f.Source, spec.Options{Schema: func(name string) (providers.ConfigSchema, bool) {
		return providertest.MemSchema, name == providertest.MemName
	}})
	if diags.HasErrors() {
		return nil, diags
	}
	return file.Fleets[0], nil
}

type countingRecorder struct {
	mu                        sync.Mutex
	calls                     map[string]int
	notices, launches, passes int
}

func (r *countingRecorder) ProviderCall(provider, op, _ string, _ providers.Config, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls == nil {
		r.calls = map[string]int{}
	}
	r.calls[provider+"/"+op]++
}
func (r *countingRecorder) OfferingsListed([]providers.Offering)                     {}
func (r *countingRecorder) Prices(string, string, *spec.Fleet, []providers.Offering) {}
func (r *countingRecorder) TrainingResumed(string, autoscale.RoundStart)             {}
func (r *countingRecorder) LaunchRequested(string, string, time.Time) {
	r.mu.Lock()
	r.launches++
	r.mu.Unlock()
}
func (r *countingRecorder) Notice(string, time.Time)       { r.mu.Lock(); r.notices++; r.mu.Unlock() }
func (r *countingRecorder) PassDone(string, time.Duration) { r.mu.Lock(); r.passes++; r.mu.Unlock() }
func (r *countingRecorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[key]
}

type fixedBoot struct{}

func (fixedBoot) UserData(fleet string, _ *spec.Fleet, n state.Node) (string, error) {
	return "#cloud-config\n# " + fleet + "/" + n.ID + "\n", nil
}

func nodesOf(t *testing.T, st state.Store, fleet string) []state.Node {
	t.Helper()
	return statetest.Nodes(t, st, fleet)
}

// passController is a controller over st and mem with the fleet "train"
// (passSpec) stored, and its pass: the clock moves 20 s, then ReconcileAll
// (drains and launches take passes and time, as they do in a daemon).
// opts adds to the handles it sets.
func passController(t *testing.T, st Store, mem *providertest.MemProvider, rec *countingRecorder, clock *time.Time, opts Options) (*Controller, func()) {
	t.Helper()
	opts.Store, opts.Providers, opts.Specs, opts.Recorder, opts.Boot = st, memProviders{mem}, parsedSpecs{}, rec, fixedBoot{}
	opts.DaemonID, opts.StartedAt, opts.Now = "d-test", *clock, func() time.Time { return *clock }
	c := New(opts)
	ctx := context.Background()
	if err := st.Update(ctx, func(tx state.Tx) error {
		_, err := tx.PutFleet(state.Fleet{Name: "train", Filename: "train.hcl", Source: []byte(passSpec)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c, func() {
		*clock = clock.Add(20 * time.Second)
		c.ReconcileAll(ctx)
	}
}

// TestControllerPassLifecycle drives the controller alone, over the
// in-memory provider and store: a fleet is launched to its size, a notice
// drains a node and launches its replacement, the runtime survives a new
// leader term (Reset), and a destroy forgets the fleet once its instances
// are gone.
func TestControllerPassLifecycle(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	mem := providertest.NewMemProvider()
	rec := &countingRecorder{}
	var destroyed []string
	clock := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	c, pass := passController(t, st, mem, rec, &clock, Options{Destroyed: func(f string) { destroyed = append(destroyed, f) }})

	pass()
	nodes := nodesOf(t, st, "train")
	if len(nodes) != 3 || mem.Live() != 3 {
		t.Fatalf("after the first pass: %d node records, %d live instances; want 3 and 3", len(nodes), mem.Live())
	}
	for _, n := range nodes {
		if n.InstanceID == "" || n.State != state.NodeBooting {
			t.Errorf("node %s: instance %q, state %s; want an instance, booting", n.ID, n.InstanceID, n.State)
		}
	}
	if rec.passes != 1 || rec.count("mem/create") != 3 || rec.count("mem/list") != 1 {
		t.Errorf("recorded %d passes, calls %v; want 1 pass, 3 creates, 1 list", rec.passes, rec.calls)
	}
	v, ok := c.View("train")
	if !ok || len(v.Plan.Actions) == 0 || v.Scale == nil {
		t.Errorf("view after a pass: %+v, %v; want the pass's plan and a scale view", v, ok)
	}

	// A terminal notice: the node leaves, a replacement is launched.
	victim := nodes[0].ID
	if err := c.HandleNotice(ctx, "train", interruption.Notice{Node: victim, Kind: interruption.SpotInterruption, Source: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := c.HandleNotice(ctx, "train", interruption.Notice{Node: victim, Kind: interruption.SpotInterruption, Source: "test again"}); err != nil {
		t.Fatal(err)
	}
	if rec.notices != 1 {
		t.Errorf("%d notices recorded; want 1 (the second one is the same node+kind)", rec.notices)
	}
	byID := map[string]state.Node{}
	for i := 0; i < 10 && len(byID) < 4; i++ {
		pass()
		for _, n := range nodesOf(t, st, "train") {
			byID[n.ID] = n
		}
	}
	if s := byID[victim].State; s == state.NodeBooting || s == state.NodeRunning {
		t.Errorf("noticed node %s is %s after a pass; want it leaving", victim, s)
	}
	if len(byID) != 4 || rec.count("mem/create") != 4 {
		v, _ := c.View("train")
		t.Errorf("%d node records, %d creates after the notice; want the replacement (4, 4): nodes %+v, last plan %v", len(byID), rec.count("mem/create"), byID, v.Plan.Actions)
	}

	// A new term loads the runtime the last one saved.
	before := c.Runtime("train").LastScaleUp
	c.Flush(ctx)
	c.Reset()
	if after := c.Runtime("train").LastScaleUp; before.IsZero() || !after.Equal(before) {
		t.Errorf("last scale-up %v after a reset, %v before; want it kept", after, before)
	}

	// Destroy: passes terminate every instance, then forget the fleet.
	if err := st.Update(ctx, func(tx state.Tx) error {
		f, err := tx.Fleet("train")
		if err != nil {
			return err
		}
		f.Destroying = true
		_, err = tx.PutFleet(f)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20 && len(destroyed) == 0; i++ {
		pass()
	}
	if len(destroyed) != 1 || mem.Live() != 0 {
		t.Fatalf("after destroy passes: destroyed %v, %d live instances; want [train], 0", destroyed, mem.Live())
	}
	if _, ok := c.View("train"); ok {
		t.Error("a destroyed fleet still has a view")
	}
	if err := st.View(ctx, func(tx state.Tx) error {
		_, err := tx.Fleet("train")
		return err
	}); err == nil {
		t.Error("the destroyed fleet's record is still in the store")
	}
}

// TestPassLeavesAFleetThatFinishedDuringItToTheNext: a pass reads the
// fleet record, then lists the instances. A job that finishes in between
// (the store says completed, then the agents power their VMs off, before
// the listing) must not read as nodes lost without notice, replaced by new
// launches: the pass sees that the record moved on and leaves the decision
// to the next one, which ends the nodes as a finished job's.
func TestPassLeavesAFleetThatFinishedDuringItToTheNext(t *testing.T) {
	st := state.NewMemory()
	mem := providertest.NewMemProvider()
	rec := &countingRecorder{}
	// The memory store stamps records with the wall clock: the pass clock
	// starts there. With a one-second visibility grace an instance missing
	// from the list is a loss at the next pass, as for a running node.
	clock := time.Now().UTC()
	_, pass := passController(t, st, mem, rec, &clock, Options{Params: reconcile.Params{VisibilityGrace: time.Second}})
	pass()
	nodes := nodesOf(t, st, "train")
	if len(nodes) != 3 {
		t.Fatalf("after the first pass: %d node records; want 3", len(nodes))
	}

	var once sync.Once
	mem.SetHook(func(ctx context.Context, op providertest.Op, cfg providers.Config) error {
		if op != providertest.OpList {
			return nil
		}
		once.Do(func() {
			if err := st.Update(ctx, func(tx state.Tx) error {
				f, err := tx.Fleet("train")
				if err != nil {
					return err
				}
				f.Completed, f.Succeeded = true, true
				_, err = tx.PutFleet(f)
				return err
			}); err != nil {
				t.Error(err)
			}
			for _, n := range nodes {
				if err := mem.Delete(ctx, cfg, n.InstanceID); err != nil {
					t.Error(err)
				}
			}
		})
		return nil
	})
	pass()
	mem.SetHook(nil)
	if got := nodesOf(t, st, "train"); len(got) != 3 || rec.count("mem/create") != 3 {
		t.Fatalf("the pass during which the job finished left %d node records after %d creates; want 3 and 3 (no replacements): %+v",
			len(got), rec.count("mem/create"), got)
	}
	for _, n := range nodesOf(t, st, "train") {
		if n.State == state.NodeFailed {
			t.Errorf("node %s failed (%s); a finished job's node is not lost", n.ID, n.Reason)
		}
	}

	pass()
	for _, n := range nodesOf(t, st, "train") {
		if n.State != state.NodeTerminated || !strings.Contains(n.Reason, "job finished") {
			t.Errorf("node %s after the next pass: %s (%s); want terminated as the job finished", n.ID, n.State, n.Reason)
		}
	}
	if rec.count("mem/create") != 3 {
		t.Errorf("%d creates in all; want the first 3 only", rec.count("mem/create"))
	}
}
