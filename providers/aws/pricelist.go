package aws

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/pricing"
	pricingtypes "github.com/aws/aws-sdk-go-v2/service/pricing/types"

	"github.com/fleetd/fleetd/providers/internal/clientcache"
)

// Price sources an offering's PriceSource names.
const (
	SourceSpotHistory = "DescribeSpotPriceHistory"
	SourcePriceList   = "AWS Price List API"
	SourceBundled     = "bundled table"
	SourceOverride    = "on_demand_prices override"
)

// BundledPricesAsOf is when the bundled on-demand table (prices.go) was read.
var BundledPricesAsOf = time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC)

// Defaults of the on-demand price options.
const (
	DefaultOnDemandPriceTTL   = 24 * time.Hour
	DefaultOnDemandPriceRetry = time.Hour
)

// pricingRegion is where the Price List Query API is asked: it has
// endpoints only in us-east-1, ap-south-1 and eu-central-1, and each
// serves the prices of every region.
const pricingRegion = "us-east-1"

// pricingAPI is the part of the Price List client the provider uses;
// *pricing.Client implements it.
type pricingAPI interface {
	GetProducts(context.Context, *pricing.GetProductsInput, ...func(*pricing.Options)) (*pricing.GetProductsOutput, error)
}

// priceQuote is one on-demand price and where it comes from.
type priceQuote struct {
	price  float64
	source string
	asOf   time.Time
}

// listEntry is the Price List API's answer for one (scope, region, type):
// found false means the list has no such product (cached as such too).
type listEntry struct {
	price float64
	found bool
	at    time.Time
}

// priceList caches Price List API answers per (scope, region, type) and
// remembers, per scope, until when not to ask after a failure.
type priceList struct {
	clients clientcache.Cache[string, pricingAPI]      // by profile|pricing_endpoint
	entries map[string]listEntry                       // by pricingScope|region|type
	retryAt map[string]time.Time                       // by pricingScope
	note    map[string]string                          // by pricingScope: why the API is not used
	spotAt  map[string]map[string]map[string]time.Time // by cacheKey, type, zone
}

func newPriceList() *priceList {
	return &priceList{
		entries: map[string]listEntry{},
		retryAt: map[string]time.Time{}, note: map[string]string{},
		spotAt: map[string]map[string]map[string]time.Time{},
	}
}

func (b block) pricingScope() string { return b.Profile + "|" + b.PricingEndpoint }

// pricingClient returns the (cached) Price List client of block b.
func (p *Provider) pricingClient(ctx context.Context, b block) (pricingAPI, error) {
	return p.prices.clients.Get(b.pricingScope(), func() (pricingAPI, error) {
		cfg, err := loadConfig(ctx, b.Profile, pricingRegion, p.opts.RetryMaxAttempts, p.backoff)
		if err != nil {
			return nil, err
		}
		return pricing.NewFromConfig(cfg, func(o *pricing.Options) { setEndpoint(&o.BaseEndpoint, b.PricingEndpoint) }), nil
	})
}

// onDemandQuotes returns the on-demand price of each of the block's
// instance types in region that has one: the block's on_demand_prices
// override wins; then the Price List API's answer (cached for
// OnDemandPriceTTL); then the bundled table. When the Price List API is
// denied or unreachable the provider uses the bundled table and asks
// again only after OnDemandPriceRetry, so a missing pricing:GetProducts
// permission costs one failed call an hour, not one per Offerings call.
// A stale Price List answer is kept over the bundled table while the API
// fails. A block whose endpoint is a plain-http URL (a local fake or
// emulator) and that sets no pricing_endpoint never asks the real API.
// Only a cancelled ctx is an error.
func (p *Provider) onDemandQuotes(ctx context.Context, b block, region string) (map[string]priceQuote, error) {
	out := map[string]priceQuote{}
	local := b.PricingEndpoint == "" && strings.HasPrefix(b.Endpoint, "http://")
	for _, it := range b.InstanceTypes {
		if _, ok := out[it]; ok {
			continue
		}
		if local {
			if q, ok := p.quoteOf(b, it, listEntry{}); ok {
				out[it] = q
			}
			continue
		}
		if q, ok := p.overrideOrCached(b, region, it); ok {
			out[it] = q
			continue
		}
		e, err := p.askPriceList(ctx, b, region, it)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			p.mu.Lock()
			p.prices.retryAt[b.pricingScope()] = p.opts.Now().Add(p.opts.OnDemandPriceRetry)
			p.prices.note[b.pricingScope()] = unavailableNote(err)
			e = p.prices.entries[b.pricingScope()+"|"+region+"|"+it] // stale, or none
			p.mu.Unlock()
		}
		if q, ok := p.quoteOf(b, it, e); ok {
			out[it] = q
		}
	}
	return out, nil
}

// overrideOrCached answers without calling the API when it can: an
// override, a fresh cache entry, or the bundled table while the API is
// in its retry pause.
func (p *Provider) overrideOrCached(b block, region, it string) (priceQuote, bool) {
	if v, ok := b.OnDemandPrices[it]; ok {
		return priceQuote{price: v, source: SourceOverride}, true
	}
	now := p.opts.Now()
	p.mu.Lock()
	e, cached := p.prices.entries[b.pricingScope()+"|"+region+"|"+it]
	pause := now.Before(p.prices.retryAt[b.pricingScope()])
	p.mu.Unlock()
	if cached && now.Sub(e.at) < p.opts.OnDemandPriceTTL {
		return p.quoteOf(b, it, e)
	}
	if pause {
		return p.quoteOf(b, it, e) // stale, or none: the bundled table
	}
	return priceQuote{}, false
}

// knownOnDemandQuoteLocked is the on-demand price as far as the provider
// knows without calling any API (Get and List describe offerings from
// caches). p.mu must be held.
func (p *Provider) knownOnDemandQuoteLocked(b block, region, it string) (priceQuote, bool) {
	return p.quoteOfLocked(b, it, p.prices.entries[b.pricingScope()+"|"+region+"|"+it])
}

// quoteOf turns a Price List answer into a quote, falling back to the
// bundled table when the list had no price; the bundled source says why
// when the API failed.
func (p *Provider) quoteOf(b block, it string, e listEntry) (priceQuote, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.quoteOfLocked(b, it, e)
}

func (p *Provider) quoteOfLocked(b block, it string, e listEntry) (priceQuote, bool) {
	if v, ok := b.OnDemandPrices[it]; ok {
		return priceQuote{price: v, source: SourceOverride}, true
	}
	if e.found {
		return priceQuote{price: e.price, source: SourcePriceList, asOf: e.at}, true
	}
	if v, ok := onDemandPrices[it]; ok {
		src := SourceBundled
		if n := p.prices.note[b.pricingScope()]; n != "" {
			src += " (" + n + ")"
		}
		return priceQuote{price: v, source: src, asOf: BundledPricesAsOf}, true
	}
	return priceQuote{}, false
}

// askPriceList asks the Price List API for the Linux, shared-tenancy
// on-demand price of it in region and caches the answer (also "no such
// product"). On error the returned entry is empty.
func (p *Provider) askPriceList(ctx context.Context, b block, region, it string) (listEntry, error) {
	client, err := p.pricingClient(ctx, b)
	if err != nil {
		return listEntry{}, err
	}
	in := &pricing.GetProductsInput{
		ServiceCode:   awssdk.String("AmazonEC2"),
		FormatVersion: awssdk.String("aws_v1"),
		MaxResults:    awssdk.Int32(100),
		Filters:       productFilters(region, it),
	}
	var prices []listPrice
	for range maxPages {
		resp, err := client.GetProducts(ctx, in)
		if err != nil {
			return listEntry{}, fmt.Errorf("pricing GetProducts for %s in %s: %w", it, region, err)
		}
		for _, doc := range resp.PriceList {
			lp, err := parsePriceListItem(doc)
			if err != nil {
				return listEntry{}, fmt.Errorf("pricing GetProducts for %s in %s: %w", it, region, err)
			}
			prices = append(prices, lp...)
		}
		if awssdk.ToString(resp.NextToken) == "" {
			break
		}
		in.NextToken = resp.NextToken
	}
	e := listEntry{at: p.opts.Now()}
	e.price, e.found = pickPrice(prices)
	p.mu.Lock()
	p.prices.entries[b.pricingScope()+"|"+region+"|"+it] = e
	delete(p.prices.retryAt, b.pricingScope())
	delete(p.prices.note, b.pricingScope())
	p.mu.Unlock()
	return e, nil
}

// productFilters select the one product fleetd launches: Linux, no
// pre-installed software, shared tenancy, regular (not reserved-capacity)
// usage.
func productFilters(region, it string) []pricingtypes.Filter {
	f := func(field, value string) pricingtypes.Filter {
		return pricingtypes.Filter{Type: pricingtypes.FilterTypeTermMatch, Field: awssdk.String(field), Value: awssdk.String(value)}
	}
	return []pricingtypes.Filter{
		f("instanceType", it), f("regionCode", region), f("operatingSystem", "Linux"),
		f("tenancy", "Shared"), f("preInstalledSw", "NA"), f("capacitystatus", "Used"),
	}
}

// listPrice is one on-demand hourly price of one product.
type listPrice struct {
	operation, license string
	usd                float64
}

// priceListItem is the part of a Price List product document fleetd reads.
type priceListItem struct {
	Product struct {
		Attributes map[string]string `json:"attributes"`
	} `json:"product"`
	Terms struct {
		OnDemand map[string]struct {
			PriceDimensions map[string]struct {
				Unit         string            `json:"unit"`
				PricePerUnit map[string]string `json:"pricePerUnit"`
			} `json:"priceDimensions"`
		} `json:"OnDemand"`
	} `json:"terms"`
}

// parsePriceListItem reads the hourly USD on-demand prices of one
// PriceList item (a JSON document in a string).
func parsePriceListItem(doc string) ([]listPrice, error) {
	var item priceListItem
	if err := json.Unmarshal([]byte(doc), &item); err != nil {
		return nil, fmt.Errorf("bad price list item: %w", err)
	}
	var out []listPrice
	for _, term := range item.Terms.OnDemand {
		for _, d := range term.PriceDimensions {
			if d.Unit != "Hrs" {
				continue
			}
			s, ok := d.PricePerUnit["USD"]
			if !ok {
				continue
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || v < 0 {
				return nil, fmt.Errorf("bad price list item: USD price %q", s)
			}
			out = append(out, listPrice{operation: item.Product.Attributes["operation"], license: item.Product.Attributes["licenseModel"], usd: v})
		}
	}
	return out, nil
}

// pickPrice chooses the price of plain Linux (operation RunInstances) when
// the filters left several products, ignoring zero prices.
func pickPrice(ps []listPrice) (float64, bool) {
	best, found := 0.0, false
	for _, pass := range []func(listPrice) bool{
		func(lp listPrice) bool { return lp.operation == "RunInstances" },
		func(lp listPrice) bool { return true },
	} {
		for _, lp := range ps {
			if lp.usd > 0 && pass(lp) && (!found || lp.usd < best) {
				best, found = lp.usd, true
			}
		}
		if found {
			return best, true
		}
	}
	return 0, false
}

// rememberSpotTimes keeps when each cached spot price took effect.
func (p *Provider) rememberSpotTimes(key string, at map[string]map[string]time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prices.spotAt[key] = at
}

// spotTime is when the cached spot price of it in zone took effect.
func (p *Provider) spotTime(b block, region, it, zone string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prices.spotAt[cacheKey(b, region)][it][zone]
}

// unavailableNote says in a few words why the Price List API gave no
// answer: its error code (AccessDeniedException when the credentials lack
// pricing:GetProducts) or "unreachable".
func unavailableNote(err error) string {
	if code := apiCode(err); code != "" {
		return SourcePriceList + ": " + code
	}
	return SourcePriceList + " unreachable"
}
