package gcp

import (
	"math"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/fleetd/fleetd/providers"
	cloudbilling "google.golang.org/api/cloudbilling/v1"
	"google.golang.org/protobuf/proto"
)

// TestClassifySKU: the SKU descriptions of the real catalog (as listed by
// the Cloud Billing Catalog API for services/6F81-5844-456A) map to the
// components fleetd composes prices from, and everything else is left out.
func TestClassifySKU(t *testing.T) {
	cases := []struct {
		desc, family, usage, unit string
		want                      skuKey
		ok                        bool
	}{
		{"N1 Predefined Instance Core running in Americas", "Compute", "OnDemand", "h", skuKey{"N1 Predefined Instance", "Core", false}, true},
		{"N1 Predefined Instance Ram running in Americas", "Compute", "OnDemand", "GiBy.h", skuKey{"N1 Predefined Instance", "Ram", false}, true},
		{"Spot Preemptible N1 Predefined Instance Core running in Americas", "Compute", "Preemptible", "h", skuKey{"N1 Predefined Instance", "Core", true}, true},
		{"Preemptible N1 Predefined Instance Ram running in Netherlands", "Compute", "Preemptible", "GiBy.h", skuKey{"N1 Predefined Instance", "Ram", true}, true},
		{"A2 Instance Core running in Americas", "Compute", "OnDemand", "h", skuKey{"A2 Instance", "Core", false}, true},
		{"Spot Preemptible A3 Instance Ram running in Americas", "Compute", "Preemptible", "GiBy.h", skuKey{"A3 Instance", "Ram", true}, true},
		{"G2 Instance Core running in Northern Virginia", "Compute", "OnDemand", "h", skuKey{"G2 Instance", "Core", false}, true},
		{"Nvidia Tesla T4 GPU running in Americas", "Compute", "OnDemand", "h", skuKey{"Nvidia Tesla T4", "GPU", false}, true},
		{"Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas", "Compute", "Preemptible", "h", skuKey{"Nvidia Tesla T4", "GPU", true}, true},
		{"Nvidia Tesla A100 80GB GPU running in Belgium", "Compute", "OnDemand", "h", skuKey{"Nvidia Tesla A100 80GB", "GPU", false}, true},
		{"Nvidia H100 80GB Mega GPU attached to Spot Preemptible VMs running in Americas", "Compute", "Preemptible", "h", skuKey{"Nvidia H100 80GB Mega", "GPU", true}, true},
		{"Nvidia L4 GPU running in Sao Paulo", "Compute", "OnDemand", "h", skuKey{"Nvidia L4", "GPU", false}, true},
		// Left out.
		{"Commitment v1: A2 Cpu in Americas for 1 Year", "Compute", "Commit1Yr", "h", skuKey{}, false},
		{"Custom Instance Core running in Americas", "Compute", "OnDemand", "h", skuKey{"Custom Instance", "Core", false}, true}, // no series maps to it
		{"Reserved A2 Instance Core running in Americas", "Compute", "OnDemand", "h", skuKey{"Reserved A2 Instance", "Core", false}, true},
		{"Nvidia H100 80GB GPU running in Americas for DWS Defined Duration", "Compute", "OnDemand", "h", skuKey{}, false},
		{"A3 Instance Core running in Americas (DWS)", "Compute", "OnDemand", "h", skuKey{}, false},
		{"SSD backed Local Storage running in Americas", "Storage", "OnDemand", "GiBy.mo", skuKey{}, false},
		{"Network Vpn Internet Egress from Americas to Africa", "Network", "OnDemand", "GiBy", skuKey{}, false},
		{"A2 Instance Ram running in Americas", "Compute", "OnDemand", "GiBy.mo", skuKey{}, false},                                               // not per hour
		{"Spot Preemptible A2 Instance Core running in Americas", "Compute", "OnDemand", "h", skuKey{}, false},                                   // usage type disagrees
		{"N1 Predefined Instance Core running in Americas", "Compute", "Preemptible", "h", skuKey{"N1 Predefined Instance", "Core", true}, true}, // as labelled
		{"Licensing Fee for Windows Server 2019 Datacenter Edition on VM with 8 VCPU", "License", "OnDemand", "h", skuKey{}, false},
	}
	for _, tc := range cases {
		got, ok := classifySKU(tc.desc, tc.family, tc.usage, tc.unit)
		if ok != tc.ok || got != tc.want {
			t.Errorf("classifySKU(%q, %s, %s, %s) = %+v, %v; want %+v, %v", tc.desc, tc.family, tc.usage, tc.unit, got, ok, tc.want, tc.ok)
		}
	}
	// The left-out names never price a machine: no series or GPU maps to them.
	for _, name := range []string{"Custom Instance", "Reserved A2 Instance"} {
		for _, s := range seriesSKU {
			if s == name {
				t.Errorf("series SKU %q would pick up %q SKUs", s, name)
			}
		}
	}
}

func TestUnitPrice(t *testing.T) {
	pi := func(units int64, nanos int64, cur string) *cloudbilling.PricingInfo {
		return &cloudbilling.PricingInfo{PricingExpression: &cloudbilling.PricingExpression{UsageUnit: "h",
			TieredRates: []*cloudbilling.TierRate{{UnitPrice: &cloudbilling.Money{Units: units, Nanos: nanos, CurrencyCode: cur}}}}}
	}
	cases := []struct {
		name string
		pis  []*cloudbilling.PricingInfo
		want float64
		ok   bool
	}{
		{"nanos only", []*cloudbilling.PricingInfo{pi(0, 31611000, "USD")}, 0.031611, true},
		{"units and nanos", []*cloudbilling.PricingInfo{pi(2, 933908000, "USD")}, 2.933908, true},
		{"latest of the timeline", []*cloudbilling.PricingInfo{pi(3, 0, "USD"), pi(2, 500000000, "USD")}, 2.5, true},
		{"currency unstated", []*cloudbilling.PricingInfo{pi(1, 0, "")}, 1, true},
		{"other currency", []*cloudbilling.PricingInfo{pi(1, 0, "EUR")}, 0, false},
		{"none", nil, 0, false},
	}
	for _, tc := range cases {
		got, ok := unitPrice(tc.pis)
		if ok != tc.ok || math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// testRates is a catalog in two regions: us-central1 (and us-east1, one
// "Americas" SKU each) and europe-west4.
func testRates() skuPrices {
	sp := skuPrices{}
	am, nl := []string{"us-central1", "us-east1", "us-west1"}, []string{"europe-west4"}
	set := func(name, kind string, regions []string, od, spot float64) {
		sp.add(skuKey{name, kind, false}, regions, od)
		sp.add(skuKey{name, kind, true}, regions, spot)
	}
	set("N1 Predefined Instance", "Core", am, 0.031611, 0.00698)
	set("N1 Predefined Instance", "Ram", am, 0.004237, 0.000936)
	set("A2 Instance", "Core", am, 0.031611, 0.0094833)
	set("A2 Instance", "Ram", am, 0.004237, 0.0012711)
	set("A3 Instance", "Core", am, 0.029563, 0.00586)
	set("A3 Instance", "Ram", am, 0.003963, 0.000511)
	set("G2 Instance", "Core", am, 0.024988, 0.0099952)
	set("G2 Instance", "Ram", am, 0.002927, 0.0011708)
	set("G2 Instance", "Core", nl, 0.027475, 0.01099)
	set("G2 Instance", "Ram", nl, 0.003218, 0.0012872)
	set("Nvidia Tesla A100", "GPU", am, 2.933908, 1.1736)
	set("Nvidia H100 80GB", "GPU", am, 11.06125, 2.253)
	set("Nvidia L4", "GPU", am, 0.56004, 0.224)
	set("Nvidia L4", "GPU", nl, 0.6164, 0.2466)
	set("Nvidia Tesla T4", "GPU", am, 0.35, 0.14)
	// us-east4 has a "Virginia" and a "Northern Virginia" SKU; a
	// multi-region SKU must not beat the region's own.
	set("N1 Predefined Instance", "Core", []string{"us-east4"}, 0.035605, 0.0079)
	sp.add(skuKey{"N1 Predefined Instance", "Core", false}, []string{"us-east4"}, 0.0356)
	sp.add(skuKey{"N1 Predefined Instance", "Core", false}, []string{"us-east4", "us-central1", "us-east1", "us-west1"}, 0.01)
	set("N1 Predefined Instance", "Ram", []string{"us-east4"}, 0.004771, 0.00105)
	return sp
}

func providersConfig(raw string) providers.Config {
	return providers.Config{Fleet: "f", Raw: []byte(raw)}
}

func machineType(name string, cpus int32, memMB int32, accel string, n int32) *computepb.MachineType {
	mt := &computepb.MachineType{Name: proto.String(name), GuestCpus: proto.Int32(cpus), MemoryMb: proto.Int32(memMB)}
	if accel != "" {
		mt.Accelerators = []*computepb.Accelerators{{GuestAcceleratorType: proto.String(accel), GuestAcceleratorCount: proto.Int32(n)}}
	}
	return mt
}

// TestComposePrices: a machine type's price is vCPUs × its series' core
// rate + memory GiB × its RAM rate + its GPUs × their GPU rate, on-demand
// and Spot, per region; N1 adds the block's attached GPUs; what the
// catalog cannot price falls back to the bundled table, and overrides win.
func TestComposePrices(t *testing.T) {
	at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	view := catalogView{prices: testRates(), at: at}
	n1 := machineType("n1-standard-8", 8, 30720, "", 0)
	cases := []struct {
		name    string
		mt      *computepb.MachineType
		block   string // extra JSON attributes
		zone    string
		spot    bool
		view    catalogView
		want    float64
		source  string
		asOf    time.Time
		wantErr bool
	}{
		{name: "a2-highgpu-1g on-demand", mt: machineType("a2-highgpu-1g", 12, 87040, "nvidia-tesla-a100", 1), zone: "us-central1-a",
			want: 12*0.031611 + 85*0.004237 + 2.933908, source: SourceCatalog, asOf: at},
		{name: "a2-highgpu-8g spot", mt: machineType("a2-highgpu-8g", 96, 696320, "nvidia-tesla-a100", 8), zone: "us-east1-b", spot: true,
			want: 96*0.0094833 + 680*0.0012711 + 8*1.1736, source: SourceCatalog, asOf: at},
		{name: "a3-highgpu-8g spot", mt: machineType("a3-highgpu-8g", 208, 1916928, "nvidia-h100-80gb", 8), zone: "us-central1-a", spot: true,
			want: 208*0.00586 + 1872*0.000511 + 8*2.253, source: SourceCatalog, asOf: at},
		{name: "g2-standard-24 in europe-west4", mt: machineType("g2-standard-24", 24, 98304, "nvidia-l4", 2), zone: "europe-west4-a",
			want: 24*0.027475 + 96*0.003218 + 2*0.6164, source: SourceCatalog, asOf: at},
		{name: "n1-standard-8 + 2 × T4 spot", mt: n1, block: `"accelerators": {"type": "nvidia-tesla-t4", "count": 2}`, zone: "us-central1-a", spot: true,
			want: 8*0.00698 + 30*0.000936 + 2*0.14, source: SourceCatalog, asOf: at},
		{name: "n1 in us-east4: the region's own SKU, the higher of two", mt: n1, zone: "us-east4-a",
			want: 8*0.035605 + 30*0.004771, source: SourceCatalog, asOf: at},
		{name: "catalog lacks the GPU: bundled table", mt: n1, block: `"accelerators": {"type": "nvidia-tesla-v100", "count": 1}`, zone: "us-central1-a",
			want: 8*0.031611 + 30*0.004237 + 2.48, source: SourceBundled, asOf: BundledPricesAsOf},
		{name: "catalog lacks the region: bundled table", mt: machineType("a3-highgpu-8g", 208, 1916928, "nvidia-h100-80gb", 8), zone: "asia-south1-a",
			want: 0, source: SourceBundled, asOf: BundledPricesAsOf},
		{name: "series not covered, no bundled row: error", mt: machineType("m1-ultramem-40", 40, 984064, "", 0), zone: "us-central1-a", wantErr: true},
		{name: "shared-core e2: not composed", mt: machineType("e2-medium", 2, 4096, "", 0), zone: "us-central1-a", wantErr: true},
		{name: "override wins", mt: machineType("a3-highgpu-8g", 208, 1916928, "nvidia-h100-80gb", 8), block: `"prices": {"a3-highgpu-8g": {"spot": 25}}`,
			zone: "us-central1-a", spot: true, want: 25, source: SourceOverride},
		{name: "override of the other capacity type does not apply", mt: machineType("a3-highgpu-8g", 208, 1916928, "nvidia-h100-80gb", 8), block: `"prices": {"a3-highgpu-8g": {"spot": 25}}`,
			zone: "us-central1-a", want: 208*0.029563 + 1872*0.003963 + 8*11.06125, source: SourceCatalog, asOf: at},
		{name: "overridden GPU names the override", mt: n1, block: `"accelerators": {"type": "nvidia-tesla-t4", "count": 1}, "prices": {"nvidia-tesla-t4/us-central1": {"on_demand": 0.3}}`,
			zone: "us-central1-a", want: 8*0.031611 + 30*0.004237 + 0.3, source: SourceOverride},
		{name: "API denied: bundled table says why", mt: n1, zone: "us-central1-a", view: catalogView{note: SourceCatalog + ": SERVICE_DISABLED"},
			want: 0.379998, source: SourceBundled + " (" + SourceCatalog + ": SERVICE_DISABLED)", asOf: BundledPricesAsOf},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw := `{"project": "my-project", "zones": ["` + tc.zone + `"], "machine_types": ["` + tc.mt.GetName() + `"], "image": "x"`
			if tc.block != "" {
				raw += ", " + tc.block
			}
			c, err := decodeConfig(providersConfig(raw + "}"))
			if err != nil {
				t.Fatal(err)
			}
			v := view
			if tc.view.note != "" || tc.view.prices != nil {
				v = tc.view
			}
			offs, err := offeringsFor(c, v, tc.zone, tc.mt, 8)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("offerings %+v, want an error", offs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			o := offs[1]
			if tc.spot {
				o = offs[0]
			}
			want := tc.want
			if want == 0 { // the bundled table's own row
				q, _, _ := bundledQuote("machine", tc.mt.GetName(), regionOf(tc.zone), tc.spot, "")
				want = q.usd
			}
			if math.Abs(o.PricePerHour-want) > 1e-9 || o.PriceSource != tc.source || !o.PriceAsOf.Equal(tc.asOf) {
				t.Errorf("%s %s: $%v from %q as of %v; want $%v from %q as of %v", o.InstanceType, o.CapacityType, o.PricePerHour, o.PriceSource, o.PriceAsOf, want, tc.source, tc.asOf)
			}
		})
	}
}
