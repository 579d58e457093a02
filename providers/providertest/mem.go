package providertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleetd/providers"
)

// MemName is the provider name of MemProvider.
const MemName = "mem"

// Error codes MemProvider uses, in the style of a cloud's own codes.
const (
	MemCodeCapacity = "MemInsufficientCapacity"
	MemCodeQuota    = "MemGPUQuotaExceeded"
	MemCodeMismatch = "MemIdempotentParameterMismatch"
)

// Op names a provider method, for hooks and call counts.
type Op string

const (
	OpInfo      Op = "Info"
	OpOfferings Op = "Offerings"
	OpCreate    Op = "Create"
	OpGet       Op = "Get"
	OpList      Op = "List"
	OpDelete    Op = "Delete"
	OpInterrupt Op = "Interrupt"
)

// Hook is called at the start of every MemProvider call (after the context
// check). A non-nil error is returned instead of doing the call: this is how
// tests inject faults (typed errors, slowness, blocking until cancelled).
type Hook func(ctx context.Context, op Op, cfg providers.Config) error

// MemConfig is the provider block MemProvider accepts (Config.Raw). Its
// knobs let a test steer a MemProvider it cannot reach in-process, e.g. one
// serving in a plugin subprocess. Unknown attributes are invalid-config errors.
type MemConfig struct {
	// Capacity limits live instances per offering key, overriding SetCapacity.
	Capacity map[string]int `json:"capacity,omitempty"`
	// QuotaGPUs limits the GPUs of all live instances, overriding SetQuotaGPUs.
	QuotaGPUs *int `json:"quota_gpus,omitempty"`
	// CreateDelay makes Create wait this long (a Go duration) before launching.
	CreateDelay string `json:"create_delay,omitempty"`
	// BlockOnceFile: if this file exists when Create starts, Create removes
	// it and then blocks until its context ends. Only one Create claims the
	// file, so a retry of the same call goes through.
	BlockOnceFile string `json:"block_once_file,omitempty"`
}

// MemSchema is the schema of MemConfig.
var MemSchema = providers.ConfigSchema{Attributes: []providers.Attribute{
	{Name: "capacity", Type: providers.TypeJSON, Description: "Max live instances per offering key."},
	{Name: "quota_gpus", Type: providers.TypeNumber, Description: "Max GPUs across all live instances."},
	{Name: "create_delay", Type: providers.TypeString, Description: "Delay before Create launches (Go duration)."},
	{Name: "block_once_file", Type: providers.TypeString, Description: "If this file exists, Create removes it and blocks until cancelled."},
}}

// MemProvider is a complete in-memory provider: a fixed catalog of
// offerings, per-offering capacity and a GPU quota, idempotent Create by
// token, tags, termination, interruption injection, and hooks for faults.
// It is safe for concurrent use. Instances live as long as the value (or
// the plugin process serving it).
type MemProvider struct {
	idPrefix string

	mu        sync.Mutex
	offerings []providers.Offering
	capacity  map[string]int
	quotaGPUs int // < 0: unlimited
	hook      Hook
	seq       int
	instances map[string]*providers.Instance
	order     []string // creation order, for a stable List
	tokens    map[string]tokenUse
	calls     map[Op]int
}

type tokenUse struct {
	offering string
	count    int
	ids      []string
}

var (
	_ providers.Provider    = (*MemProvider)(nil)
	_ providers.Interrupter = (*MemProvider)(nil)
)

// NewMemProvider returns a MemProvider with the default catalog
// (MemOfferings), unlimited capacity and quota, and no hook.
func NewMemProvider() *MemProvider {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &MemProvider{
		// A per-value prefix keeps ids unique across plugin restarts.
		idPrefix:  "mem-" + hex.EncodeToString(b[:]) + "-",
		offerings: MemOfferings(),
		capacity:  map[string]int{},
		quotaGPUs: -1,
		instances: map[string]*providers.Instance{},
		tokens:    map[string]tokenUse{},
		calls:     map[Op]int{},
	}
}

// MemOfferings is MemProvider's default catalog: three instance types in
// two zones, spot and on-demand.
func MemOfferings() []providers.Offering {
	type shape struct {
		name           string
		gpus           int
		gpuType        string
		vcpus          int
		mem            float64
		spot, onDemand float64
	}
	shapes := []shape{
		{"m1.cpu", 0, "", 2, 8, 0.03, 0.10},
		{"m1.gpu1", 1, "T4", 4, 16, 0.20, 0.53},
		{"m1.gpu8", 8, "A100", 96, 1152, 12.00, 32.77},
	}
	var out []providers.Offering
	for _, zone := range []string{"mem-1a", "mem-1b"} {
		for _, s := range shapes {
			for _, ct := range []providers.CapacityType{providers.Spot, providers.OnDemand} {
				price := s.onDemand
				if ct == providers.Spot {
					price = s.spot
				}
				out = append(out, providers.Offering{
					Provider: MemName, Region: "mem-1", Zone: zone, InstanceType: s.name, CapacityType: ct,
					PricePerHour: price, GPUs: s.gpus, GPUType: s.gpuType, VCPUs: s.vcpus, MemoryGiB: s.mem, Available: -1,
				})
			}
		}
	}
	return out
}

// SetCapacity limits live instances of the offering with key to n; n < 0
// removes the limit.
func (p *MemProvider) SetCapacity(key string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n < 0 {
		delete(p.capacity, key)
		return
	}
	p.capacity[key] = n
}

// SetQuotaGPUs limits the GPUs of all live instances; n < 0 is unlimited.
func (p *MemProvider) SetQuotaGPUs(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.quotaGPUs = n
}

// SetHook installs (or, with nil, removes) the fault hook.
func (p *MemProvider) SetHook(h Hook) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hook = h
}

// Calls returns how many times op was called.
func (p *MemProvider) Calls(op Op) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[op]
}

// Live returns the number of instances not terminated.
func (p *MemProvider) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, in := range p.instances {
		if in.State != providers.StateTerminated {
			n++
		}
	}
	return n
}

// begin is the common prologue: count, honour a done context, run the
// hook, decode the block.
func (p *MemProvider) begin(ctx context.Context, op Op, cfg providers.Config) (MemConfig, error) {
	p.mu.Lock()
	p.calls[op]++
	hook := p.hook
	p.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return MemConfig{}, fmt.Errorf("mem %s: %w", op, err)
	}
	if hook != nil {
		if err := hook(ctx, op, cfg); err != nil {
			return MemConfig{}, err
		}
	}
	return decodeMemConfig(cfg)
}

func decodeMemConfig(cfg providers.Config) (MemConfig, error) {
	var mc MemConfig
	if err := cfg.DecodeStrict(&mc); err != nil {
		return mc, providers.InvalidConfig(fmt.Errorf("mem provider block: %w", err))
	}
	if mc.CreateDelay != "" {
		if _, err := time.ParseDuration(mc.CreateDelay); err != nil {
			return mc, providers.InvalidConfig(fmt.Errorf("mem provider block: create_delay: %w", err))
		}
	}
	return mc, nil
}

func (p *MemProvider) Info(ctx context.Context) (providers.Info, error) {
	if _, err := p.begin(ctx, OpInfo, providers.Config{}); err != nil {
		return providers.Info{}, err
	}
	return providers.Info{Name: MemName, Schema: MemSchema, NoticeLead: 2 * time.Minute}, nil
}

// limits returns the effective capacity map and GPU quota for a call.
// Caller holds p.mu.
func (p *MemProvider) limits(mc MemConfig) (map[string]int, int) {
	capacity := maps.Clone(p.capacity)
	maps.Copy(capacity, mc.Capacity)
	quota := p.quotaGPUs
	if mc.QuotaGPUs != nil {
		quota = *mc.QuotaGPUs
	}
	return capacity, quota
}

// liveCounts returns live instances per offering key and live GPUs.
// Caller holds p.mu.
func (p *MemProvider) liveCounts() (map[string]int, int) {
	perKey, gpus := map[string]int{}, 0
	for _, in := range p.instances {
		if in.State == providers.StateTerminated {
			continue
		}
		perKey[in.Offering.Key()]++
		gpus += in.Offering.GPUs
	}
	return perKey, gpus
}

func (p *MemProvider) Offerings(ctx context.Context, cfg providers.Config) ([]providers.Offering, error) {
	mc, err := p.begin(ctx, OpOfferings, cfg)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	capacity, _ := p.limits(mc)
	live, _ := p.liveCounts()
	out := make([]providers.Offering, len(p.offerings))
	copy(out, p.offerings)
	for i := range out {
		if c, ok := capacity[out[i].Key()]; ok {
			out[i].Available = max(0, c-live[out[i].Key()])
		}
	}
	return out, nil
}

func (p *MemProvider) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	mc, err := p.begin(ctx, OpCreate, cfg)
	if err != nil {
		return nil, err
	}
	if req.Count < 1 {
		return nil, providers.Errorf(providers.KindInvalidConfig, "mem: count %d: must be at least 1", req.Count)
	}
	key := req.Offering.Key()
	var off *providers.Offering
	for i := range p.offerings {
		if p.offerings[i].Key() == key {
			off = &p.offerings[i]
		}
	}
	if off == nil {
		return nil, providers.Errorf(providers.KindInvalidConfig, "mem: unknown offering %s", key)
	}
	if err := memDelay(ctx, mc); err != nil {
		return nil, err
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if req.IdempotencyToken != "" {
		if use, ok := p.tokens[req.IdempotencyToken]; ok {
			if use.offering != key || use.count != req.Count {
				return nil, &providers.Error{Kind: providers.KindInvalidConfig, Code: MemCodeMismatch, Offering: key,
					Err: fmt.Errorf("idempotency token %q was used for %d × %s", req.IdempotencyToken, use.count, use.offering)}
			}
			out := make([]providers.Instance, 0, len(use.ids))
			for _, id := range use.ids {
				out = append(out, copyInstance(p.instances[id]))
			}
			return out, nil
		}
	}
	capacity, quota := p.limits(mc)
	live, gpus := p.liveCounts()
	if c, ok := capacity[key]; ok && live[key]+req.Count > c {
		return nil, &providers.Error{Kind: providers.KindCapacity, Code: MemCodeCapacity, Offering: key,
			Err: fmt.Errorf("%d of %d instances in use, %d requested", live[key], c, req.Count)}
	}
	if quota >= 0 && gpus+req.Count*off.GPUs > quota {
		return nil, &providers.Error{Kind: providers.KindQuota, Code: MemCodeQuota, Offering: key, RetryAfter: 10 * time.Minute,
			Err: fmt.Errorf("%d of %d GPUs in use, %d requested", gpus, quota, req.Count*off.GPUs)}
	}
	now := time.Now().UTC()
	use := tokenUse{offering: key, count: req.Count}
	out := make([]providers.Instance, 0, req.Count)
	for range req.Count {
		p.seq++
		in := &providers.Instance{
			ID:         fmt.Sprintf("%s%d", p.idPrefix, p.seq),
			Offering:   *off,
			State:      providers.StateRunning,
			Tags:       maps.Clone(req.Tags),
			LaunchedAt: now,
		}
		in.Offering.Available = -1
		p.instances[in.ID] = in
		p.order = append(p.order, in.ID)
		use.ids = append(use.ids, in.ID)
		out = append(out, copyInstance(in))
	}
	if req.IdempotencyToken != "" {
		p.tokens[req.IdempotencyToken] = use
	}
	return out, nil
}

// memDelay applies the config's slowness knobs, honouring ctx.
func memDelay(ctx context.Context, mc MemConfig) error {
	if mc.BlockOnceFile != "" {
		if err := os.Remove(mc.BlockOnceFile); err == nil {
			<-ctx.Done()
			return fmt.Errorf("mem Create: %w", ctx.Err())
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("mem Create: claim %s: %w", mc.BlockOnceFile, err)
		}
	}
	if mc.CreateDelay != "" {
		d, _ := time.ParseDuration(mc.CreateDelay) // validated by decodeMemConfig
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("mem Create: %w", ctx.Err())
		}
	}
	return nil
}

// copyInstance is what Get and List return: the caller's own copy, except
// for Tags, which the provider never changes after Create (it is made
// then, from the request) and callers only read: sharing it spares a
// 10,000-instance List as many map copies, which a real provider, decoding
// its response, does not make either.
func copyInstance(in *providers.Instance) providers.Instance {
	out := *in
	if in.Interruption != nil {
		ii := *in.Interruption
		out.Interruption = &ii
	}
	return out
}

func (p *MemProvider) Get(ctx context.Context, cfg providers.Config, id string) (providers.Instance, error) {
	if _, err := p.begin(ctx, OpGet, cfg); err != nil {
		return providers.Instance{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	in, ok := p.instances[id]
	if !ok {
		return providers.Instance{}, providers.Errorf(providers.KindNotFound, "mem: no instance %q", id)
	}
	return copyInstance(in), nil
}

func (p *MemProvider) List(ctx context.Context, cfg providers.Config, tags map[string]string) ([]providers.Instance, error) {
	if _, err := p.begin(ctx, OpList, cfg); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []providers.Instance
	for _, id := range p.order {
		in := p.instances[id]
		if in.State == providers.StateTerminated || !providers.HasTags(in.Tags, tags) {
			continue
		}
		if out == nil {
			out = make([]providers.Instance, 0, len(p.order)) // one allocation for a large fleet
		}
		out = append(out, copyInstance(in))
	}
	return out, nil
}

func (p *MemProvider) Delete(ctx context.Context, cfg providers.Config, id string) error {
	if _, err := p.begin(ctx, OpDelete, cfg); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if in, ok := p.instances[id]; ok {
		in.State = providers.StateTerminated
	}
	return nil
}

func (p *MemProvider) Interrupt(ctx context.Context, cfg providers.Config, id string, info providers.InterruptionInfo) error {
	if _, err := p.begin(ctx, OpInterrupt, cfg); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	in, ok := p.instances[id]
	if !ok || in.State == providers.StateTerminated {
		return providers.Errorf(providers.KindNotFound, "mem: no live instance %q", id)
	}
	in.Interruption = &info
	return nil
}

// sortedIDs returns the instance ids, sorted; a helper for comparisons.
func sortedIDs(ins []providers.Instance) []string {
	ids := make([]string, 0, len(ins))
	for _, in := range ins {
		ids = append(ids, in.ID)
	}
	sort.Strings(ids)
	return ids
}
