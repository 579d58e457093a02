package fleet

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// The shipped alert rules: what each must have, and that they only use
// series the daemon exports (plus Prometheus' own up).
func TestPrometheusAlertRules(t *testing.T) {
	path := filepath.Join("..", "configs", "prometheus-alerts.yml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Record      string            `yaml:"record"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	exported := exportedFamilies(t)
	known := map[string]bool{"up": true, "absent": true, "round": true}
	alerts, records := map[string]bool{}, map[string]bool{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				known[r.Record], records[r.Record] = true, true
			}
		}
	}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			for _, m := range metricsIn(r.Expr) {
				if !exported[m] && !known[m] {
					t.Errorf("%s uses %s, which fleetd does not export: %s", name, m, r.Expr)
				}
			}
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs a summary and a description", r.Alert)
			}
			usesRecord := false
			for _, m := range metricsIn(r.Expr) {
				usesRecord = usesRecord || records[m]
			}
			if !usesRecord && !strings.Contains(r.Expr, `job="fleetd"`) {
				t.Errorf("%s: expression does not select job=\"fleetd\" (the scrape job of docs/api.md): %s", r.Alert, r.Expr)
			}
		}
	}
	for _, want := range []string{"FleetdDown", "FleetdFleetBelowMinNodes", "FleetdHeartbeatsStale", "FleetdSpendRateHigh", "FleetdProviderErrors", "FleetdJobFailed", "FleetdAlertActive"} {
		if !alerts[want] {
			t.Errorf("no alert %s", want)
		}
	}

	// promtool validates the PromQL and templates and runs the unit tests
	// in configs/prometheus-alerts.test.yml.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian: apt-get install prometheus; .ci/run installs it): rule syntax and unit tests not run")
	}
	for _, args := range [][]string{{"check", "rules", "prometheus-alerts.yml"}, {"test", "rules", "prometheus-alerts.test.yml"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = filepath.Join("..", "configs")
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Every series a Grafana panel, variable or annotation selects is filtered
// on the job variable, so one dashboard serves several fleetd daemons (or
// an HA pair) scraped by one Prometheus.
func TestGrafanaPanelsFilterOnJob(t *testing.T) {
	dash := readDashboard(t)
	hasJobVar := false
	var exprs []string
	for _, v := range dash.Templating.List {
		if v["name"] == "job" {
			hasJobVar = true
			continue // the job variable itself lists every job
		}
		if q, ok := v["query"].(map[string]any); ok {
			exprs = append(exprs, q["query"].(string))
		}
	}
	if !hasJobVar {
		t.Fatal("no job variable")
	}
	var walk func(ps []any)
	walk = func(ps []any) {
		for _, p := range ps {
			pm := p.(map[string]any)
			for _, tg := range asList(pm["targets"]) {
				exprs = append(exprs, tg.(map[string]any)["expr"].(string))
			}
			walk(asList(pm["panels"]))
		}
	}
	panels := make([]any, len(dash.Panels))
	for i, p := range dash.Panels {
		panels[i] = p
	}
	walk(panels)
	for _, a := range dash.Annotations.List {
		if e, ok := a["expr"].(string); ok {
			exprs = append(exprs, e)
		}
	}
	sel := regexp.MustCompile(`((?:fleetd|go|process)_[A-Za-z0-9_]+)(\{[^}]*\})?`)
	n := 0
	for _, e := range exprs {
		for _, m := range sel.FindAllStringSubmatch(e, -1) {
			n++
			if !strings.Contains(m[2], `job=~"$job"`) {
				t.Errorf("%s is not filtered on the job variable: %s", m[1], e)
			}
		}
	}
	if n < 20 {
		t.Fatalf("only %d selectors found: the dashboard walk is broken", n)
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}
