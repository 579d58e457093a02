package sim

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/providers"
)

// v100Dir is the bundled two-month V100 trace (outside the module).
var v100Dir = filepath.Join("..", "..", "configs", "traces", "aws-v100-2023-02-15")

func TestLoadV100(t *testing.T) {
	tr, err := Load(v100Dir)
	if err != nil {
		t.Fatal(err)
	}
	wantZones := []string{"us-east-1a", "us-east-1c", "us-east-1d", "us-east-1f", "us-east-2a", "us-east-2b", "us-west-2a", "us-west-2b", "us-west-2c"}
	if got := tr.Zones(); len(got) != len(wantZones) {
		t.Fatalf("zones %v, want %v", got, wantZones)
	}
	start := time.Date(2023, 2, 15, 22, 8, 16, 0, time.UTC)
	// Mean availability per zone as published for this trace
	// (../shared/reference/spot-traces.md §1.1).
	meanAvail := map[string]float64{"us-east-1a": 0.167, "us-east-1c": 0.467, "us-east-1d": 0.447, "us-east-1f": 0.591,
		"us-east-2a": 0.759, "us-east-2b": 0.682, "us-west-2a": 0.883, "us-west-2b": 0.905, "us-west-2c": 0.891}
	union := make([]bool, 20158)
	for i, s := range tr.Series {
		if s.Meta.Zone != wantZones[i] {
			t.Errorf("series %d zone %q, want %q", i, s.Meta.Zone, wantZones[i])
		}
		if want := RegionOf(wantZones[i]); s.Meta.Region != want || want != wantZones[i][:len(wantZones[i])-1] {
			t.Errorf("%s: region %q", s.Meta.Zone, s.Meta.Region)
		}
		if len(s.Avail) != 20158 || len(s.Price) != 20158 {
			t.Fatalf("%s: %d ticks, %d prices, want 20158", s.Meta.Zone, len(s.Avail), len(s.Price))
		}
		if s.Tick != 195*time.Second || !s.Start.Equal(start) {
			t.Errorf("%s: tick %s start %s, want 195s from %s", s.Meta.Zone, s.Tick, s.Start, start)
		}
		sum := 0
		for j, v := range s.Avail {
			if v != 0 && v != 1 {
				t.Fatalf("%s tick %d: %d", s.Meta.Zone, j, v)
			}
			sum += int(v)
			union[j] = union[j] || v == 1
		}
		if got := float64(sum) / float64(len(s.Avail)); math.Abs(got-meanAvail[s.Meta.Zone]) > 0.0006 {
			t.Errorf("%s: mean availability %.4f, want %.3f", s.Meta.Zone, got, meanAvail[s.Meta.Zone])
		}
		for _, p := range s.Price {
			if p < 0.918 || p > 1.8464 {
				t.Fatalf("%s: spot price %v outside the published range", s.Meta.Zone, p)
			}
		}
	}
	n := 0
	for _, u := range union {
		if u {
			n++
		}
	}
	if got := float64(n) / float64(len(union)); math.Abs(got-0.992) > 0.0006 {
		t.Errorf("any of 9 zones available %.4f of ticks, want 0.992", got)
	}
	if want := start.Add(20158 * 195 * time.Second); !tr.End.Equal(want) {
		t.Errorf("end %s, want %s", tr.End, want)
	}
}

// TestLoadManifest loads a synthetic multi-cloud trace: per-zone counts,
// another tick length, a JSON series in the spot-traces format, a CSV with
// per-tick prices and an inverted (1 = preempted) series with its own tick.
func TestLoadManifest(t *testing.T) {
	tr, err := Load(filepath.Join("testdata", "multi"))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Name != "multi-cloud-counts" || len(tr.Series) != 3 {
		t.Fatalf("trace %q with %d series", tr.Name, len(tr.Series))
	}
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	by := map[string]*Series{}
	for _, s := range tr.Series {
		by[s.Meta.Zone] = s
		if !s.Start.Equal(start) {
			t.Errorf("%s: start %s", s.Meta.Zone, s.Start)
		}
	}
	tests := []struct {
		zone, region, cloud, itype string
		tick                       time.Duration
		ticks                      int
		avail                      []int32 // first ticks
		price                      []float64
	}{
		{"us-central1-a", "us-central1", "gcp", "a2-ultragpu-4g", 5 * time.Minute, 24, []int32{4, 4, 4, 3, 3, 2, 2, 0}, []float64{6, 6, 6}},
		{"us-east-2b", "us-east-2", "aws", "p4d.24xlarge", 5 * time.Minute, 24, []int32{2, 2, 2, 2, 0}, nil},
		{"europe-west4-a", "europe-west4", "gcp", "a2-ultragpu-4g", 10 * time.Minute, 12, []int32{1, 1, 0, 0, 1}, nil},
	}
	for _, tc := range tests {
		s := by[tc.zone]
		if s == nil {
			t.Fatalf("no series for %s", tc.zone)
		}
		if s.Meta.Region != tc.region || s.Meta.Cloud != tc.cloud || s.Meta.InstanceType != tc.itype || s.Tick != tc.tick || len(s.Avail) != tc.ticks {
			t.Errorf("%s: region %q cloud %q type %q tick %s ticks %d", tc.zone, s.Meta.Region, s.Meta.Cloud, s.Meta.InstanceType, s.Tick, len(s.Avail))
		}
		for i, v := range tc.avail {
			if s.Avail[i] != v {
				t.Errorf("%s tick %d: %d, want %d", tc.zone, i, s.Avail[i], v)
			}
		}
		for i, p := range tc.price {
			if s.Price[i] != p {
				t.Errorf("%s tick %d: price %v, want %v", tc.zone, i, s.Price[i], p)
			}
		}
		if tc.price == nil && s.Price != nil {
			t.Errorf("%s: unexpected per-tick prices", tc.zone)
		}
	}

	m, err := NewMarket(tr, Config{Trace: "x"})
	if err != nil {
		t.Fatal(err)
	}
	o := m.Offer(providers.Offering{Provider: Name, Region: "us-central1", Zone: "us-central1-a", InstanceType: "a2-ultragpu-4g", CapacityType: providers.Spot}.Key())
	if o == nil || o.NoticeLead != 30*time.Second || o.Meta.OnDemandPrice != 20.5 || o.Spot.GPUs != 4 || o.Spot.GPUType != "A100" {
		t.Fatalf("us-central1-a offer %+v", o)
	}
	if aws := m.Offers[2]; aws.Meta.Zone != "us-east-2b" || aws.NoticeLead != 2*time.Minute || aws.SpotPrice(start) != 12.25 || aws.Spot.GPUs != 8 {
		t.Errorf("us-east-2b offer: zone %s lead %s price %v gpus %d", aws.Meta.Zone, aws.NoticeLead, aws.SpotPrice(start), aws.Spot.GPUs)
	}
	// Capacity and its changes at tick boundaries; time before the start
	// holds the first tick, after the end the last.
	for _, c := range []struct {
		at   time.Duration
		want int
	}{{-time.Hour, 4}, {0, 4}, {14*time.Minute + 59*time.Second, 4}, {15 * time.Minute, 3}, {35 * time.Minute, 0}, {50 * time.Minute, 1}, {10 * time.Hour, 4}} {
		if got := o.Capacity(start.Add(c.at)); got != c.want {
			t.Errorf("capacity at +%s = %d, want %d", c.at, got, c.want)
		}
	}
	if got := o.NextChange(start); !got.Equal(start.Add(15 * time.Minute)) {
		t.Errorf("next change after start: %s", got)
	}
	if got := o.NextChange(start.Add(15 * time.Minute)); !got.Equal(start.Add(25 * time.Minute)) {
		t.Errorf("next change after +15m: %s", got)
	}
	if got := o.NextChange(start.Add(115 * time.Minute)); !got.IsZero() {
		t.Errorf("next change after the last one: %s", got)
	}
	// Spot cost integrates the per-tick prices: 5 min at 6.0 and 10 min
	// at 6.5 across the price change at +40m.
	if got, want := o.SpotCost(start.Add(35*time.Minute), start.Add(50*time.Minute)), 6.0/12+6.5/6; math.Abs(got-want) > 1e-9 {
		t.Errorf("spot cost %v, want %v", got, want)
	}
	if got := o.OnDemandCost(start, start.Add(90*time.Minute)); math.Abs(got-1.5*20.5) > 1e-9 {
		t.Errorf("on-demand cost %v", got)
	}

	// Provider block overrides: zones subset, on-demand price; unknown zones fail.
	m2, err := NewMarket(tr, Config{Trace: "x", Zones: []string{"europe-west4-a"}, Instance: Instance{OnDemandPrice: 11, NoticeLead: "45s"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(m2.Offers) != 1 || m2.Offers[0].Meta.OnDemandPrice != 11 || m2.Offers[0].NoticeLead != 45*time.Second {
		t.Errorf("overridden market: %d offers, %+v", len(m2.Offers), m2.Offers[0].Meta)
	}
	if _, err := NewMarket(tr, Config{Trace: "x", Zones: []string{"mars-1a"}}); !providers.IsInvalidConfig(err) {
		t.Errorf("unknown zone: %v, want an invalid-config error", err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); err == nil {
		t.Error("empty directory loaded")
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing directory loaded")
	}
}

// TestLoadSubdirectories: a manifest may name series files in
// subdirectories of the trace directory (published traces keep one folder
// per cloud or region); the default key is the path without extension and
// the price file may key a series by its base name. Paths leaving the
// directory are refused.
func TestLoadSubdirectories(t *testing.T) {
	write := func(dir, name, body string) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	write(dir, "aws/us-east-1a_v100.csv", "availability\n1\n0\n1\n")
	write(dir, "gcp/a100/us-central1-a.csv", "availability\n0\n1\n1\n")
	write(dir, "spot_prices.json", `{"us-east-1a_v100": [1, 2, 3], "gcp/a100/us-central1-a": [4, 5, 6]}`)
	write(dir, ManifestFile, `{"tick": "10m", "series": [{"file": "aws/us-east-1a_v100.csv"}, {"file": "gcp/a100/us-central1-a.csv", "cloud": "gcp"}]}`)
	tr, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		key, zone string
		avail     []int32
		price     []float64
	}{
		// By zone.
		{"gcp/a100/us-central1-a", "us-central1-a", []int32{0, 1, 1}, []float64{4, 5, 6}},
		{"aws/us-east-1a_v100", "us-east-1a", []int32{1, 0, 1}, []float64{1, 2, 3}},
	}
	if len(tr.Series) != len(want) {
		t.Fatalf("%d series, want %d", len(tr.Series), len(want))
	}
	for i, w := range want {
		s := tr.Series[i]
		if s.Key != w.key || s.Meta.Zone != w.zone || !slices.Equal(s.Avail, w.avail) || !slices.Equal(s.Price, w.price) {
			t.Errorf("series %d: key %q zone %q avail %v price %v; want %+v", i, s.Key, s.Meta.Zone, s.Avail, s.Price, w)
		}
	}
	for _, bad := range []string{"../outside.csv", "/etc/passwd", "aws/../../x.csv", ""} {
		write(dir, ManifestFile, `{"tick": "10m", "series": [{"file": "`+bad+`"}]}`)
		if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "relative path inside the trace directory") {
			t.Errorf("series file %q: %v, want a refusal", bad, err)
		}
	}
}

func TestRegionOf(t *testing.T) {
	for zone, want := range map[string]string{"us-east-1a": "us-east-1", "us-central1-a": "us-central1", "eastus-2": "eastus", "local": "local"} {
		if got := RegionOf(zone); got != want {
			t.Errorf("RegionOf(%q) = %q, want %q", zone, got, want)
		}
	}
}
