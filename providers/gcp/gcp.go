package gcp

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"github.com/fleetd/fleetd/internal/defaults"
	"github.com/fleetd/fleetd/providers"
	"google.golang.org/api/option"
)

// NoticeLead is how long before a Spot VM is stopped GCE warns it: the
// ACPI soft-off to hard-off window for Spot VMs.
const NoticeLead = 30 * time.Second

// Defaults of Options.
const (
	DefaultPollInterval = time.Second
	DefaultPageSize     = 500
)

// Options configures a Provider. The zero value uses Application Default
// Credentials against the public endpoint.
type Options struct {
	// ClientOptions are added to every Compute Engine client (credentials,
	// HTTP client, user agent).
	ClientOptions []option.ClientOption
	// PollInterval is the least time between two polls of an operation;
	// operations.wait blocks server-side, so this only paces a server that
	// answers at once. Default DefaultPollInterval.
	PollInterval time.Duration
	// PageSize is maxResults of list calls. Default DefaultPageSize.
	PageSize int

	// BillingAPIKey, when set, is the API key the Cloud Billing Catalog
	// (prices) is read with, sent as the `key` parameter, instead of the
	// credentials of the Compute Engine clients. The built-in provider
	// takes it from FLEETD_GCP_BILLING_API_KEY.
	BillingAPIKey string
	// BillingClientOptions are added to the Cloud Billing client only; when
	// given they carry its credentials.
	BillingClientOptions []option.ClientOption
	// PriceTTL is how long a catalog read is reused. Default
	// DefaultPriceTTL.
	PriceTTL time.Duration
	// PriceRetry is how long after a failed catalog read the provider waits
	// before asking again, pricing from the last read or the bundled table
	// meanwhile. Default DefaultPriceRetry.
	PriceRetry time.Duration
	// Now is the clock prices are dated by. Default time.Now.
	Now func() time.Time
}

// Provider is the GCE provider. It keeps no per-fleet state: every call
// carries its block. Clients are cached per endpoint.
type Provider struct {
	opts Options

	mu      sync.Mutex
	clients map[string]*clients
	billing *billingState
	// policies: resource policies known to exist (endpoint|project|region|name).
	policies map[string]bool
}

var _ providers.Provider = (*Provider)(nil)

// New returns a GCE provider.
func New(opts Options) *Provider {
	defaults.Positive(&opts.PollInterval, DefaultPollInterval)
	defaults.Positive(&opts.PageSize, DefaultPageSize)
	defaults.Positive(&opts.PriceTTL, DefaultPriceTTL)
	defaults.Positive(&opts.PriceRetry, DefaultPriceRetry)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Provider{opts: opts, clients: map[string]*clients{}, billing: newBillingState(), policies: map[string]bool{}}
}

type clients struct {
	instances *compute.InstancesClient
	ops       *compute.ZoneOperationsClient
	mts       *compute.MachineTypesClient
	accels    *compute.AcceleratorTypesClient
	policies  *compute.ResourcePoliciesClient
}

// client returns the clients for the block's endpoint. A plain-http
// endpoint is a local fake or proxy: no credentials are sent to it.
func (p *Provider) client(ctx context.Context, c *config) (*clients, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cl, ok := p.clients[c.Endpoint]; ok {
		return cl, nil
	}
	wrap := func(what string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("gcp: %s client: %w", what, ctx.Err())
		}
		// Almost always missing or unusable credentials: a deployment
		// problem no retry fixes.
		return providers.InvalidConfig(fmt.Errorf("gcp: %s client (Application Default Credentials): %w", what, err))
	}
	b := &clientBuilder{ctx: ctx, opts: p.clientOptions(c)}
	cl := &clients{
		instances: build(b, "instances", compute.NewInstancesRESTClient),
		ops:       build(b, "zone operations", compute.NewZoneOperationsRESTClient),
		mts:       build(b, "machine types", compute.NewMachineTypesRESTClient),
		accels:    build(b, "accelerator types", compute.NewAcceleratorTypesRESTClient),
		policies:  build(b, "resource policies", compute.NewResourcePoliciesRESTClient),
	}
	if b.err != nil {
		return nil, wrap(b.failed, b.err)
	}
	p.clients[c.Endpoint] = cl
	return cl, nil
}

// clientBuilder makes Compute Engine clients with one set of options. It
// keeps the first failure and which client it was; after one, build makes
// no more clients.
type clientBuilder struct {
	ctx    context.Context
	opts   []option.ClientOption
	failed string
	err    error
}

func build[C any](b *clientBuilder, what string, newClient func(context.Context, ...option.ClientOption) (C, error)) C {
	var c C
	if b.err == nil {
		if c, b.err = newClient(b.ctx, b.opts...); b.err != nil {
			b.failed = what
		}
	}
	return c
}

// clientOptions are the options of every Compute Engine client of the
// block: its endpoint, no credentials for a plain-http one, then the
// provider's own.
func (p *Provider) clientOptions(c *config) []option.ClientOption {
	var opts []option.ClientOption
	if c.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(c.Endpoint))
		if plainHTTP(c.Endpoint) {
			opts = append(opts, option.WithoutAuthentication())
		}
	}
	return append(opts, p.opts.ClientOptions...)
}

// plainHTTP reports whether u is an http:// URL: a local fake or proxy,
// to which no credentials are sent.
func plainHTTP(u string) bool {
	pu, err := url.Parse(u)
	return err == nil && pu.Scheme == "http"
}

// setup decodes the block and returns its clients.
func (p *Provider) setup(ctx context.Context, cfg providers.Config) (*config, *clients, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	c, err := decodeConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	cl, err := p.client(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	return c, cl, nil
}

// Info describes the provider.
func (p *Provider) Info(ctx context.Context) (providers.Info, error) {
	if err := ctx.Err(); err != nil {
		return providers.Info{}, err
	}
	return providers.Info{Name: Name, Schema: Schema, NoticeLead: NoticeLead}, nil
}
