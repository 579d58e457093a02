package aws_test

import (
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakepricing"
)

// newPricing starts a fake Price List API with g5.xlarge priced in both
// test regions (and a Windows product the filters must skip); p4d.24xlarge
// is not in it, so it falls back to the bundled table.
func newPricing(t *testing.T) (*fakepricing.Server, string) {
	t.Helper()
	fp := fakepricing.New()
	fp.AddEC2("us-east-1", "g5.xlarge", "1.0100000000")
	fp.AddEC2("us-east-1", "g5.xlarge", "1.8500000000", "operatingSystem", "Windows", "operation", "RunInstances:0002")
	fp.AddEC2("us-west-2", "g5.xlarge", "1.0300000000")
	ts := httptest.NewServer(fp)
	t.Cleanup(ts.Close)
	return fp, ts.URL
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time       { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration)  { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }
func newClock() *clock                { return &clock{now: time.Now().UTC().Truncate(time.Second)} }
func (c *clock) options() aws.Options { o := testOptions(); o.Now = c.Now; return o }

func TestOnDemandPriceSources(t *testing.T) {
	bundledDate := time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		setup     func(fp *fakepricing.Server)
		block     func(b map[string]any) map[string]any
		zone      string
		typ       string
		price     float64
		source    string // prefix
		fromClock bool   // PriceAsOf is the fetch time
		asOf      time.Time
		calls     int // Price List calls of the first Offerings call
	}{
		{name: "price list", zone: "us-east-1a", typ: "g5.xlarge", price: 1.01, source: aws.SourcePriceList, fromClock: true, calls: 4},
		{name: "price list other region", zone: "us-west-2a", typ: "g5.xlarge", price: 1.03, source: aws.SourcePriceList, fromClock: true, calls: 4},
		{name: "not in price list: bundled", zone: "us-east-1a", typ: "p4d.24xlarge", price: 32.7726, source: aws.SourceBundled, asOf: bundledDate, calls: 4},
		{name: "override wins", zone: "us-east-1a", typ: "g5.xlarge", price: 0.5, source: aws.SourceOverride, calls: 2,
			block: func(b map[string]any) map[string]any {
				return with(b, "on_demand_prices", map[string]float64{"g5.xlarge": 0.5})
			}},
		{name: "denied: bundled, says why", zone: "us-east-1a", typ: "g5.xlarge", price: 1.006,
			source: aws.SourceBundled + " (" + aws.SourcePriceList + ": AccessDeniedException)", asOf: bundledDate, calls: 1,
			setup: func(fp *fakepricing.Server) {
				fp.Fail(100, 400, "AccessDeniedException", "User is not authorized to perform: pricing:GetProducts")
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, url := newFake(t)
			fp, purl := newPricing(t)
			if tt.setup != nil {
				tt.setup(fp)
			}
			clk := newClock()
			p := aws.New(clk.options())
			b := with(baseBlock(url), "pricing_endpoint", purl)
			if tt.block != nil {
				b = tt.block(b)
			}
			offs, err := p.Offerings(ctxT(t), config(t, "f", b))
			if err != nil {
				t.Fatal(err)
			}
			o := find(t, offs, tt.zone, tt.typ, providers.OnDemand)
			want := tt.asOf
			if tt.fromClock {
				want = clk.Now()
			}
			if !approx(o.PricePerHour, tt.price) || !strings.HasPrefix(o.PriceSource, tt.source) || !o.PriceAsOf.Equal(want) {
				t.Errorf("on-demand %s in %s: price %v from %q as of %v, want %v from %q as of %v",
					tt.typ, tt.zone, o.PricePerHour, o.PriceSource, o.PriceAsOf, tt.price, tt.source, want)
			}
			// A denial pauses the API for the block's scope: one failed call.
			if got := fp.Calls(); got != tt.calls {
				t.Errorf("%d Price List calls, want %d", got, tt.calls)
			}
			s := find(t, offs, tt.zone, tt.typ, providers.Spot)
			if s.PriceSource != aws.SourceSpotHistory || s.PriceAsOf.IsZero() {
				t.Errorf("spot offering price from %q as of %v, want %q with the entry's time", s.PriceSource, s.PriceAsOf, aws.SourceSpotHistory)
			}
		})
	}
}

func TestOnDemandPriceFilters(t *testing.T) {
	_, url := newFake(t)
	fp, purl := newPricing(t)
	p := aws.New(testOptions())
	cfg := config(t, "f", with(baseBlock(url), "pricing_endpoint", purl, "regions", []string{"us-east-1"}, "instance_types", []string{"g5.xlarge"}))
	if _, err := p.Offerings(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range fp.LastFilters() {
		if f.Type != "TERM_MATCH" {
			t.Errorf("filter %+v is not TERM_MATCH", f)
		}
		got[f.Field] = f.Value
	}
	want := map[string]string{"instanceType": "g5.xlarge", "regionCode": "us-east-1", "operatingSystem": "Linux",
		"tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("filter %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

// TestOnDemandPriceCache: answers are reused for OnDemandPriceTTL, a
// failure pauses the API for OnDemandPriceRetry, during which a stale
// answer beats the bundled table.
func TestOnDemandPriceCache(t *testing.T) {
	_, url := newFake(t)
	fp, purl := newPricing(t)
	clk := newClock()
	p := aws.New(clk.options())
	cfg := config(t, "f", with(baseBlock(url), "pricing_endpoint", purl, "regions", []string{"us-east-1"}))
	odPrice := func() providers.Offering {
		t.Helper()
		offs, err := p.Offerings(ctxT(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return find(t, offs, "us-east-1a", "g5.xlarge", providers.OnDemand)
	}
	steps := []struct {
		name    string
		advance time.Duration
		act     func()
		price   float64
		source  string
		calls   int // total Price List calls after the step
	}{
		{name: "first fetch", price: 1.01, source: aws.SourcePriceList, calls: 2},
		{name: "within TTL", advance: aws.DefaultOnDemandPriceTTL - time.Minute, act: func() { fp.AddEC2("us-east-1", "g5.xlarge", "0.9000000000") },
			price: 1.01, source: aws.SourcePriceList, calls: 2},
		{name: "after TTL", advance: 2 * time.Minute, price: 0.9, source: aws.SourcePriceList, calls: 4},
		{name: "failing: stale answer kept", advance: aws.DefaultOnDemandPriceTTL + time.Minute,
			act:   func() { fp.Fail(100, 503, "ServiceUnavailableException", "down") },
			price: 0.9, source: aws.SourcePriceList, calls: 7}, // the SDK tries a 503 3 times
		{name: "paused", advance: time.Minute, price: 0.9, source: aws.SourcePriceList, calls: 7},
		{name: "retried after the pause", advance: aws.DefaultOnDemandPriceRetry, act: fp.Recover,
			price: 0.9, source: aws.SourcePriceList, calls: 9},
	}
	for _, st := range steps {
		clk.Add(st.advance)
		if st.act != nil {
			st.act()
		}
		o := odPrice()
		if !approx(o.PricePerHour, st.price) || o.PriceSource != st.source || fp.Calls() != st.calls {
			t.Errorf("%s: price %v from %q after %d calls, want %v from %q after %d", st.name, o.PricePerHour, o.PriceSource, fp.Calls(), st.price, st.source, st.calls)
		}
	}
}

// TestOnDemandPriceLocalEndpoint: a block aimed at a plain-http EC2
// endpoint without pricing_endpoint never asks the real Price List API.
func TestOnDemandPriceLocalEndpoint(t *testing.T) {
	_, url := newFake(t)
	p := aws.New(testOptions())
	offs, err := p.Offerings(ctxT(t), config(t, "f", baseBlock(url)))
	if err != nil {
		t.Fatal(err)
	}
	if o := find(t, offs, "us-east-1a", "g5.xlarge", providers.OnDemand); o.PriceSource != aws.SourceBundled || !approx(o.PricePerHour, 1.006) {
		t.Errorf("on-demand %+v, want the bundled price", o)
	}
}

// TestCheckPricing: the preflight's pricing:GetProducts row is ok when the
// Price List API answers, and unavailable (on-demand prices then come from
// the dated bundled table) when it is denied or does not answer; a block
// that never asks the API, and the quick check, get no row.
func TestCheckPricing(t *testing.T) {
	cases := []struct {
		name        string
		quick       bool
		setup       func(fp *fakepricing.Server, purl string) (pricingEndpoint string)
		status      providers.CheckStatus // "" = no row
		detail, fix string
	}{
		{name: "allowed", status: providers.CheckOK, detail: "allowed: on-demand prices come from the AWS Price List API (cached 24h0m0s)"},
		{name: "denied", status: providers.CheckUnavailable, detail: "denied (AccessDeniedException): on-demand prices come from the bundled table dated 2024-06-01",
			fix: "allow pricing:GetProducts", setup: func(fp *fakepricing.Server, purl string) string {
				fp.Fail(1, 400, "AccessDeniedException", "User is not authorized to perform: pricing:GetProducts")
				return purl
			}},
		{name: "no answer", status: providers.CheckUnavailable, detail: "did not answer", fix: "check network access",
			setup: func(_ *fakepricing.Server, purl string) string {
				ts := httptest.NewServer(nil)
				ts.Close()
				return ts.URL
			}},
		{name: "local endpoint, no pricing_endpoint", setup: func(*fakepricing.Server, string) string { return "" }},
		{name: "quick", quick: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, url := newFake(t)
			fp, purl := newPricing(t)
			if tc.setup != nil {
				purl = tc.setup(fp, purl)
			}
			b := baseBlock(url)
			if purl != "" {
				b = with(b, "pricing_endpoint", purl)
			}
			rs, err := aws.New(testOptions()).Check(ctxT(t), config(t, "f", b), providers.CheckOptions{Quick: tc.quick})
			if err != nil {
				t.Fatal(err)
			}
			var row *providers.CheckResult
			for i := range rs {
				if rs[i].Check == "pricing:GetProducts" {
					row = &rs[i]
				}
			}
			switch {
			case tc.status == "" && row != nil:
				t.Errorf("unexpected row %+v", *row)
			case tc.status == "":
			case row == nil:
				t.Errorf("no pricing:GetProducts row in\n%s", dumpRows(rs))
			case row.Status != tc.status || !strings.Contains(row.Detail, tc.detail) || !strings.Contains(row.Fix, tc.fix):
				t.Errorf("row %s %q fix %q; want %s with %q, fix with %q", row.Status, row.Detail, row.Fix, tc.status, tc.detail, tc.fix)
			}
		})
	}
}
