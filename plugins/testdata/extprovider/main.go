// Command extprovider is a minimal but complete external fleetd provider,
// built by the plugins tests into fleetd-provider-ext. It imports only
// providers and plugins, as every external provider must.
package main

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/fleetd/fleetd/plugins"
	"github.com/fleetd/fleetd/providers"
)

type ext struct {
	mu        sync.Mutex
	seq       int
	instances map[string]*providers.Instance
	order     []string
	tokens    map[string][]string
}

var offerings = []providers.Offering{
	{Provider: "ext", Region: "ext-1", Zone: "ext-1a", InstanceType: "e1.gpu2", CapacityType: providers.Spot,
		PricePerHour: 0.9, GPUs: 2, GPUType: "L4", VCPUs: 16, MemoryGiB: 64, Available: -1},
	{Provider: "ext", Region: "ext-1", Zone: "ext-1a", InstanceType: "e1.gpu2", CapacityType: providers.OnDemand,
		PricePerHour: 2.4, GPUs: 2, GPUType: "L4", VCPUs: 16, MemoryGiB: 64, Available: -1},
}

func (e *ext) Info(ctx context.Context) (providers.Info, error) {
	if err := ctx.Err(); err != nil {
		return providers.Info{}, err
	}
	return providers.Info{
		Name: "ext",
		Schema: providers.ConfigSchema{Attributes: []providers.Attribute{
			{Name: "region", Type: providers.TypeString, Description: "Region to launch in."},
		}},
		NoticeLead: 30 * time.Second,
	}, nil
}

func (e *ext) Offerings(ctx context.Context, _ providers.Config) ([]providers.Offering, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return append([]providers.Offering(nil), offerings...), nil
}

func (e *ext) Create(ctx context.Context, _ providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	ids, ok := e.tokens[req.IdempotencyToken]
	if !ok || req.IdempotencyToken == "" {
		for range req.Count {
			e.seq++
			in := &providers.Instance{ID: fmt.Sprintf("ext-%d", e.seq), Offering: req.Offering, State: providers.StateRunning,
				Tags: maps.Clone(req.Tags), LaunchedAt: time.Now()}
			e.instances[in.ID] = in
			e.order = append(e.order, in.ID)
			ids = append(ids, in.ID)
		}
		e.tokens[req.IdempotencyToken] = ids
	}
	out := make([]providers.Instance, 0, len(ids))
	for _, id := range ids {
		out = append(out, *e.instances[id])
	}
	return out, nil
}

func (e *ext) Get(ctx context.Context, _ providers.Config, id string) (providers.Instance, error) {
	if err := ctx.Err(); err != nil {
		return providers.Instance{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	in, ok := e.instances[id]
	if !ok {
		return providers.Instance{}, providers.Errorf(providers.KindNotFound, "no instance %s", id)
	}
	return *in, nil
}

func (e *ext) List(ctx context.Context, _ providers.Config, tags map[string]string) ([]providers.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []providers.Instance
next:
	for _, id := range e.order {
		in := e.instances[id]
		if in.State == providers.StateTerminated {
			continue
		}
		for k, v := range tags {
			if in.Tags[k] != v {
				continue next
			}
		}
		out = append(out, *in)
	}
	return out, nil
}

func (e *ext) Delete(ctx context.Context, _ providers.Config, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if in, ok := e.instances[id]; ok {
		in.State = providers.StateTerminated
	}
	return nil
}

func main() {
	logger := plugins.NewLogger("ext")
	logger.Info("ext provider serving", "offerings", len(offerings))
	plugins.ServeWith(plugins.ServeOptions{
		Provider: &ext{instances: map[string]*providers.Instance{}, tokens: map[string][]string{}},
		Logger:   logger,
	})
}
