package gcp

import (
	"encoding/csv"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/providers"
)

var (
	labelKeyRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	labelValRE = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
	rfc1035RE  = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
	uuidV5RE   = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
)

func TestLabels(t *testing.T) {
	cases := []struct{ in, wantKey, wantValue string }{
		{"fleetd-fleet", "fleetd-fleet", "fleetd-fleet"},
		{"bert_large-2", "bert_large-2", "bert_large-2"},
		{"", "k-" + shortHash("", 8), ""},
		{"Bert", "bert-" + shortHash("Bert", 8), "bert-" + shortHash("Bert", 8)},
		{"9lives", "k9lives-" + shortHash("9lives", 8), "9lives"},
		{"a b/c.d", "a_b_c_d-" + shortHash("a b/c.d", 8), "a_b_c_d-" + shortHash("a b/c.d", 8)},
		{"ünï", "k_n_-" + shortHash("ünï", 8), "_n_-" + shortHash("ünï", 8)},
		{strings.Repeat("x", 63), strings.Repeat("x", 63), strings.Repeat("x", 63)},
		{strings.Repeat("x", 64), strings.Repeat("x", 54) + "-" + shortHash(strings.Repeat("x", 64), 8), strings.Repeat("x", 54) + "-" + shortHash(strings.Repeat("x", 64), 8)},
	}
	for _, tc := range cases {
		k, v := labelKey(tc.in), labelValue(tc.in)
		if k != tc.wantKey || v != tc.wantValue {
			t.Errorf("%q: key %q value %q, want %q %q", tc.in, k, v, tc.wantKey, tc.wantValue)
		}
		if !labelKeyRE.MatchString(k) || !labelValRE.MatchString(v) {
			t.Errorf("%q: key %q or value %q breaks the label rules", tc.in, k, v)
		}
	}
	// Distinct tags that sanitize alike stay distinct.
	if labelValue("A B") == labelValue("a_b") || labelValue("A B") == labelValue("a b") {
		t.Error("distinct values collide")
	}
}

func TestInstanceName(t *testing.T) {
	long := strings.Repeat("n", 80)
	cases := []struct {
		node         string
		index, count int
		wantPrefix   string
	}{
		{"node-1", 0, 1, "node-1-"},
		{"Node_1", 0, 1, "node-1-"},
		{"7f3a", 0, 1, "n-7f3a-"},
		{"", 0, 1, "fleetd-"},
		{"--a--b--", 0, 1, "a-b-"},
		{long, 2, 3, strings.Repeat("n", 52) + "-"},
		{"x.y", 1, 2, "x-y-"},
	}
	for _, tc := range cases {
		got := instanceName(tc.node, "fleet", "tok", tc.index, tc.count)
		if !rfc1035RE.MatchString(got) || !strings.HasPrefix(got, tc.wantPrefix) {
			t.Errorf("instanceName(%q) = %q, want a valid name starting %q", tc.node, got, tc.wantPrefix)
		}
		if tc.count > 1 && !strings.HasSuffix(got, "-"+string(rune('0'+tc.index))) {
			t.Errorf("instanceName(%q, %d of %d) = %q lacks the index", tc.node, tc.index, tc.count, got)
		}
		if again := instanceName(tc.node, "fleet", "tok", tc.index, tc.count); again != got {
			t.Errorf("not deterministic: %q then %q", got, again)
		}
	}
	if instanceName("n", "fleet", "a", 0, 1) == instanceName("n", "fleet", "b", 0, 1) ||
		instanceName("n", "f1", "a", 0, 1) == instanceName("n", "f2", "a", 0, 1) {
		t.Error("different tokens or fleets give the same name")
	}
}

func TestRequestID(t *testing.T) {
	a := requestID("insert", "fleet", "tok", "key", "0")
	if !uuidV5RE.MatchString(a) {
		t.Errorf("requestID %q is not a version 5 UUID", a)
	}
	if requestID("insert", "fleet", "tok", "key", "0") != a || requestID("insert", "fleet", "tok", "key", "1") == a {
		t.Error("requestID is not a function of its parts")
	}
}

func TestInstanceID(t *testing.T) {
	cases := []struct {
		id         string
		zone, name string
		ok         bool
	}{
		{"us-central1-a/node-1-abc", "us-central1-a", "node-1-abc", true},
		{"node-1", "", "", false},
		{"us-central1/node", "", "", false},
		{"us-central1-a/Node", "", "", false},
		{"us-central1-a/a/b", "", "", false},
		{"", "", "", false},
	}
	for _, tc := range cases {
		z, n, ok := ParseInstanceID(tc.id)
		if z != tc.zone || n != tc.name || ok != tc.ok {
			t.Errorf("ParseInstanceID(%q) = %q %q %v", tc.id, z, n, ok)
		}
		if ok && InstanceID(z, n) != tc.id {
			t.Errorf("InstanceID does not invert ParseInstanceID for %q", tc.id)
		}
	}
}

func TestGPUModel(t *testing.T) {
	for in, want := range map[string]string{
		"nvidia-tesla-a100":     "A100",
		"nvidia-a100-80gb":      "A100",
		"nvidia-h100-80gb":      "H100",
		"nvidia-h100-mega-80gb": "H100",
		"nvidia-h200-141gb":     "H200",
		"nvidia-l4":             "L4",
		"nvidia-l4-vws":         "L4",
		"nvidia-tesla-t4":       "T4",
		"nvidia-tesla-v100":     "V100",
		"nvidia-b200":           "B200",
		"nvidia-rtx-pro-6000":   "RTX-PRO-6000",
		"nvidia":                "NVIDIA",
	} {
		if got := GPUModel(in); got != want {
			t.Errorf("GPUModel(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestStateOf(t *testing.T) {
	for status, want := range map[string]providers.InstanceState{
		"PROVISIONING": providers.StatePending, "STAGING": providers.StatePending,
		"RUNNING":  providers.StateRunning,
		"STOPPING": providers.StateStopping, "SUSPENDING": providers.StateStopping,
		"TERMINATED": providers.StateTerminated, "SUSPENDED": providers.StateTerminated,
	} {
		if got := stateOf(status); got != want {
			t.Errorf("stateOf(%s) = %s, want %s", status, got, want)
		}
	}
}

// TestPriceTable checks the bundled table: it parses, covers the types
// the docs promise, and its spot prices are below on-demand.
func TestPriceTable(t *testing.T) {
	recs, err := func() ([][]string, error) {
		r := csv.NewReader(strings.NewReader(pricesCSV))
		r.Comment = '#'
		return r.ReadAll()
	}()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(pricesCSV, "generated "+PriceTableDate) {
		t.Errorf("prices.csv does not state the date %s", PriceTableDate)
	}
	if _, err := loadPrices(); err != nil {
		t.Fatal(err)
	}
	both := func(kind, name, region string) (od, sp float64, err error) {
		o, ok1, err1 := bundledQuote(kind, name, region, false, "")
		s, ok2, err2 := bundledQuote(kind, name, region, true, "")
		if err := errors.Join(err1, err2); err != nil || !ok1 || !ok2 {
			return 0, 0, fmt.Errorf("no bundled price (%v)", err)
		}
		if o.source != SourceBundled || !o.asOf.Equal(BundledPricesAsOf) || BundledPricesAsOf.Format("2006-01-02") != PriceTableDate {
			return 0, 0, fmt.Errorf("source %q as of %v, want %q as of %s", o.source, o.asOf, SourceBundled, PriceTableDate)
		}
		return o.usd, s.usd, nil
	}
	for _, name := range []string{"a2-highgpu-1g", "a2-highgpu-8g", "a3-highgpu-8g", "g2-standard-4", "g2-standard-96", "n1-standard-8"} {
		od, sp, err := both("machine", name, "us-central1")
		if err != nil || !(sp > 0) || !(od > sp) {
			t.Errorf("%s in us-central1: on-demand %v spot %v (%v)", name, od, sp, err)
		}
	}
	for _, name := range []string{"nvidia-tesla-t4", "nvidia-tesla-v100"} {
		if od, sp, err := both("accelerator", name, "asia-east1"); err != nil || !(od > sp) || !(sp > 0) {
			t.Errorf("%s: on-demand %v spot %v (%v)", name, od, sp, err)
		}
	}
	for _, rec := range recs[1:] {
		if rec[0] == "machine" && rec[2] == "*" {
			t.Errorf("machine row %v has no region", rec)
		}
	}
	// A region missing from the table falls back to us-central1.
	od1, _, _ := both("machine", "a3-highgpu-8g", "us-central1")
	od2, _, err := both("machine", "a3-highgpu-8g", "moon-base1")
	if err != nil || od1 != od2 {
		t.Errorf("fallback: %v vs %v (%v)", od2, od1, err)
	}
}
