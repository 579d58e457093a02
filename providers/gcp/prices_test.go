package gcp_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"
	"google.golang.org/api/option"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/gcp"
	"github.com/fleetd/fleetd/providers/gcp/fakebilling"
	"github.com/fleetd/fleetd/providers/gcp/fakegce"
	"github.com/fleetd/fleetd/providers/providertest"
)

// Rates of the fake catalog, USD per vCPU-hour, GiB-hour or GPU-hour.
const (
	a2CoreOD, a2RamOD, a2CoreSpot, a2RamSpot = 0.031611, 0.004237, 0.0094833, 0.0012711
	a100OD, a100Spot                         = 2.933908, 1.1736
	n1CoreOD, n1RamOD, n1CoreSpot, n1RamSpot = 0.031611, 0.004237, 0.00698, 0.000936
	t4OD, t4Spot                             = 0.35, 0.14
	g2CoreOD, g2RamOD, g2CoreSpot, g2RamSpot = 0.024988, 0.002927, 0.0099952, 0.0011708
	l4OD, l4Spot                             = 0.56004, 0.224
)

var americas = []string{"us-central1", "us-east1", "us-west1"}

// newBilling starts a fake Cloud Billing Catalog holding Compute Engine
// SKUs as the real catalog names them: the A2, N1 and G2 series and the
// A100, T4 and L4 GPUs in the Americas regions, plus SKUs fleetd must
// skip (commitments, custom and sole-tenant types, DWS, local SSD,
// egress, licences), in pages of 7.
func newBilling(t *testing.T, opts fakebilling.Options) *fakebilling.Server {
	t.Helper()
	if opts.MaxPageSize == 0 {
		opts.MaxPageSize = 7
	}
	fb := fakebilling.New(opts)
	t.Cleanup(fb.Close)
	// Noise first, so pages mix kept and skipped SKUs.
	fb.Add("Commitment v1: A2 Cpu in Americas for 1 Year", "Compute", "CPU", "Commit1Yr", americas, fakebilling.Hour, 0.019915)
	fb.Add("Custom Instance Core running in Americas", "Compute", "CPU", "OnDemand", americas, fakebilling.Hour, 0.033174)
	fb.Add("Sole Tenancy Instance Core running in Americas", "Compute", "CPU", "OnDemand", americas, fakebilling.Hour, 0.034773)
	fb.Add("Nvidia Tesla A100 GPU running in Americas for DWS Defined Duration", "Compute", "GPU", "OnDemand", americas, fakebilling.Hour, 1.8)
	fb.Add("SSD backed Local Storage running in Americas", "Storage", "LocalSSD", "OnDemand", americas, fakebilling.GiBMonth, 0.08)
	fb.Add("Network Internet Egress from Americas to Americas", "Network", "PremiumInternetEgress", "OnDemand", americas, fakebilling.GiBTraffic, 0.12)
	fb.Add("Licensing Fee for Windows Server 2019 Datacenter Edition (CPU cost)", "License", "Google", "OnDemand", []string{"global"}, fakebilling.Hour, 0.046)
	fb.AddSeries("A2 Instance", "Americas", americas, a2CoreOD, a2RamOD, a2CoreSpot, a2RamSpot)
	fb.AddSeries("N1 Predefined Instance", "Americas", americas, n1CoreOD, n1RamOD, n1CoreSpot, n1RamSpot)
	fb.AddSeries("G2 Instance", "Americas", americas, g2CoreOD, g2RamOD, g2CoreSpot, g2RamSpot)
	fb.AddGPU("Nvidia Tesla A100", "Americas", americas, a100OD, a100Spot)
	fb.AddGPU("Nvidia Tesla T4", "Americas", americas, t4OD, t4Spot)
	fb.AddGPU("Nvidia L4", "Americas", americas, l4OD, l4Spot)
	return fb
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock                { return &clock{now: time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)} }
func (c *clock) Now() time.Time       { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration)  { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }
func (c *clock) options() gcp.Options { return gcp.Options{PollInterval: testPoll, Now: c.Now} }

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// bundled is the bundled table's price of a machine type in us-central1.
func bundled(t *testing.T, typ string, ct providers.CapacityType) float64 {
	t.Helper()
	_, cfg := newFake(t, fakegce.Options{}, map[string]any{"machine_types": []string{typ}, "accelerators": nil})
	return offering(t, newProvider(), cfg, "us-central1-a", typ, ct).PricePerHour
}

// TestOfferingsFromCatalog: through the real Cloud Billing client, the
// offerings' prices are composed from the catalog's SKUs (every page
// read, the other SKUs skipped), dated when the catalog was read.
func TestOfferingsFromCatalog(t *testing.T) {
	fb := newBilling(t, fakebilling.Options{})
	clk := newClock()
	p := gcp.New(clk.options())
	_, cfg := newFake(t, fakegce.Options{}, map[string]any{"billing_endpoint": fb.URL})
	offs, err := p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	pages := (fb.Len() + 6) / 7
	if fb.Calls() != pages {
		t.Errorf("%d skus.list calls, want %d (every page of %d SKUs, once)", fb.Calls(), pages, fb.Len())
	}
	last := fb.Last()
	if last.Path != "/v1/services/6F81-5844-456A/skus" || last.Query["currencyCode"] != "USD" || last.Query["pageToken"] == "" ||
		!strings.HasPrefix(last.Query["fields"], "nextPageToken,skus(") {
		t.Errorf("last call %+v: want the Compute Engine SKUs in USD, a later page, a partial response", last)
	}
	want := map[string]float64{
		"a2-highgpu-1g/on-demand": 12*a2CoreOD + 85*a2RamOD + a100OD,
		"a2-highgpu-1g/spot":      12*a2CoreSpot + 85*a2RamSpot + a100Spot,
		"g2-standard-8/on-demand": 8*g2CoreOD + 32*g2RamOD + l4OD,
		"g2-standard-8/spot":      8*g2CoreSpot + 32*g2RamSpot + l4Spot,
		"n1-standard-8/on-demand": 8*n1CoreOD + 30*n1RamOD + t4OD, // + the block's 1 × T4
		"n1-standard-8/spot":      8*n1CoreSpot + 30*n1RamSpot + t4Spot,
	}
	if len(offs) != 2*len(want) {
		t.Errorf("%d offerings, want %d", len(offs), 2*len(want))
	}
	for _, o := range offs {
		key := o.InstanceType + "/" + string(o.CapacityType)
		if !near(o.PricePerHour, want[key]) || o.PriceSource != gcp.SourceCatalog || !o.PriceAsOf.Equal(clk.Now()) {
			t.Errorf("%s in %s: $%v from %q as of %v; want $%v from %q as of %v", key, o.Zone, o.PricePerHour, o.PriceSource, o.PriceAsOf, want[key], gcp.SourceCatalog, clk.Now())
		}
	}
	// The next call within the TTL reads nothing.
	if _, err := p.Offerings(ctxT(t), cfg); err != nil || fb.Calls() != pages {
		t.Errorf("second Offerings: %v, %d calls, want %d", err, fb.Calls(), pages)
	}
}

// TestCatalogFallback: when the catalog is denied or unreachable,
// offerings are priced from the bundled table, dated PriceTableDate, and
// the source says why; the API is asked again only after PriceRetry.
func TestCatalogFallback(t *testing.T) {
	cases := []struct {
		name  string
		setup func(fb *fakebilling.Server) (endpoint string)
		opts  func(o *gcp.Options)
		note  string
		calls int
	}{
		{name: "API disabled in the project (403)", note: gcp.SourceCatalog + ": SERVICE_DISABLED", calls: 1,
			setup: func(fb *fakebilling.Server) string { fb.SetDisabled(true); return fb.URL },
			opts:  func(o *gcp.Options) { o.BillingAPIKey = "right" }},
		{name: "permission denied (403)", note: gcp.SourceCatalog + ": IAM_PERMISSION_DENIED", calls: 1,
			setup: func(fb *fakebilling.Server) string {
				fb.Fail(100, 403, "PERMISSION_DENIED", "IAM_PERMISSION_DENIED", "Permission denied")
				return fb.URL
			}},
		{name: "no credentials for a catalog that needs them", note: gcp.SourceCatalog + ": HTTP 403 FORBIDDEN", calls: 1,
			setup: func(fb *fakebilling.Server) string { return fb.URL }},
		{name: "wrong API key", note: gcp.SourceCatalog + ": API_KEY_INVALID", calls: 1,
			setup: func(fb *fakebilling.Server) string { return fb.URL },
			opts:  func(o *gcp.Options) { o.BillingAPIKey = "wrong" }},
		{name: "unreachable", note: gcp.SourceCatalog + " unreachable", calls: 0,
			setup: func(fb *fakebilling.Server) string { u := fb.URL; fb.Close(); return u }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fb := newBilling(t, fakebilling.Options{APIKey: "right", Token: "tok"})
			endpoint := tc.setup(fb)
			clk := newClock()
			o := clk.options()
			if tc.opts != nil {
				tc.opts(&o)
			}
			p := gcp.New(o)
			_, cfg := newFake(t, fakegce.Options{}, map[string]any{"billing_endpoint": endpoint, "machine_types": []string{"a2-highgpu-1g"}})
			for range 2 {
				off := offering(t, p, cfg, "us-central1-a", "a2-highgpu-1g", providers.Spot)
				src := gcp.SourceBundled + " (" + tc.note + ")"
				if off.PriceSource != src || !off.PriceAsOf.Equal(gcp.BundledPricesAsOf) || !near(off.PricePerHour, bundled(t, "a2-highgpu-1g", providers.Spot)) {
					t.Errorf("spot a2-highgpu-1g: $%v from %q as of %v; want the bundled price from %q as of %v", off.PricePerHour, off.PriceSource, off.PriceAsOf, src, gcp.BundledPricesAsOf)
				}
			}
			if tc.calls > 0 && fb.Calls() != tc.calls {
				t.Errorf("%d skus.list calls, want %d: a failure pauses the API", fb.Calls(), tc.calls)
			}
		})
	}
}

// TestCatalogCredentials: the catalog is read with an API key (the `key`
// parameter) or OAuth (a bearer token), as the real client sends them.
func TestCatalogCredentials(t *testing.T) {
	cases := []struct {
		name       string
		opts       gcp.Options
		key, token string
	}{
		{name: "API key", opts: gcp.Options{BillingAPIKey: "AIza-test"}, key: "AIza-test"},
		{name: "OAuth", opts: gcp.Options{BillingClientOptions: []option.ClientOption{option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "ya29.test", TokenType: "Bearer"}))}}, token: "ya29.test"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fb := newBilling(t, fakebilling.Options{APIKey: "AIza-test", Token: "ya29.test"})
			tc.opts.PollInterval = testPoll
			p := gcp.New(tc.opts)
			_, cfg := newFake(t, fakegce.Options{}, map[string]any{"billing_endpoint": fb.URL})
			off := offering(t, p, cfg, "us-central1-a", "g2-standard-8", providers.OnDemand)
			if off.PriceSource != gcp.SourceCatalog {
				t.Errorf("price from %q, want %q", off.PriceSource, gcp.SourceCatalog)
			}
			if last := fb.Last(); last.APIKey != tc.key || last.Bearer != tc.token {
				t.Errorf("the fake saw key %q and bearer %q, want %q and %q", last.APIKey, last.Bearer, tc.key, tc.token)
			}
		})
	}
}

// TestCatalogCache: a read is reused for PriceTTL; after a failure past
// the TTL the stale read is kept (its date shows its age) and the API
// paused for PriceRetry; a block with a plain-http Compute endpoint and
// no billing_endpoint never asks.
func TestCatalogCache(t *testing.T) {
	fb := newBilling(t, fakebilling.Options{MaxPageSize: 5000})
	clk := newClock()
	p := gcp.New(clk.options())
	_, cfg := newFake(t, fakegce.Options{}, map[string]any{"billing_endpoint": fb.URL, "machine_types": []string{"g2-standard-8"}})
	read := clk.Now()
	l4 := "Nvidia L4 GPU running in Americas"
	steps := []struct {
		name    string
		advance time.Duration
		act     func()
		l4      float64
		asOf    func() time.Time
		calls   int
	}{
		{name: "first read", l4: l4OD, calls: 1},
		{name: "within the TTL", advance: gcp.DefaultPriceTTL - time.Minute, act: func() { fb.Reprice(l4, 0.5) }, l4: l4OD, calls: 1},
		{name: "after the TTL", advance: 2 * time.Minute, act: func() { read = clk.Now() }, l4: 0.5, calls: 2},
		{name: "failing: the stale read is kept", advance: gcp.DefaultPriceTTL + time.Minute,
			act: func() { fb.Fail(100, 503, "UNAVAILABLE", "", "The service is currently unavailable.") }, l4: 0.5, calls: 3},
		{name: "paused", advance: time.Minute, l4: 0.5, calls: 3},
		{name: "asked again after the pause", advance: gcp.DefaultPriceRetry, act: func() { fb.Recover(); fb.Reprice(l4, 0.55); read = clk.Now() }, l4: 0.55, calls: 4},
	}
	for _, st := range steps {
		clk.Add(st.advance)
		if st.act != nil {
			st.act()
		}
		o := offering(t, p, cfg, "us-central1-a", "g2-standard-8", providers.OnDemand)
		want := 8*g2CoreOD + 32*g2RamOD + st.l4
		if !near(o.PricePerHour, want) || o.PriceSource != gcp.SourceCatalog || !o.PriceAsOf.Equal(read) || fb.Calls() != st.calls {
			t.Errorf("%s: $%v from %q as of %v after %d calls; want $%v from %q as of %v after %d", st.name,
				o.PricePerHour, o.PriceSource, o.PriceAsOf, fb.Calls(), want, gcp.SourceCatalog, read, st.calls)
		}
	}

	// No billing_endpoint and a fake Compute endpoint: the bundled table,
	// with no reason given, and no call.
	calls := fb.Calls()
	_, local := newFake(t, fakegce.Options{}, map[string]any{"machine_types": []string{"g2-standard-8"}})
	if o := offering(t, p, local, "us-central1-a", "g2-standard-8", providers.OnDemand); o.PriceSource != gcp.SourceBundled || fb.Calls() != calls {
		t.Errorf("local block: price from %q after %d calls, want %q and no call", o.PriceSource, fb.Calls()-calls, gcp.SourceBundled)
	}
}

// TestCatalogOverride: the block's prices still win over the catalog,
// per capacity type, and name their source.
func TestCatalogOverride(t *testing.T) {
	fb := newBilling(t, fakebilling.Options{})
	p := gcp.New(newClock().options())
	_, cfg := newFake(t, fakegce.Options{}, map[string]any{"billing_endpoint": fb.URL, "machine_types": []string{"a2-highgpu-1g"},
		"prices": map[string]any{"a2-highgpu-1g/us-central1": map[string]any{"spot": 0.9}}})
	spot := offering(t, p, cfg, "us-central1-a", "a2-highgpu-1g", providers.Spot)
	od := offering(t, p, cfg, "us-central1-a", "a2-highgpu-1g", providers.OnDemand)
	if spot.PricePerHour != 0.9 || spot.PriceSource != gcp.SourceOverride || !spot.PriceAsOf.IsZero() {
		t.Errorf("spot %+v, want the override", spot)
	}
	if od.PriceSource != gcp.SourceCatalog || !strings.Contains(od.PriceSource, "Catalog") {
		t.Errorf("on-demand from %q, want the catalog", od.PriceSource)
	}
}

// TestCheckPrices: the `prices` row of the preflight says whether the
// catalog can be read with the provider's credentials; when it cannot,
// the row is unavailable (fleetd prices from the bundled table, whose
// date it gives) and the fix names the API to enable or the key to fix.
func TestCheckPrices(t *testing.T) {
	cases := []struct {
		name        string
		setup       func(fb *fakebilling.Server) (extra map[string]any)
		opts        gcp.Options
		quick       bool
		status      providers.CheckStatus // "" = no row
		detail, fix string
	}{
		{name: "readable", status: providers.CheckOK, detail: "on-demand and Spot prices come from it (read every 24h0m0s)",
			setup: func(fb *fakebilling.Server) map[string]any { return map[string]any{"billing_endpoint": fb.URL} }},
		{name: "API disabled", opts: gcp.Options{BillingAPIKey: "k"}, status: providers.CheckUnavailable,
			detail: "answered 403 SERVICE_DISABLED: Cloud Billing API has not been used in project 123456789012", fix: "gcloud services enable cloudbilling.googleapis.com --project fleetd-test",
			setup: func(fb *fakebilling.Server) map[string]any {
				fb.SetDisabled(true)
				return map[string]any{"billing_endpoint": fb.URL}
			}},
		{name: "no credentials", status: providers.CheckUnavailable, detail: "answered 403: Method doesn't allow unregistered callers", fix: "FLEETD_GCP_BILLING_API_KEY",
			setup: func(fb *fakebilling.Server) map[string]any {
				return map[string]any{"billing_endpoint": fb.URL}
			}},
		{name: "unreachable", status: providers.CheckUnavailable, detail: "no answer from the Cloud Billing Catalog", fix: "check network access to http://",
			setup: func(fb *fakebilling.Server) map[string]any {
				u := fb.URL
				fb.Close()
				return map[string]any{"billing_endpoint": u}
			}},
		{name: "local block reads no catalog", setup: func(*fakebilling.Server) map[string]any { return nil }},
		{name: "quick check", quick: true, setup: func(fb *fakebilling.Server) map[string]any { return map[string]any{"billing_endpoint": fb.URL} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fb := newBilling(t, fakebilling.Options{APIKey: "k"})
			if tc.name == "readable" {
				tc.opts.BillingAPIKey = "k"
			}
			extra := tc.setup(fb)
			_, cfg := newFake(t, fakegce.Options{}, extra)
			tc.opts.PollInterval = testPoll
			rs, err := gcp.New(tc.opts).Check(ctxT(t), cfg, providers.CheckOptions{Quick: tc.quick})
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(rs, func(r providers.CheckResult) bool { return r.Check == "prices" })
			if tc.status == "" {
				if i >= 0 {
					t.Errorf("unexpected prices row %+v", rs[i])
				}
				return
			}
			if i != len(rs)-1 {
				t.Fatalf("prices row at %d of %d, want last:\n%s", i, len(rs), formatReport(rs))
			}
			r := rs[i]
			if r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) || !strings.Contains(r.Fix, tc.fix) {
				t.Errorf("prices row %s %q fix %q; want %s with %q, fix with %q", r.Status, r.Detail, r.Fix, tc.status, tc.detail, tc.fix)
			}
			if r.Status != providers.CheckOK && !strings.Contains(r.Detail, "bundled table dated "+gcp.PriceTableDate) {
				t.Errorf("prices row %q does not give the fallback's date", r.Detail)
			}
		})
	}
}

// TestCatalogPricesOverGRPC: through the plugin transport, as the daemon
// runs the provider, offerings keep their catalog price, source and date.
func TestCatalogPricesOverGRPC(t *testing.T) {
	fb := newBilling(t, fakebilling.Options{})
	_, cfg := newFake(t, fakegce.Options{}, map[string]any{"billing_endpoint": fb.URL, "machine_types": []string{"a2-highgpu-1g"}})
	p, err := providertest.NewPluginManager(t, []string{gcp.Name}, nil).Get(ctxT(t), gcp.Name)
	if err != nil {
		t.Fatalf("start plugin: %v", err)
	}
	before := time.Now().Add(-time.Second)
	offs, err := p.Offerings(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range offs {
		want := 12*a2CoreOD + 85*a2RamOD + a100OD
		if o.CapacityType == providers.Spot {
			want = 12*a2CoreSpot + 85*a2RamSpot + a100Spot
		}
		if !near(o.PricePerHour, want) || o.PriceSource != gcp.SourceCatalog || o.PriceAsOf.Before(before) || o.PriceAsOf.After(time.Now()) {
			t.Errorf("%s %s over gRPC: $%v from %q as of %v; want $%v from the catalog, dated now", o.InstanceType, o.CapacityType, o.PricePerHour, o.PriceSource, o.PriceAsOf, want)
		}
	}
}

// TestCatalogReadShared: concurrent Offerings calls share one catalog read.
func TestCatalogReadShared(t *testing.T) {
	fb := newBilling(t, fakebilling.Options{})
	p := gcp.New(newClock().options())
	_, cfg := newFake(t, fakegce.Options{}, map[string]any{"billing_endpoint": fb.URL, "machine_types": []string{"g2-standard-8"}})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			offs, err := p.Offerings(ctxT(t), cfg)
			if err == nil && (len(offs) == 0 || offs[0].PriceSource != gcp.SourceCatalog) {
				err = fmt.Errorf("offerings %+v not from the catalog", offs)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if pages := (fb.Len() + 6) / 7; fb.Calls() != pages {
		t.Errorf("%d skus.list calls for 8 concurrent Offerings, want %d (one read)", fb.Calls(), pages)
	}
}
