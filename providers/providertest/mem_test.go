package providertest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

func gpuOffering(t *testing.T) providers.Offering {
	t.Helper()
	for _, o := range providertest.MemOfferings() {
		if o.GPUs == 8 && o.CapacityType == providers.Spot {
			return o
		}
	}
	t.Fatal("no 8-GPU spot offering")
	return providers.Offering{}
}

func ctx(t *testing.T) context.Context { return testutil.Context(t, 10*time.Second) }

func TestMemCapacityAndAvailable(t *testing.T) {
	p := providertest.NewMemProvider()
	off := gpuOffering(t)
	p.SetCapacity(off.Key(), 3)
	cfg := providers.Config{Fleet: "f"}

	available := func() int {
		offs, err := p.Offerings(ctx(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range offs {
			if o.Key() == off.Key() {
				return o.Available
			}
		}
		t.Fatal("offering vanished")
		return 0
	}
	if got := available(); got != 3 {
		t.Errorf("Available = %d, want 3", got)
	}
	ins, err := p.Create(ctx(t), cfg, providers.LaunchRequest{Offering: off, Count: 2, IdempotencyToken: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := available(); got != 1 {
		t.Errorf("Available after 2 launches = %d, want 1", got)
	}
	_, err = p.Create(ctx(t), cfg, providers.LaunchRequest{Offering: off, Count: 2, IdempotencyToken: "b"})
	var pe *providers.Error
	if !errors.As(err, &pe) || pe.Kind != providers.KindCapacity || pe.Code != providertest.MemCodeCapacity || pe.Offering != off.Key() {
		t.Fatalf("over capacity: %v", err)
	}
	// Deleting frees capacity.
	if err := p.Delete(ctx(t), cfg, ins[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx(t), cfg, providers.LaunchRequest{Offering: off, Count: 2, IdempotencyToken: "b"}); err != nil {
		t.Errorf("launch after a delete freed capacity: %v", err)
	}
	if p.Live() != 3 {
		t.Errorf("Live = %d, want 3", p.Live())
	}
	p.SetCapacity(off.Key(), -1)
	if got := available(); got != -1 {
		t.Errorf("Available without a limit = %d, want -1", got)
	}
}

func TestMemQuota(t *testing.T) {
	p := providertest.NewMemProvider()
	p.SetQuotaGPUs(16)
	off := gpuOffering(t)
	cfg := providers.Config{Fleet: "f"}
	if _, err := p.Create(ctx(t), cfg, providers.LaunchRequest{Offering: off, Count: 2}); err != nil {
		t.Fatal(err)
	}
	_, err := p.Create(ctx(t), cfg, providers.LaunchRequest{Offering: off, Count: 1})
	var pe *providers.Error
	if !errors.As(err, &pe) || pe.Kind != providers.KindQuota || pe.RetryAfter <= 0 {
		t.Fatalf("over quota: %v", err)
	}
	// A config knob overrides the provider-level quota.
	cfg.Raw = []byte(`{"quota_gpus": 24}`)
	if _, err := p.Create(ctx(t), cfg, providers.LaunchRequest{Offering: off, Count: 1}); err != nil {
		t.Errorf("within the config's quota: %v", err)
	}
}

func TestMemTokenReuseWithOtherParameters(t *testing.T) {
	p := providertest.NewMemProvider()
	off := gpuOffering(t)
	cfg := providers.Config{Fleet: "f"}
	if _, err := p.Create(ctx(t), cfg, providers.LaunchRequest{Offering: off, Count: 1, IdempotencyToken: "t"}); err != nil {
		t.Fatal(err)
	}
	_, err := p.Create(ctx(t), cfg, providers.LaunchRequest{Offering: off, Count: 2, IdempotencyToken: "t"})
	var pe *providers.Error
	if !errors.As(err, &pe) || pe.Kind != providers.KindInvalidConfig || pe.Code != providertest.MemCodeMismatch {
		t.Errorf("token reused for another count: %v", err)
	}
	if p.Live() != 1 {
		t.Errorf("Live = %d, want 1", p.Live())
	}
}

func TestMemRejectsBadRequests(t *testing.T) {
	p := providertest.NewMemProvider()
	off := gpuOffering(t)
	unknown := off
	unknown.Zone = "nowhere-1z"
	for name, tc := range map[string]struct {
		cfg providers.Config
		req providers.LaunchRequest
	}{
		"unknown offering": {providers.Config{}, providers.LaunchRequest{Offering: unknown, Count: 1}},
		"zero count":       {providers.Config{}, providers.LaunchRequest{Offering: off, Count: 0}},
		"unknown knob":     {providers.Config{Raw: []byte(`{"capacityy": {}}`)}, providers.LaunchRequest{Offering: off, Count: 1}},
		"bad delay":        {providers.Config{Raw: []byte(`{"create_delay": "soon"}`)}, providers.LaunchRequest{Offering: off, Count: 1}},
	} {
		if _, err := p.Create(ctx(t), tc.cfg, tc.req); !providers.IsInvalidConfig(err) {
			t.Errorf("%s: %v, want invalid-config", name, err)
		}
	}
	if p.Live() != 0 {
		t.Errorf("bad requests launched %d instances", p.Live())
	}
}

func TestMemHookAndCalls(t *testing.T) {
	p := providertest.NewMemProvider()
	injected := providers.Transient(errors.New("throttled"))
	var seen []providertest.Op
	p.SetHook(func(_ context.Context, op providertest.Op, cfg providers.Config) error {
		seen = append(seen, op)
		if op == providertest.OpList && cfg.Fleet == "throttled" {
			return injected
		}
		return nil
	})
	if _, err := p.List(ctx(t), providers.Config{Fleet: "throttled"}, nil); !errors.Is(err, injected) {
		t.Errorf("List with the hook failing: %v", err)
	}
	if _, err := p.List(ctx(t), providers.Config{Fleet: "fine"}, nil); err != nil {
		t.Errorf("List: %v", err)
	}
	if p.Calls(providertest.OpList) != 2 || len(seen) != 2 {
		t.Errorf("Calls(List) = %d, hook saw %v", p.Calls(providertest.OpList), seen)
	}
	p.SetHook(nil)
	if _, err := p.List(ctx(t), providers.Config{Fleet: "throttled"}, nil); err != nil {
		t.Errorf("List after removing the hook: %v", err)
	}
}

func TestMemSlowCreateHonoursContext(t *testing.T) {
	p := providertest.NewMemProvider()
	off := gpuOffering(t)

	cfg := providers.Config{Raw: []byte(`{"create_delay": "1h"}`)}
	c, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.Create(c, cfg, providers.LaunchRequest{Offering: off, Count: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("slow Create past its deadline: %v", err)
	}

	gate := filepath.Join(t.TempDir(), "gate")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg = providers.Config{Raw: []byte(`{"block_once_file": "` + gate + `"}`)}
	c2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := p.Create(c2, cfg, providers.LaunchRequest{Offering: off, Count: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("blocked Create: %v", err)
	}
	// The gate was claimed, so the next Create goes through.
	if _, err := p.Create(ctx(t), cfg, providers.LaunchRequest{Offering: off, Count: 1}); err != nil {
		t.Errorf("Create after the gate was claimed: %v", err)
	}
	if p.Live() != 1 {
		t.Errorf("Live = %d, want 1", p.Live())
	}
}
