// Package providertest is the conformance suite every fleetd provider
// passes, in-process and through the gRPC plugin, plus MemProvider, a
// complete in-memory provider with fault hooks for tests of code that
// drives providers.
package providertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
)

// Options adapts the suite to a provider. The zero value runs every check
// that needs no provider-specific knowledge.
type Options struct {
	// LaunchOffering picks the offering the suite launches from the
	// provider's offerings. Default: the cheapest one with Available != 0.
	LaunchOffering func(offs []providers.Offering) providers.Offering
	// InvalidConfig returns a config the provider must refuse with an
	// invalid-config error from Offerings and Create. Nil skips the check.
	InvalidConfig func(cfg providers.Config) providers.Config
	// CapacityError returns a config under which launching off fails with a
	// capacity error. Nil skips the check.
	CapacityError func(cfg providers.Config, off providers.Offering) providers.Config
	// QuotaError returns a config under which launching off fails with a
	// quota error. Nil skips the check.
	QuotaError func(cfg providers.Config, off providers.Offering) providers.Config
	// Interrupter says the provider implements providers.Interrupter and the
	// suite checks that an injected interruption shows on Get.
	Interrupter bool
	// CallTimeout bounds every call, so a hung provider fails the test
	// instead of the whole run. Default: 30s.
	CallTimeout time.Duration
	// Skip skips checks by subtest name (e.g. "CreateIsIdempotent"), the
	// value saying why the check does not apply, for a backend that cannot
	// honour it (an emulator); the reason shows in the test output. A name
	// that is no check fails the run.
	Skip map[string]string
}

// runTagKey scopes List calls to the instances one subtest launched, so the
// suite also works against a provider that holds other instances.
const runTagKey = "fleetd-conformance-run"

// suite is the state of one subtest.
type suite struct {
	t    *testing.T
	p    providers.Provider
	cfg  providers.Config
	opts Options
	run  string
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// check is one subtest of the suite.
type check struct {
	name string
	skip string // non-empty: why the check does not apply
	fn   func(s *suite)
}

// Run runs the conformance suite. newProvider is called once per subtest
// and returns the provider under test and a valid config for it; it
// registers its own cleanup with t.
func Run(t *testing.T, newProvider func(t *testing.T) (providers.Provider, providers.Config), opts Options) {
	t.Helper()
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 30 * time.Second
	}
	tests := []check{
		{name: "Info", fn: (*suite).testInfo},
		{name: "Offerings", fn: (*suite).testOfferings},
		{name: "CreateIsIdempotent", fn: (*suite).testCreateIdempotent},
		{name: "ListFiltersByTags", fn: (*suite).testListFilters},
		{name: "DeleteIsIdempotent", fn: (*suite).testDelete},
		{name: "GetUnknownIsNotFound", fn: (*suite).testGetUnknown},
		{name: "CancelledContext", fn: (*suite).testCancelled},
		{name: "InvalidConfig", skip: skipIf(opts.InvalidConfig == nil, "Options.InvalidConfig"), fn: (*suite).testInvalidConfig},
		{name: "CapacityError", skip: skipIf(opts.CapacityError == nil, "Options.CapacityError"), fn: (*suite).testCapacity},
		{name: "QuotaError", skip: skipIf(opts.QuotaError == nil, "Options.QuotaError"), fn: (*suite).testQuota},
		{name: "Interrupt", skip: skipIf(!opts.Interrupter, "Options.Interrupter"), fn: (*suite).testInterrupt},
	}
	for name, why := range opts.Skip {
		if !slices.ContainsFunc(tests, func(c check) bool { return c.name == name }) {
			t.Fatalf("Options.Skip names %q, which is no check of the suite", name)
		}
		if why == "" {
			t.Fatalf("Options.Skip[%q] gives no reason", name)
		}
	}
	for _, tc := range tests {
		if why := opts.Skip[tc.name]; why != "" && tc.skip == "" {
			tc.skip = why
		}
		t.Run(tc.name, func(t *testing.T) {
			if tc.skip != "" {
				t.Skip(tc.skip)
			}
			p, cfg := newProvider(t)
			tc.fn(&suite{t: t, p: p, cfg: cfg, opts: opts, run: randHex(6)})
		})
	}
}

func skipIf(cond bool, option string) string {
	if cond {
		return "not configured for this provider: set " + option
	}
	return ""
}

// ctx returns a context bounded by CallTimeout.
func (s *suite) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.CallTimeout)
	s.t.Cleanup(cancel)
	return ctx
}

func (s *suite) info() providers.Info {
	s.t.Helper()
	info, err := s.p.Info(s.ctx())
	if err != nil {
		s.t.Fatalf("Info: %v", err)
	}
	return info
}

func (s *suite) offerings() []providers.Offering {
	s.t.Helper()
	offs, err := s.p.Offerings(s.ctx(), s.cfg)
	if err != nil {
		s.t.Fatalf("Offerings: %v", err)
	}
	if len(offs) == 0 {
		s.t.Fatal("Offerings returned none")
	}
	return offs
}

// launchOffering is the offering the suite launches.
func (s *suite) launchOffering() providers.Offering {
	s.t.Helper()
	offs := s.offerings()
	if s.opts.LaunchOffering != nil {
		return s.opts.LaunchOffering(offs)
	}
	var best *providers.Offering
	for i := range offs {
		if offs[i].Available == 0 {
			continue
		}
		if best == nil || offs[i].PricePerHour < best.PricePerHour {
			best = &offs[i]
		}
	}
	if best == nil {
		s.t.Fatal("no offering has capacity (all Available == 0); set Options.LaunchOffering")
	}
	return *best
}

// tags returns the tags of an instance of fleet launched by this subtest.
func (s *suite) tags(fleet, node string) map[string]string {
	return map[string]string{
		providers.TagFleet:    fleet,
		providers.TagNodeID:   node,
		providers.TagDaemonID: "conformance",
		runTagKey:             s.run,
	}
}

// create launches and registers the instances for deletion at cleanup.
func (s *suite) create(cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	ins, err := s.p.Create(s.ctx(), cfg, req)
	for _, in := range ins {
		id := in.ID
		s.t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.CallTimeout)
			defer cancel()
			if err := s.p.Delete(ctx, s.cfg, id); err != nil {
				s.t.Errorf("cleanup: Delete %s: %v", id, err)
			}
		})
	}
	return ins, err
}

func (s *suite) mustCreate(fleet, node string, count int) (providers.LaunchRequest, []providers.Instance) {
	s.t.Helper()
	req := providers.LaunchRequest{
		Offering:         s.launchOffering(),
		Count:            count,
		UserData:         "#cloud-config\n{}\n",
		Tags:             s.tags(fleet, node),
		IdempotencyToken: "conformance-" + s.run + "-" + node,
	}
	ins, err := s.create(s.cfg, req)
	if err != nil {
		s.t.Fatalf("Create %d × %s: %v", count, req.Offering.Key(), err)
	}
	return req, ins
}

func (s *suite) list(tags map[string]string) []providers.Instance {
	s.t.Helper()
	ins, err := s.p.List(s.ctx(), s.cfg, tags)
	if err != nil {
		s.t.Fatalf("List %v: %v", tags, err)
	}
	return ins
}

// live drops terminated instances: List may or may not return them.
func live(ins []providers.Instance) []providers.Instance {
	return slices.DeleteFunc(slices.Clone(ins), func(in providers.Instance) bool { return in.State == providers.StateTerminated })
}

func (s *suite) testInfo() {
	info := s.info()
	if info.Name == "" {
		s.t.Error("Info.Name is empty")
	}
	if len(info.Schema.Attributes) == 0 {
		s.t.Error("Info.Schema has no attributes")
	}
	if _, err := info.Schema.HCLSpec(); err != nil {
		s.t.Errorf("Info.Schema is not a valid HCL spec: %v", err)
	}
	seen := map[string]bool{}
	for _, a := range info.Schema.Attributes {
		if a.Name == "" {
			s.t.Error("schema attribute with an empty name")
		}
		if seen[a.Name] {
			s.t.Errorf("schema attribute %q declared twice", a.Name)
		}
		seen[a.Name] = true
	}
	if info.NoticeLead < 0 {
		s.t.Errorf("Info.NoticeLead = %v, want >= 0", info.NoticeLead)
	}
}

func (s *suite) testOfferings() {
	name := s.info().Name
	keys := map[string]bool{}
	for _, o := range s.offerings() {
		k := o.Key()
		if keys[k] {
			s.t.Errorf("offering key %s appears twice", k)
		}
		keys[k] = true
		if o.Provider != name {
			s.t.Errorf("%s: Provider = %q, want the provider's name %q", k, o.Provider, name)
		}
		if o.Region == "" || o.InstanceType == "" {
			s.t.Errorf("%s: empty region or instance type", k)
		}
		if o.CapacityType != providers.Spot && o.CapacityType != providers.OnDemand {
			s.t.Errorf("%s: capacity type %q, want spot or on-demand", k, o.CapacityType)
		}
		if !(o.PricePerHour > 0) {
			s.t.Errorf("%s: price %v, want > 0", k, o.PricePerHour)
		}
		if o.GPUs < 0 || o.VCPUs < 0 || o.MemoryGiB < 0 {
			s.t.Errorf("%s: negative shape (gpus %d, vcpus %d, memory %v)", k, o.GPUs, o.VCPUs, o.MemoryGiB)
		}
		if o.GPUs > 0 && o.GPUType == "" {
			s.t.Errorf("%s: %d GPUs of no type", k, o.GPUs)
		}
		if o.Available < -1 {
			s.t.Errorf("%s: Available = %d, want >= -1", k, o.Available)
		}
	}
}

func (s *suite) testCreateIdempotent() {
	fleet := s.cfg.Fleet
	req, first := s.mustCreate(fleet, "node-1", 2)
	if len(first) != 2 {
		s.t.Fatalf("Create(count 2) returned %d instances", len(first))
	}
	ids := map[string]bool{}
	for _, in := range first {
		if in.ID == "" {
			s.t.Error("instance with an empty id")
		}
		if ids[in.ID] {
			s.t.Errorf("id %s returned twice", in.ID)
		}
		ids[in.ID] = true
		if in.State == providers.StateTerminated {
			s.t.Errorf("%s: fresh instance is terminated", in.ID)
		}
		if in.Offering.Key() != req.Offering.Key() {
			s.t.Errorf("%s: offering %s, want %s", in.ID, in.Offering.Key(), req.Offering.Key())
		}
		for k, v := range req.Tags {
			if in.Tags[k] != v {
				s.t.Errorf("%s: tag %s = %q, want %q", in.ID, k, in.Tags[k], v)
			}
		}
	}
	before := live(s.list(map[string]string{runTagKey: s.run}))
	if len(before) != 2 {
		s.t.Fatalf("List by run tag: %d instances, want 2", len(before))
	}

	again, err := s.create(s.cfg, req)
	if err != nil {
		s.t.Fatalf("Create with the same token: %v", err)
	}
	if got, want := sortedIDs(again), sortedIDs(first); !slices.Equal(got, want) {
		s.t.Errorf("Create with the same token returned %v, want the first call's %v", got, want)
	}
	if after := live(s.list(map[string]string{runTagKey: s.run})); len(after) != len(before) {
		s.t.Errorf("Create with the same token launched more: %d live instances, want %d", len(after), len(before))
	}

	for _, in := range first {
		got, err := s.p.Get(s.ctx(), s.cfg, in.ID)
		if err != nil {
			s.t.Errorf("Get %s: %v", in.ID, err)
			continue
		}
		if got.ID != in.ID {
			s.t.Errorf("Get %s returned %s", in.ID, got.ID)
		}
		if got.Tags[providers.TagFleet] != fleet || got.Tags[providers.TagNodeID] != "node-1" {
			s.t.Errorf("Get %s: tags %v lost the launch tags", in.ID, got.Tags)
		}
	}
}

func (s *suite) testListFilters() {
	fleetA, fleetB := s.cfg.Fleet, s.cfg.Fleet+"-other"
	_, a := s.mustCreate(fleetA, "a-1", 1)
	_, b := s.mustCreate(fleetB, "b-1", 1)

	for _, tc := range []struct {
		fleet string
		want  []providers.Instance
	}{{fleetA, a}, {fleetB, b}} {
		got := live(s.list(map[string]string{providers.TagFleet: tc.fleet, runTagKey: s.run}))
		if g, w := sortedIDs(got), sortedIDs(tc.want); !slices.Equal(g, w) {
			s.t.Errorf("List fleet %s: %v, want %v", tc.fleet, g, w)
		}
	}
	both := live(s.list(map[string]string{runTagKey: s.run}))
	if len(both) != 2 {
		s.t.Errorf("List by run tag: %d instances, want 2", len(both))
	}
	if none := live(s.list(map[string]string{providers.TagFleet: fleetA, runTagKey: s.run, providers.TagNodeID: "b-1"})); len(none) != 0 {
		s.t.Errorf("List requires every tag, but matched %v", sortedIDs(none))
	}
}

func (s *suite) testDelete() {
	_, ins := s.mustCreate(s.cfg.Fleet, "del-1", 1)
	id := ins[0].ID
	for i := range 2 {
		if err := s.p.Delete(s.ctx(), s.cfg, id); err != nil {
			s.t.Fatalf("Delete #%d of %s: %v", i+1, id, err)
		}
	}
	if err := s.p.Delete(s.ctx(), s.cfg, "conformance-no-such-instance-"+s.run); err != nil {
		s.t.Errorf("Delete of an unknown id: %v, want nil", err)
	}
	got, err := s.p.Get(s.ctx(), s.cfg, id)
	switch {
	case err != nil && !providers.IsNotFound(err):
		s.t.Errorf("Get after Delete: %v, want a not-found error or a terminated instance", err)
	case err == nil && got.State != providers.StateTerminated:
		s.t.Errorf("Get after Delete: state %q, want %q or not-found", got.State, providers.StateTerminated)
	}
	if left := live(s.list(map[string]string{runTagKey: s.run})); len(left) != 0 {
		s.t.Errorf("List after Delete still shows %v live", sortedIDs(left))
	}
}

func (s *suite) testGetUnknown() {
	_, err := s.p.Get(s.ctx(), s.cfg, "conformance-no-such-instance-"+s.run)
	if !providers.IsNotFound(err) {
		s.t.Errorf("Get of an unknown id: %v, want a not-found error", err)
	}
}

// wantKind checks err is a typed provider error of kind about off.
func (s *suite) wantKind(op string, err error, kind providers.ErrorKind, off providers.Offering) {
	s.t.Helper()
	var pe *providers.Error
	if !errors.As(err, &pe) {
		s.t.Fatalf("%s: %v, want a *providers.Error of kind %s", op, err, kind)
	}
	if pe.Kind != kind {
		s.t.Fatalf("%s: kind %s (%v), want %s", op, pe.Kind, err, kind)
	}
	if off.Provider != "" && pe.Offering != "" && pe.Offering != off.Key() {
		s.t.Errorf("%s: error names offering %s, want %s", op, pe.Offering, off.Key())
	}
}

func (s *suite) testInvalidConfig() {
	bad := s.opts.InvalidConfig(s.cfg)
	_, err := s.p.Offerings(s.ctx(), bad)
	s.wantKind("Offerings with an invalid config", err, providers.KindInvalidConfig, providers.Offering{})
	req := providers.LaunchRequest{Offering: s.launchOffering(), Count: 1, Tags: s.tags(s.cfg.Fleet, "bad-1"), IdempotencyToken: "conformance-" + s.run + "-bad"}
	ins, err := s.create(bad, req)
	s.wantKind("Create with an invalid config", err, providers.KindInvalidConfig, providers.Offering{})
	if len(ins) != 0 || len(live(s.list(map[string]string{runTagKey: s.run}))) != 0 {
		s.t.Error("Create with an invalid config launched instances")
	}
}

func (s *suite) testLaunchFails(name string, mk func(providers.Config, providers.Offering) providers.Config, kind providers.ErrorKind) {
	off := s.launchOffering()
	cfg := mk(s.cfg, off)
	req := providers.LaunchRequest{Offering: off, Count: 1, Tags: s.tags(cfg.Fleet, name), IdempotencyToken: "conformance-" + s.run + "-" + name}
	ins, err := s.create(cfg, req)
	s.wantKind("Create under "+name, err, kind, off)
	if len(ins) != 0 || len(live(s.list(map[string]string{runTagKey: s.run}))) != 0 {
		s.t.Errorf("Create failing with %s launched instances", kind)
	}
}

func (s *suite) testCapacity() {
	s.testLaunchFails("capacity", s.opts.CapacityError, providers.KindCapacity)
}

func (s *suite) testQuota() {
	s.testLaunchFails("quota", s.opts.QuotaError, providers.KindQuota)
}

func (s *suite) testCancelled() {
	off := s.launchOffering()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := providers.LaunchRequest{Offering: off, Count: 1, Tags: s.tags(s.cfg.Fleet, "cancel-1"), IdempotencyToken: "conformance-" + s.run + "-cancel"}
	calls := []struct {
		op string
		fn func() error
	}{
		{"Info", func() error { _, err := s.p.Info(ctx); return err }},
		{"Offerings", func() error { _, err := s.p.Offerings(ctx, s.cfg); return err }},
		{"Create", func() error {
			ins, err := s.p.Create(ctx, s.cfg, req)
			for _, in := range ins { // must not happen; clean up if it did
				_ = s.p.Delete(s.ctx(), s.cfg, in.ID)
			}
			return err
		}},
		{"Get", func() error { _, err := s.p.Get(ctx, s.cfg, "conformance-"+s.run); return err }},
		{"List", func() error { _, err := s.p.List(ctx, s.cfg, map[string]string{runTagKey: s.run}); return err }},
		{"Delete", func() error { return s.p.Delete(ctx, s.cfg, "conformance-"+s.run) }},
	}
	for _, c := range calls {
		done := make(chan error, 1)
		go func() { done <- c.fn() }()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				s.t.Errorf("%s with a cancelled context: %v, want an error matching context.Canceled", c.op, err)
			}
		case <-time.After(s.opts.CallTimeout):
			s.t.Fatalf("%s with a cancelled context did not return within %v", c.op, s.opts.CallTimeout)
		}
	}
	if left := live(s.list(map[string]string{runTagKey: s.run})); len(left) != 0 {
		s.t.Errorf("Create with a cancelled context launched %v", sortedIDs(left))
	}
}

func (s *suite) testInterrupt() {
	ip, ok := s.p.(providers.Interrupter)
	if !ok {
		s.t.Fatalf("%T does not implement providers.Interrupter", s.p)
	}
	_, ins := s.mustCreate(s.cfg.Fleet, "int-1", 1)
	deadline := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)
	if err := ip.Interrupt(s.ctx(), s.cfg, ins[0].ID, providers.InterruptionInfo{Kind: "spot-interruption", Deadline: deadline}); err != nil {
		s.t.Fatalf("Interrupt: %v", err)
	}
	got, err := s.p.Get(s.ctx(), s.cfg, ins[0].ID)
	if err != nil {
		s.t.Fatalf("Get after Interrupt: %v", err)
	}
	if got.Interruption == nil || got.Interruption.Kind != "spot-interruption" {
		s.t.Fatalf("Get after Interrupt: interruption %+v, want kind spot-interruption", got.Interruption)
	}
	if !got.Interruption.Deadline.IsZero() && !got.Interruption.Deadline.Equal(deadline) {
		s.t.Errorf("interruption deadline %v, want %v", got.Interruption.Deadline, deadline)
	}
	err = ip.Interrupt(s.ctx(), s.cfg, "conformance-no-such-instance-"+s.run, providers.InterruptionInfo{Kind: "preempted"})
	if !providers.IsNotFound(err) {
		s.t.Errorf("Interrupt of an unknown id: %v, want a not-found error", err)
	}
}
