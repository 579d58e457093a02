package fleet

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetd/fleetd/fleet/stats"
)

// exportedFamilies is every metric family the daemon can export: its own
// collectors' descriptions (a family shows up only once it has a value)
// and what the runtime collectors gather.
func exportedFamilies(t *testing.T) map[string]bool {
	t.Helper()
	m := newMetrics("test")
	out := map[string]bool{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range append(stats.New(nil).Collectors(), newFleetCollector(nil), newOpsCollector(nil)) {
			c.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		mm := fqName.FindStringSubmatch(d.String())
		if mm == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		out[mm[1]] = true
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		out[mf.GetName()] = true
	}
	return out
}

var (
	promIdent   = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	quoted      = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promKeyword = map[string]bool{}
)

func init() {
	for _, k := range strings.Fields(`sum by without on ignoring group_left group_right and or unless offset bool
		rate irate increase histogram_quantile count avg min max topk bottomk label_values le
		__rate_interval __interval job instance fleet state capacity_type kind source from provider op version nodes
		region outcome`) {
		promKeyword[k] = true
	}
}

// metricsIn returns the metric names a PromQL expression selects.
func metricsIn(expr string) []string {
	expr = quoted.ReplaceAllString(expr, `""`)
	// Label matchers and range selectors name labels and durations, not metrics.
	expr = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`).ReplaceAllString(expr, " ")
	var out []string
	for _, id := range promIdent.FindAllString(expr, -1) {
		if promKeyword[id] || strings.HasPrefix(id, "$") {
			continue
		}
		out = append(out, id)
	}
	return out
}

// grafanaDashboard is what the tests read of configs/grafana-dashboard.json.
type grafanaDashboard struct {
	SchemaVersion int              `json:"schemaVersion"`
	UID           string           `json:"uid"`
	Title         string           `json:"title"`
	Panels        []map[string]any `json:"panels"`
	Templating    struct {
		List []map[string]any `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []map[string]any `json:"list"`
	} `json:"annotations"`
}

func readDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "configs", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash grafanaDashboard
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("not valid JSON: %v", err)
	}
	return dash
}

func TestGrafanaDashboardUsesExportedSeries(t *testing.T) {
	dash := readDashboard(t)
	if dash.SchemaVersion < 36 || dash.UID == "" || dash.Title == "" {
		t.Fatalf("schemaVersion %d, uid %q, title %q", dash.SchemaVersion, dash.UID, dash.Title)
	}
	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		vars[v["name"].(string)], _ = v["type"].(string)
	}
	if vars["datasource"] != "datasource" {
		t.Fatalf("no datasource variable: %v", vars)
	}

	exported := exportedFamilies(t)
	var exprs []string
	ids := map[float64]bool{}
	var walk func(ps []map[string]any)
	walk = func(ps []map[string]any) {
		for _, p := range ps {
			id, _ := p["id"].(float64)
			if ids[id] {
				t.Errorf("panel id %v used twice", id)
			}
			ids[id] = true
			if _, ok := p["gridPos"].(map[string]any); !ok {
				t.Errorf("panel %q has no gridPos", p["title"])
			}
			if p["type"] == "row" {
				if sub, ok := p["panels"].([]any); ok {
					var nested []map[string]any
					for _, s := range sub {
						nested = append(nested, s.(map[string]any))
					}
					walk(nested)
				}
				continue
			}
			if ds, _ := p["datasource"].(map[string]any); ds["uid"] != "${datasource}" {
				t.Errorf("panel %q does not use the datasource variable: %v", p["title"], p["datasource"])
			}
			targets, _ := p["targets"].([]any)
			if len(targets) == 0 {
				t.Errorf("panel %q has no query", p["title"])
			}
			for _, tg := range targets {
				e, _ := tg.(map[string]any)["expr"].(string)
				if e == "" {
					t.Errorf("panel %q has a target without expr", p["title"])
				}
				exprs = append(exprs, e)
			}
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		if q, ok := v["query"].(map[string]any); ok {
			exprs = append(exprs, q["query"].(string))
		}
	}
	for _, a := range dash.Annotations.List {
		if e, ok := a["expr"].(string); ok {
			exprs = append(exprs, e)
		}
	}
	used := map[string]bool{}
	for _, e := range exprs {
		names := metricsIn(e)
		if len(names) == 0 {
			t.Errorf("expression selects no metric: %s", e)
		}
		for _, n := range names {
			base := n
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(n, suf); ok && exported[b] {
					base = b
				}
			}
			if !exported[base] {
				t.Errorf("expression uses %s, which fleetd does not export: %s", n, e)
			}
			used[base] = true
		}
	}
	// The dashboard shows every fleetd family.
	var missing []string
	for n := range exported {
		if strings.HasPrefix(n, "fleetd_") && !used[n] {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("fleetd series not on the dashboard: %v", missing)
	}
}

func TestMetricsIn(t *testing.T) {
	for expr, want := range map[string]string{
		`sum by (state) (fleetd_nodes{fleet=~"$fleet", state!="terminated"})`:                                 "fleetd_nodes",
		`histogram_quantile(0.95, sum by (le) (rate(fleetd_recovery_duration_seconds_bucket{kind="x"}[5m])))`: "fleetd_recovery_duration_seconds_bucket",
		`sum(rate(a_total[$__rate_interval])) / sum(rate(b_total[$__rate_interval]))`:                         "a_total b_total",
		`label_values(fleetd_nodes{job=~"$job"}, fleet)`:                                                      "fleetd_nodes",
		`count by (version) (fleetd_build_info{job=~"$job"})`:                                                 "fleetd_build_info",
		`sum(fleetd_on_demand_equivalent_usd{fleet=~"$fleet"}) - sum(fleetd_spend_usd{fleet=~"$fleet"})`:      "fleetd_on_demand_equivalent_usd fleetd_spend_usd",
	} {
		if got := strings.Join(metricsIn(expr), " "); got != want {
			t.Errorf("metricsIn(%s) = %q, want %q", expr, got, want)
		}
	}
}
