package aws

import (
	"context"
	"sync"
	"time"

	"github.com/fleetd/fleetd/internal/defaults"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/internal/clientcache"
)

// NoticeLead is the warning EC2 gives before it reclaims a spot instance.
const NoticeLead = 2 * time.Minute

// Defaults of Options.
const (
	DefaultSpotPriceTTL      = 5 * time.Minute
	DefaultInstanceTypeTTL   = time.Hour
	DefaultConsistencyWindow = 2 * time.Minute
	DefaultRetryMaxAttempts  = 4
	DefaultRetryMaxBackoff   = 10 * time.Second
)

// Options tunes the provider. The zero value is production-ready.
type Options struct {
	// SpotPriceTTL is how long spot prices from DescribeSpotPriceHistory
	// are reused; default 5 min.
	SpotPriceTTL time.Duration
	// InstanceTypeTTL is how long the catalogue is reused:
	// DescribeInstanceTypes answers (GPU, vCPU, memory; they never change),
	// DescribeInstanceTypeOfferings (which zones offer a type) and zone
	// ids; default 1 h.
	InstanceTypeTTL time.Duration
	// ConsistencyWindow is how long after RunInstances the provider
	// vouches for an instance EC2's Describe calls do not show yet
	// (eventual consistency); default 2 min.
	ConsistencyWindow time.Duration
	// PlacementScoreTTL is how long spot placement scores are reused;
	// default 30 min.
	PlacementScoreTTL time.Duration
	// PlacementScoreRetry is how long after a refused or unserved
	// GetSpotPlacementScores call the provider asks again; default 1 h
	// (24 h after EC2's configuration-limit answer).
	PlacementScoreRetry time.Duration
	// RetryMaxAttempts bounds the SDK's attempts per call (throttling,
	// 5xx); default 4.
	RetryMaxAttempts int
	// RetryMaxBackoff caps the SDK's backoff between attempts; default 10 s.
	RetryMaxBackoff time.Duration
	// ConsistencyRetryDelay is the first pause before Delete retries an
	// instance EC2 does not show yet; it doubles per try. Default 250 ms.
	ConsistencyRetryDelay time.Duration
	// OnDemandPriceTTL is how long on-demand prices from the Price List
	// API are reused; default 24 h (AWS changes them rarely).
	OnDemandPriceTTL time.Duration
	// OnDemandPriceRetry is how long after a denied or failed Price List
	// call the bundled table is used before the API is asked again;
	// default 1 h.
	OnDemandPriceRetry time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Provider is the EC2 provider. It keeps no per-fleet state, only caches
// (clients, instance types, spot prices) and the instances it launched in
// the last ConsistencyWindow; every call carries its provider block.
type Provider struct {
	opts Options

	mu        sync.Mutex
	clients   clientcache.Cache[clientKey, ec2API]
	typeCache map[string]cached[map[string]typeInfo]
	spotCache map[string]cached[map[string]map[string]float64]
	zoneCache map[string]cached[map[string]map[string]bool]
	// zoneIDCache maps zone ids to names per scope and region.
	zoneIDCache map[string]cached[map[string]string]
	// vpcCache: the VPCs nodes land in per scope, region and subnets (vpc.go).
	vpcCache   map[string]cached[regionVPCs]
	scoreCache map[string]scoreEntry
	recent     map[string]recentLaunch
	prices     *priceList // on-demand prices (pricelist.go)
	// groups: placement groups known to exist (scope|region|name), so a
	// launch describes its group once per process.
	groups map[string]bool
}

type cached[T any] struct {
	at  time.Time
	val T
}

// fromCache answers cache[key] while it is younger than ttl; otherwise it
// calls fetch and keeps a successful answer, stamped with the time fetch
// was asked at. An error is never cached: the next call asks again.
func fromCache[T any](p *Provider, cache map[string]cached[T], key string, ttl time.Duration, fetch func(now time.Time) (T, error)) (T, error) {
	now := p.opts.Now()
	p.mu.Lock()
	c, ok := cache[key]
	p.mu.Unlock()
	if ok && now.Sub(c.at) < ttl {
		return c.val, nil
	}
	val, err := fetch(now)
	if err != nil {
		return val, err
	}
	p.mu.Lock()
	cache[key] = cached[T]{at: now, val: val}
	p.mu.Unlock()
	return val, nil
}

// recentLaunch is an instance RunInstances returned that Describe calls
// may not show yet.
type recentLaunch struct {
	scope, region string
	inst          providers.Instance
	at            time.Time
}

var _ providers.Provider = (*Provider)(nil)

// New returns an EC2 provider.
func New(opts Options) *Provider {
	defaults.Positive(&opts.SpotPriceTTL, DefaultSpotPriceTTL)
	defaults.Positive(&opts.InstanceTypeTTL, DefaultInstanceTypeTTL)
	defaults.Positive(&opts.ConsistencyWindow, DefaultConsistencyWindow)
	defaults.Positive(&opts.PlacementScoreTTL, DefaultPlacementScoreTTL)
	defaults.Positive(&opts.PlacementScoreRetry, DefaultPlacementScoreRetry)
	defaults.Positive(&opts.RetryMaxAttempts, DefaultRetryMaxAttempts)
	defaults.Positive(&opts.RetryMaxBackoff, DefaultRetryMaxBackoff)
	defaults.Positive(&opts.ConsistencyRetryDelay, 250*time.Millisecond)
	defaults.Positive(&opts.OnDemandPriceTTL, DefaultOnDemandPriceTTL)
	defaults.Positive(&opts.OnDemandPriceRetry, DefaultOnDemandPriceRetry)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Provider{
		opts:      opts,
		groups:    map[string]bool{},
		typeCache: map[string]cached[map[string]typeInfo]{},
		spotCache: map[string]cached[map[string]map[string]float64]{},
		zoneCache: map[string]cached[map[string]map[string]bool]{},

		zoneIDCache: map[string]cached[map[string]string]{},
		vpcCache:    map[string]cached[regionVPCs]{},
		scoreCache:  map[string]scoreEntry{},
		recent:      map[string]recentLaunch{},
		prices:      newPriceList(),
	}
}

// Info describes the provider.
func (p *Provider) Info(ctx context.Context) (providers.Info, error) {
	if err := ctx.Err(); err != nil {
		return providers.Info{}, err
	}
	return providers.Info{Name: Name, Schema: Schema, NoticeLead: NoticeLead}, nil
}
