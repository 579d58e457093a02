package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/googleapis/gax-go/v2/apierror"
	cloudbilling "google.golang.org/api/cloudbilling/v1"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"

	"github.com/fleetd/fleetd/providers/internal/clientcache"
)

// Prices of Compute Engine from the Cloud Billing Catalog API.
//
// The catalog lists SKUs, not machine types: a VM is billed per vCPU-hour
// and per GiB-hour of memory at its series' rates, plus per GPU-hour for
// each GPU, whether built in (A2, A3, G2) or attached (N1). fleetd reads
// every page of services/6F81-5844-456A/skus once per PriceTTL, keeps the
// SKUs it can compose a price from, and prices a machine type in a region
// as
//
//	vCPUs × "<series> Core" + memory GiB × "<series> Ram" + Σ GPUs × "<gpu> GPU"
//
// with the OnDemand SKUs for on-demand offerings and the Preemptible ones
// ("Spot Preemptible <series> Core …", "<gpu> GPU attached to Spot
// Preemptible VMs …") for Spot offerings. Series and GPUs covered are in
// seriesSKU and gpuSKU; other types fall back to the bundled table.

// ComputeEngineService is Compute Engine's name in the Cloud Billing
// Catalog.
const ComputeEngineService = "services/6F81-5844-456A"

// Price sources an offering's PriceSource names.
const (
	SourceCatalog  = "Cloud Billing Catalog API"
	SourceBundled  = "bundled table"
	SourceOverride = "prices override"
)

// Defaults of the price options.
const (
	DefaultPriceTTL   = 24 * time.Hour
	DefaultPriceRetry = time.Hour
)

// maxCatalogPages bounds one catalog read (the real catalog is a few
// pages of 5000 SKUs).
const maxCatalogPages = 200

// seriesSKU maps a machine series (the machine type's prefix) to the name
// its vCPU and memory SKUs carry: "<name> Core running in <location>",
// "<name> Ram running in <location>". N1's are in resource group
// N1Standard, the others' in CPU and RAM; the group is not needed to tell
// them apart. Shared-core types (e2-micro, -small, -medium, f1, g1) are
// billed differently and not covered.
var seriesSKU = map[string]string{
	"n1":  "N1 Predefined Instance",
	"a2":  "A2 Instance", // a2-highgpu, a2-megagpu, a2-ultragpu
	"a3":  "A3 Instance", // a3-highgpu, a3-megagpu
	"g2":  "G2 Instance",
	"n2":  "N2 Instance",
	"n2d": "N2D AMD Instance",
	"e2":  "E2 Instance",
	"c2":  "Compute optimized",
	"c2d": "C2D AMD Instance",
	"c3":  "C3 Instance",
	"t2d": "T2D AMD Instance",
	"t2a": "T2A Arm Instance",
}

// gpuSKU maps an accelerator type to the name its GPU SKUs carry: "<name>
// GPU running in <location>" (on-demand) and "<name> GPU attached to Spot
// Preemptible VMs running in <location>" (Spot).
var gpuSKU = map[string]string{
	"nvidia-tesla-t4":       "Nvidia Tesla T4",
	"nvidia-tesla-v100":     "Nvidia Tesla V100",
	"nvidia-tesla-p100":     "Nvidia Tesla P100",
	"nvidia-tesla-p4":       "Nvidia Tesla P4",
	"nvidia-tesla-a100":     "Nvidia Tesla A100",
	"nvidia-a100-80gb":      "Nvidia Tesla A100 80GB",
	"nvidia-l4":             "Nvidia L4",
	"nvidia-h100-80gb":      "Nvidia H100 80GB",
	"nvidia-h100-mega-80gb": "Nvidia H100 80GB Mega",
}

// sharedCore types have fractional vCPUs and their own SKUs.
var sharedCore = map[string]bool{"e2-micro": true, "e2-small": true, "e2-medium": true, "f1-micro": true, "g1-small": true}

// skuKey names one component price: the series or GPU name, the kind
// ("Core", "Ram", "GPU") and whether it is the Spot rate.
type skuKey struct {
	name, kind string
	spot       bool
}

// regionRate is one component's USD rate in one region, with the number
// of regions its SKU covers (the most specific SKU wins).
type regionRate struct {
	usd     float64
	regions int
}

// skuPrices are the usable rates of a catalog, by component and region.
type skuPrices map[skuKey]map[string]regionRate

// add records a SKU's rate for each of its regions. When two SKUs price
// the same component in a region (us-east4 has "Virginia" and "Northern
// Virginia" SKUs), the one covering fewer regions wins, then the higher
// price, so a cost is never understated.
func (sp skuPrices) add(k skuKey, regions []string, usd float64) {
	m := sp[k]
	if m == nil {
		m = map[string]regionRate{}
		sp[k] = m
	}
	for _, r := range regions {
		old, ok := m[r]
		if !ok || len(regions) < old.regions || (len(regions) == old.regions && usd > old.usd) {
			m[r] = regionRate{usd: usd, regions: len(regions)}
		}
	}
}

func (sp skuPrices) rate(name, kind string, spot bool, region string) (float64, bool) {
	r, ok := sp[skuKey{name, kind, spot}][region]
	return r.usd, ok
}

// machine prices a machine type with its built-in GPUs in region from the
// catalog; false when its series, a GPU or a rate is not in it.
func (sp skuPrices) machine(mt *computepb.MachineType, region string, spot bool) (float64, bool) {
	name := mt.GetName()
	series, _, _ := strings.Cut(name, "-")
	sku, ok := seriesSKU[series]
	if !ok || sharedCore[name] {
		return 0, false
	}
	core, ok1 := sp.rate(sku, "Core", spot, region)
	ram, ok2 := sp.rate(sku, "Ram", spot, region)
	if !ok1 || !ok2 {
		return 0, false
	}
	total := core*float64(mt.GetGuestCpus()) + ram*float64(mt.GetMemoryMb())/1024
	for _, a := range mt.GetAccelerators() {
		g, ok := sp.gpu(a.GetGuestAcceleratorType(), region, spot)
		if !ok {
			return 0, false
		}
		total += g * float64(a.GetGuestAcceleratorCount())
	}
	return total, true
}

// gpu is one GPU's hourly rate in region.
func (sp skuPrices) gpu(accelType, region string, spot bool) (float64, bool) {
	sku, ok := gpuSKU[accelType]
	if !ok {
		return 0, false
	}
	return sp.rate(sku, "GPU", spot, region)
}

// skuDescRE splits the descriptions of the SKUs fleetd composes prices
// from: "<name> Core|Ram|GPU running in <location>". The location is
// plain words: commitment, DWS ("… (DWS)", "… for DWS Defined
// Duration"), reservation and sole-tenancy SKUs do not match, nor do
// custom types, whose names ("Custom Instance", "N2 Custom Instance")
// are no series'.
var skuDescRE = regexp.MustCompile(`^(.+) (Core|Ram|GPU) running in ([A-Z][A-Za-z.' -]*)$`)

// classifySKU says which component a SKU prices, from its description,
// resource family, usage type and usage unit; false for every SKU fleetd
// does not use. Spot SKUs read "Spot Preemptible <name> Core …" (older
// ones: "Preemptible <name> Core …") and "<gpu> GPU attached to Spot
// Preemptible VMs running in …", with usageType Preemptible.
func classifySKU(desc, family, usage, unit string) (skuKey, bool) {
	if family != "Compute" {
		return skuKey{}, false
	}
	var spot bool
	switch usage {
	case "OnDemand":
	case "Preemptible":
		spot = true
		var cut bool
		if desc, cut = strings.CutPrefix(desc, "Spot Preemptible "); !cut {
			desc, _ = strings.CutPrefix(desc, "Preemptible ")
		}
		desc = strings.Replace(desc, " GPU attached to Spot Preemptible VMs running in ", " GPU running in ", 1)
	default:
		return skuKey{}, false
	}
	m := skuDescRE.FindStringSubmatch(desc)
	if m == nil || strings.Contains(m[3], " for ") || strings.HasPrefix(m[1], "Spot ") || strings.HasPrefix(m[1], "Preemptible ") {
		return skuKey{}, false
	}
	want := "h"
	if m[2] == "Ram" {
		want = "GiBy.h"
	}
	if unit != want {
		return skuKey{}, false
	}
	return skuKey{name: m[1], kind: m[2], spot: spot}, true
}

// unitPrice is the current USD rate of a SKU: the last pricing info (the
// list is chronological) and its first tier (compute SKUs have one).
func unitPrice(pis []*cloudbilling.PricingInfo) (float64, bool) {
	if len(pis) == 0 {
		return 0, false
	}
	pe := pis[len(pis)-1].PricingExpression
	if pe == nil || len(pe.TieredRates) == 0 || pe.TieredRates[0].UnitPrice == nil {
		return 0, false
	}
	m := pe.TieredRates[0].UnitPrice
	if m.CurrencyCode != "" && m.CurrencyCode != "USD" {
		return 0, false
	}
	v := float64(m.Units) + float64(m.Nanos)/1e9
	if v < 0 {
		return 0, false
	}
	return v, true
}

// catalogEntry is one catalog read.
type catalogEntry struct {
	prices skuPrices
	at     time.Time
}

// catalogView is what an Offerings call prices with: the catalog's rates
// (nil when none were read), when they were read, and, when the API gave
// no fresh answer, why.
type catalogView struct {
	prices skuPrices
	at     time.Time
	note   string
}

// billingState caches catalog reads per billing endpoint and remembers,
// after a failure, until when not to ask again.
type billingState struct {
	services clientcache.Cache[string, *cloudbilling.APIService]
	entries  map[string]*catalogEntry
	retryAt  map[string]time.Time
	note     map[string]string
	inflight map[string]chan struct{}
}

func newBillingState() *billingState {
	return &billingState{entries: map[string]*catalogEntry{},
		retryAt: map[string]time.Time{}, note: map[string]string{}, inflight: map[string]chan struct{}{}}
}

// billingEndpoint is the Cloud Billing endpoint of a block, "" for the
// public one.
func (c *config) billingEndpoint() string { return c.BillingEndpoint }

// asksCatalog reports whether the block's prices come from the catalog: a
// block aimed at a plain-http Compute endpoint (a local fake or proxy)
// that sets no billing_endpoint never asks the real API.
func (c *config) asksCatalog() bool { return c.BillingEndpoint != "" || !plainHTTP(c.Endpoint) }

// billingOptions are the Cloud Billing client's options: the block's
// endpoint; then the API key when the provider has one; else the
// billing-only client options when given (they carry the credentials);
// else none for a plain-http endpoint; else the Compute Engine clients'
// credentials (Application Default Credentials or ClientOptions).
func (p *Provider) billingOptions(c *config) []option.ClientOption {
	var opts []option.ClientOption
	if ep := c.billingEndpoint(); ep != "" {
		opts = append(opts, option.WithEndpoint(strings.TrimSuffix(ep, "/")+"/"))
	}
	switch {
	case p.opts.BillingAPIKey != "":
		opts = append(opts, option.WithAPIKey(p.opts.BillingAPIKey))
	case len(p.opts.BillingClientOptions) > 0:
	case plainHTTP(c.billingEndpoint()):
		opts = append(opts, option.WithoutAuthentication())
	default:
		opts = append(opts, p.opts.ClientOptions...)
	}
	return append(opts, p.opts.BillingClientOptions...)
}

// billingService returns the (cached) Cloud Billing client of the block.
func (p *Provider) billingService(ctx context.Context, c *config) (*cloudbilling.APIService, error) {
	return p.billing.services.Get(c.billingEndpoint(), func() (*cloudbilling.APIService, error) {
		svc, err := cloudbilling.NewService(ctx, p.billingOptions(c)...)
		if err != nil {
			return nil, &noCredentialsError{err}
		}
		return svc, nil
	})
}

// noCredentialsError is a Cloud Billing client that could not be built,
// almost always for want of credentials.
type noCredentialsError struct{ err error }

func (e *noCredentialsError) Error() string { return "Cloud Billing client: " + e.err.Error() }
func (e *noCredentialsError) Unwrap() error { return e.err }

// readCatalog reads every page of Compute Engine's SKUs and keeps the
// rates classifySKU accepts.
func (p *Provider) readCatalog(ctx context.Context, c *config) (skuPrices, error) {
	svc, err := p.billingService(ctx, c)
	if err != nil {
		return nil, err
	}
	out := skuPrices{}
	pages := 0
	call := svc.Services.Skus.List(ComputeEngineService).CurrencyCode("USD").PageSize(5000).
		Fields("nextPageToken", "skus(description,category(resourceFamily,usageType),serviceRegions,pricingInfo(pricingExpression(usageUnit,tieredRates(unitPrice))))")
	err = call.Pages(ctx, func(resp *cloudbilling.ListSkusResponse) error {
		if pages++; pages > maxCatalogPages {
			return fmt.Errorf("more than %d pages", maxCatalogPages)
		}
		for _, s := range resp.Skus {
			if s.Category == nil || s.PricingInfo == nil {
				continue
			}
			unit := ""
			if pe := s.PricingInfo[len(s.PricingInfo)-1].PricingExpression; pe != nil {
				unit = pe.UsageUnit
			}
			k, ok := classifySKU(s.Description, s.Category.ResourceFamily, s.Category.UsageType, unit)
			if !ok {
				continue
			}
			if v, ok := unitPrice(s.PricingInfo); ok {
				out.add(k, s.ServiceRegions, v)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cloud billing skus.list %s: %w", ComputeEngineService, err)
	}
	return out, nil
}

// catalogReadTimeout bounds one catalog read, which runs on past the
// Offerings call that started it (callers wait for it at most as long as
// their own context allows, and the next call finds the result).
const catalogReadTimeout = 3 * time.Minute

// catalog returns the rates an Offerings call prices with: a read younger
// than PriceTTL; else a new read (concurrent callers share one); when the
// API fails (denied, disabled, unreachable), the last read however old,
// or none, with the reason, and the API is asked again only after
// PriceRetry, so a project without the Cloud Billing API costs one failed
// read an hour. Only a cancelled ctx is an error.
func (p *Provider) catalog(ctx context.Context, c *config) (catalogView, error) {
	if !c.asksCatalog() {
		return catalogView{}, nil
	}
	key := c.billingEndpoint()
	for range 3 {
		now := p.opts.Now()
		p.mu.Lock()
		e := p.billing.entries[key]
		if e != nil && now.Sub(e.at) < p.opts.PriceTTL {
			p.mu.Unlock()
			return catalogView{prices: e.prices, at: e.at}, nil
		}
		if now.Before(p.billing.retryAt[key]) {
			v := catalogView{note: p.billing.note[key]}
			if e != nil {
				v.prices, v.at = e.prices, e.at
			}
			p.mu.Unlock()
			return v, nil
		}
		ch, busy := p.billing.inflight[key]
		if !busy {
			ch = make(chan struct{})
			p.billing.inflight[key] = ch
			go p.refreshCatalog(context.WithoutCancel(ctx), c, key, now, ch)
		}
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return catalogView{}, ctx.Err()
		}
	}
	// Unreachable in practice: a finished read leaves either a fresh entry
	// or a retry pause. Price from what there is.
	p.mu.Lock()
	defer p.mu.Unlock()
	v := catalogView{note: p.billing.note[key]}
	if e := p.billing.entries[key]; e != nil {
		v.prices, v.at = e.prices, e.at
	}
	return v, nil
}

// refreshCatalog reads the catalog and records the result: the rates, or
// the reason and the time before which not to ask again. Closing done
// wakes the callers waiting for it.
func (p *Provider) refreshCatalog(ctx context.Context, c *config, key string, started time.Time, done chan struct{}) {
	ctx, cancel := context.WithTimeout(ctx, catalogReadTimeout)
	defer cancel()
	prices, err := p.readCatalog(ctx, c)
	p.mu.Lock()
	defer p.mu.Unlock()
	defer close(done)
	delete(p.billing.inflight, key)
	if err != nil {
		p.billing.retryAt[key] = started.Add(p.opts.PriceRetry)
		p.billing.note[key] = billingNote(err)
		return
	}
	p.billing.entries[key] = &catalogEntry{prices: prices, at: started}
	delete(p.billing.retryAt, key)
	delete(p.billing.note, key)
}

// billingNote says in a few words why the catalog gave no answer: the
// error's reason (SERVICE_DISABLED when the Cloud Billing API is off in the
// credentials' project, API_KEY_INVALID), else its HTTP status, else
// "unreachable".
func billingNote(err error) string {
	var nc *noCredentialsError
	if errors.As(err, &nc) {
		return SourceCatalog + ": no credentials"
	}
	var ae *apierror.APIError
	if errors.As(err, &ae) && ae.Reason() != "" {
		return SourceCatalog + ": " + ae.Reason()
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return fmt.Sprintf("%s: HTTP %d %s", SourceCatalog, ge.Code, strings.ToUpper(strings.ReplaceAll(http.StatusText(ge.Code), " ", "_")))
	}
	return SourceCatalog + " unreachable"
}
