package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/api/schema"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/stats"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// interruptionScenario runs a fleet of three through one spot interruption
// and its replacement, with one failed provider List on the way and a
// rebalance recommendation (not an interruption) on another node: the
// shape every observability check below looks at.
type interruptionScenario struct {
	td     *testDaemon
	victim string
	// streamed collects the SSE messages a client read during the run.
	streamed chan sseMsg
}

type sseMsg struct{ id, event, data string }

func runInterruptionScenario(t *testing.T) *interruptionScenario {
	t.Helper()
	mem := providertest.NewMemProvider()
	var failedList atomic.Bool
	mem.SetHook(func(ctx context.Context, op providertest.Op, cfg providers.Config) error {
		if op == providertest.OpList && failedList.CompareAndSwap(false, true) {
			return providers.Errorf(providers.KindTransient, "mem: injected list failure")
		}
		return nil
	})
	td := startTestDaemon(t, t.TempDir(), mem)
	sc := &interruptionScenario{td: td, streamed: make(chan sseMsg, 1024)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// A real HTTP client follows the SSE stream for the whole run.
	go followStream(ctx, td, sc.streamed)

	td.apply(ctx, t, "train.hcl", memSpec)
	joined := map[string]bool{}
	td.joinBooting(t, "train", 3, 3, joined)

	nodes := td.nodes(t, "train")
	sc.victim = nodes[0].ID
	if code := td.agentCall(t, "train", nodes[1].ID, "notice", api.NoticeRequest{Kind: "rebalance", Source: "imds"}); code != http.StatusAccepted {
		t.Fatalf("rebalance notice: HTTP %d", code)
	}
	if code := td.agentCall(t, "train", sc.victim, "notice", api.NoticeRequest{Kind: "spot-interruption", Deadline: time.Now().Add(2 * time.Minute), Source: "imds"}); code != http.StatusAccepted {
		t.Fatalf("notice: HTTP %d", code)
	}
	td.joinBooting(t, "train", 1, 3, joined)
	waitFor(t, "both recovery kinds measured", 10*time.Second, func() bool {
		kinds := map[string]bool{}
		for _, r := range td.stats.Recoveries("train") {
			kinds[r.Kind] = true
		}
		return kinds["round-reformed"] && kinds["replacement-joined"]
	})
	waitFor(t, "the interruption tallied", 10*time.Second, func() bool {
		n, _ := td.stats.Tally.Interruptions("train")
		return n == 1
	})
	return sc
}

// followStream reads GET /v1/events/stream with a plain HTTP client until ctx ends.
func followStream(ctx context.Context, td *testDaemon, out chan<- sseMsg) {
	req, _ := http.NewRequestWithContext(ctx, "GET", td.URL()+"/v1/events/stream?since=0", nil)
	req.Header.Set("Authorization", "Bearer "+td.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var m sseMsg
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if m.id != "" {
				select {
				case out <- m:
				default:
				}
			}
			m = sseMsg{}
		case strings.HasPrefix(line, "id: "):
			m.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			m.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			m.data = line[6:]
		}
	}
}

func TestObservabilityAfterInterruption(t *testing.T) {
	sc := runInterruptionScenario(t)
	td := sc.td
	t.Run("metrics", func(t *testing.T) { checkMetrics(t, td) })
	t.Run("schema", func(t *testing.T) { checkLiveSchema(t, td) })
	t.Run("status", func(t *testing.T) {
		det, err := td.client.Fleet(context.Background(), "train")
		if err != nil {
			t.Fatal(err)
		}
		if det.Interruptions != 1 {
			t.Errorf("interruptions = %d, want 1 (the rebalance recommendation does not count)", det.Interruptions)
		}
		kinds := map[string]string{}
		for _, i := range det.RecentInterruptions {
			kinds[i.Kind] = i.Source
		}
		if kinds["spot-interruption"] != "agent/imds" || kinds["rebalance"] != "agent/imds" {
			t.Errorf("recent interruptions = %+v", det.RecentInterruptions)
		}
		if det.Rendezvous == nil || det.Rendezvous.WorldSize != 3 {
			t.Errorf("rendezvous = %+v, want world size 3", det.Rendezvous)
		}
		st, err := td.client.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		evs, _ := td.client.Events(context.Background(), 0, 0, 0)
		if st.LastEventSeq == 0 || st.LastEventSeq > evs.Next {
			t.Errorf("last_event_seq = %d, log ends at %d", st.LastEventSeq, evs.Next)
		}
	})
	t.Run("stream", func(t *testing.T) {
		// The stream client saw the notice live, in order, with its seq as id.
		var last uint64
		deadline := time.After(10 * time.Second)
		for {
			select {
			case m := <-sc.streamed:
				var e state.Event
				if err := json.Unmarshal([]byte(m.data), &e); err != nil {
					t.Fatalf("data %q: %v", m.data, err)
				}
				if fmt.Sprint(e.Seq) != m.id || e.Type != m.event || e.Seq <= last {
					t.Fatalf("message id=%s event=%s for event %d %s after %d", m.id, m.event, e.Seq, e.Type, last)
				}
				last = e.Seq
				if e.Type == "notice" && e.Node == sc.victim {
					return
				}
			case <-deadline:
				t.Fatal("the stream never delivered the victim's notice")
			}
		}
	})
}

func scrape(t *testing.T, td *testDaemon, token string) (int, map[string]*dto.MetricFamily) {
	t.Helper()
	req, _ := http.NewRequest("GET", td.URL()+"/metrics", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return resp.StatusCode, mfs
}

// series returns the metrics of a family whose labels include want.
func series(mfs map[string]*dto.MetricFamily, name string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	mf, ok := mfs[name]
	if !ok {
		return nil
	}
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		out = append(out, m)
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

func sum(ms []*dto.Metric) float64 {
	s := 0.0
	for _, m := range ms {
		s += value(m)
	}
	return s
}

func checkMetrics(t *testing.T, td *testDaemon) {
	if code, _ := scrape(t, td, ""); code != http.StatusUnauthorized {
		t.Errorf("/metrics without a token: HTTP %d, want 401", code)
	}
	if code, _ := scrape(t, td, td.NodeToken("train", td.nodes(t, "train")[0].ID)); code != http.StatusUnauthorized {
		t.Errorf("/metrics with a node token: HTTP %d, want 401", code)
	}
	code, mfs := scrape(t, td, td.Token())
	if code != 200 {
		t.Fatalf("/metrics: HTTP %d", code)
	}
	f := map[string]string{"fleet": "train"}
	checks := []struct {
		name   string
		labels map[string]string
		typ    dto.MetricType
		ok     func(v float64) bool
		want   string
	}{
		{"fleetd_nodes", map[string]string{"fleet": "train", "state": "running", "capacity_type": "spot"}, dto.MetricType_GAUGE, func(v float64) bool { return v == 3 }, "3 running spot nodes"},
		{"fleetd_nodes", f, dto.MetricType_GAUGE, func(v float64) bool { return v == 4 }, "4 nodes in all (3 running + the victim)"},
		{"fleetd_target_nodes", f, dto.MetricType_GAUGE, func(v float64) bool { return v == 3 }, "3"},
		{"fleetd_spend_rate_usd_per_hour", f, dto.MetricType_GAUGE, func(v float64) bool { return v > 0 }, "> 0"},
		{"fleetd_spend_usd", f, dto.MetricType_GAUGE, func(v float64) bool { return v > 0 }, "> 0"},
		{"fleetd_interruptions_total", map[string]string{"fleet": "train", "kind": "spot-interruption", "source": "agent/imds"}, dto.MetricType_COUNTER, func(v float64) bool { return v == 1 }, "1"},
		{"fleetd_interruptions_total", map[string]string{"fleet": "train", "kind": "rebalance", "source": "agent/imds"}, dto.MetricType_COUNTER, func(v float64) bool { return v == 1 }, "1"},
		{"fleetd_recovery_duration_seconds", map[string]string{"fleet": "train", "kind": "round-reformed"}, dto.MetricType_HISTOGRAM, func(v float64) bool { return v >= 1 }, "≥ 1 observation"},
		{"fleetd_recovery_duration_seconds", map[string]string{"fleet": "train", "kind": "replacement-joined"}, dto.MetricType_HISTOGRAM, func(v float64) bool { return v == 1 }, "1 observation (the replacement; first boots are not recoveries)"},
		{"fleetd_reconcile_duration_seconds", f, dto.MetricType_HISTOGRAM, func(v float64) bool { return v >= 2 }, "≥ 2 passes"},
		{"fleetd_provider_calls_total", map[string]string{"provider": "mem", "op": "create"}, dto.MetricType_COUNTER, func(v float64) bool { return v >= 4 }, "≥ 4 creates"},
		{"fleetd_provider_calls_total", map[string]string{"provider": "mem", "op": "list"}, dto.MetricType_COUNTER, func(v float64) bool { return v >= 2 }, "≥ 2 lists"},
		{"fleetd_provider_errors_total", map[string]string{"provider": "mem", "op": "list"}, dto.MetricType_COUNTER, func(v float64) bool { return v == 1 }, "the 1 injected list failure"},
		{"fleetd_provider_errors_total", map[string]string{"provider": "mem", "op": "create"}, dto.MetricType_COUNTER, func(v float64) bool { return v == 0 }, "0"},
		{"fleetd_provider_errors_total", map[string]string{"provider": "mem", "op": "list", "kind": "transient", "region": ""}, dto.MetricType_COUNTER, func(v float64) bool { return v == 1 }, "the injected failure, by its kind"},
		{"fleetd_provider_errors_total", map[string]string{"provider": "mem", "op": "create", "region": "mem-1", "kind": "quota"}, dto.MetricType_COUNTER, func(v float64) bool { return v == 0 }, "0 from the first create in mem-1"},
		{"fleetd_spend_usd_total", f, dto.MetricType_COUNTER, func(v float64) bool { return v > 0 }, "> 0"},
		{"fleetd_min_nodes", f, dto.MetricType_GAUGE, func(v float64) bool { return v == 2 }, "2"},
		{"fleetd_below_min_nodes", f, dto.MetricType_GAUGE, func(v float64) bool { return v == 0 }, "0 (3 running ≥ min 2)"},
		{"fleetd_heartbeat_age_max_seconds", f, dto.MetricType_GAUGE, func(v float64) bool { return v >= 0 && v < 60 }, "a recent heartbeat"},
		{"fleetd_rendezvous_round_latency_seconds", f, dto.MetricType_HISTOGRAM, func(v float64) bool { return v >= 2 }, "≥ 2 rounds"},
		{"fleetd_rendezvous_world_size", f, dto.MetricType_GAUGE, func(v float64) bool { return v == 3 }, "3"},
		{"fleetd_rendezvous_round", f, dto.MetricType_GAUGE, func(v float64) bool { return v >= 2 }, "≥ 2"},
		{"fleetd_build_info", map[string]string{"version": "test"}, dto.MetricType_GAUGE, func(v float64) bool { return v == 1 }, "1"},
		{"go_goroutines", nil, dto.MetricType_GAUGE, func(v float64) bool { return v > 0 }, "> 0"},
		{"process_cpu_seconds_total", nil, dto.MetricType_COUNTER, func(v float64) bool { return v > 0 }, "> 0"},
	}
	for _, c := range checks {
		mf, ok := mfs[c.name]
		if !ok {
			t.Errorf("%s: missing", c.name)
			continue
		}
		if mf.GetType() != c.typ {
			t.Errorf("%s: type %s, want %s", c.name, mf.GetType(), c.typ)
		}
		ms := series(mfs, c.name, c.labels)
		if len(ms) == 0 {
			t.Errorf("%s%v: no such series", c.name, c.labels)
			continue
		}
		if c.ok != nil && !c.ok(sum(ms)) {
			t.Errorf("%s%v = %v, want %s", c.name, c.labels, sum(ms), c.want)
		}
	}
	// Recovery histograms observe real durations: the sum is positive.
	for _, m := range series(mfs, "fleetd_recovery_duration_seconds", f) {
		if m.Histogram.GetSampleSum() <= 0 {
			t.Errorf("recovery histogram %v has sum %v", m.GetLabel(), m.Histogram.GetSampleSum())
		}
	}
}

func checkLiveSchema(t *testing.T, td *testDaemon) {
	for _, c := range []struct{ path, def string }{
		{"/v1/status", schema.Status},
		{"/v1/fleets", "[]" + schema.FleetSummary},
		{"/v1/fleets/train", schema.FleetDetail},
		{"/v1/events?since=0", schema.EventsResponse},
		{"/v1/events?since=3&limit=2", schema.EventsResponse},
	} {
		t.Run(strings.TrimPrefix(c.path, "/"), func(t *testing.T) {
			v, err := schema.Compile(c.def)
			if err != nil {
				t.Fatal(err)
			}
			code, body, _ := td.call(t, "GET", c.path, "Bearer "+td.Token(), nil)
			if code != 200 {
				t.Fatalf("HTTP %d: %s", code, body)
			}
			if err := v.Validate(body); err != nil {
				t.Fatalf("response does not match schema %s: %v\n%s", c.def, err, body)
			}
		})
	}
}

// The schema must reject what the API never sends, or validating against
// it proves nothing.
func TestSchemaRejectsMalformed(t *testing.T) {
	v, err := schema.Compile(schema.FleetDetail)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	good := api.FleetDetail{FleetSummary: api.FleetSummary{Name: "f", Generation: 1, NodesByState: map[string]int{"running": 1}, Providers: []string{"mem"}, CreatedAt: now, UpdatedAt: now},
		Nodes:      []api.NodeInfo{{ID: "n1", State: state.NodeRunning, Provider: "mem", CapacityType: "spot", CreatedAt: now}},
		Recoveries: []api.RecoveryInfo{}, Alerts: []api.AlertInfo{}, RecentInterruptions: []api.InterruptionInfo{}}
	if err := v.ValidateValue(good); err != nil {
		t.Fatalf("valid detail rejected: %v", err)
	}
	for name, mutate := range map[string]func(m map[string]any){
		"unknown field":     func(m map[string]any) { m["surprise"] = 1 },
		"missing nodes":     func(m map[string]any) { delete(m, "nodes") },
		"bad node state":    func(m map[string]any) { m["nodes"].([]any)[0].(map[string]any)["state"] = "sleeping" },
		"bad state key":     func(m map[string]any) { m["nodes_by_state"] = map[string]any{"napping": 1} },
		"negative count":    func(m map[string]any) { m["interruptions"] = -1 },
		"time not RFC 3339": func(m map[string]any) { m["created_at"] = "yesterday" },
		"bad recovery kind": func(m map[string]any) {
			m["recoveries"] = []any{map[string]any{"kind": "x", "duration_seconds": 1, "at": now}}
		},
		"bad rendezvous": func(m map[string]any) {
			m["rendezvous"] = map[string]any{"round": 1, "state": "ajar", "nodes": 1, "world_size": 1}
		},
		"string generation":   func(m map[string]any) { m["generation"] = "1" },
		"node unknown field":  func(m map[string]any) { m["nodes"].([]any)[0].(map[string]any)["gpu"] = "A100" },
		"summary missing key": func(m map[string]any) { delete(m, "spend_usd") },
	} {
		t.Run(name, func(t *testing.T) {
			b, _ := json.Marshal(good)
			var m map[string]any
			_ = json.Unmarshal(b, &m)
			mutate(m)
			if err := v.ValidateValue(m); err == nil {
				t.Fatal("schema accepted it")
			}
		})
	}
}

// Savings compare each node's price with the on-demand price of its
// instance type where it runs, once a provider has told us that price.
func TestSavingsAgainstOnDemand(t *testing.T) {
	td, _ := startBooting(t)
	ctx := context.Background()
	st, err := td.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := st.Fleets[0]
	if f.CostPerHour <= 0 {
		t.Fatalf("cost per hour %v", f.CostPerHour)
	}
	td.stats.OfferingsListed(providertest.MemOfferings())
	st, err = td.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f = st.Fleets[0]
	var wantOD float64
	for _, n := range td.nodes(t, "train") {
		od, ok := td.stats.OnDemandPrice(n.Offering)
		if !ok {
			t.Fatalf("no on-demand price for %s", n.Offering.Key())
		}
		if n.Offering.CapacityType == providers.Spot && od <= n.Offering.PricePerHour {
			t.Fatalf("mem on-demand %v not above spot %v", od, n.Offering.PricePerHour)
		}
		wantOD += od
	}
	if diff := f.OnDemandCostPerHour - wantOD; diff > 1e-9 || diff < -1e-9 {
		t.Errorf("on_demand_cost_per_hour = %v, want %v", f.OnDemandCostPerHour, wantOD)
	}
	if f.SavingsUSD <= 0 || f.OnDemandEquivalentUSD <= f.SpendUSD {
		t.Errorf("savings %v, on-demand equivalent %v, spend %v: want savings > 0", f.SavingsUSD, f.OnDemandEquivalentUSD, f.SpendUSD)
	}
	if got := f.OnDemandEquivalentUSD - f.SpendUSD; got-f.SavingsUSD > 1e-12 || f.SavingsUSD-got > 1e-12 {
		t.Errorf("savings_usd %v != on-demand equivalent − spend %v", f.SavingsUSD, got)
	}
}

// Repeated boot failures raise an alert; the counter counts them by the
// state they failed from.
func TestBootFailureAlert(t *testing.T) {
	d := bareDaemon()
	now := time.Now()
	seq := uint64(0)
	fail := func(from state.NodeState, at time.Time) {
		seq++
		d.stats.Tally.Event(state.Event{Seq: seq, Time: at, Fleet: "f", Node: fmt.Sprint("n", seq), Type: "node.transition",
			Data: map[string]string{"from": string(from), "to": string(state.NodeFailed)}})
	}
	fail(state.NodeBooting, now.Add(-2*time.Hour)) // too old to count
	fail(state.NodeBooting, now.Add(-time.Minute))
	fail(state.NodeProvisioning, now.Add(-time.Minute))
	if al := d.alerts("f"); len(al) != 0 {
		t.Fatalf("alerts after 2 recent failures: %+v", al)
	}
	fail(state.NodeBooting, now)
	al := d.alerts("f")
	if len(al) != 1 || al[0].Kind != stats.AlertBootFailures {
		t.Fatalf("alerts = %+v, want one %s", al, stats.AlertBootFailures)
	}
	// Replayed events (seq already seen) are not counted twice.
	d.stats.Tally.Event(state.Event{Seq: 2, Time: now, Fleet: "f", Type: "node.transition", Data: map[string]string{"from": "booting", "to": "failed"}})
	got := map[string]float64{}
	for from, m := range byLabel(t, d, "fleetd_node_failures_total", "from") {
		got[from] = m.GetCounter().GetValue()
	}
	if got["booting"] != 3 || got["provisioning"] != 1 {
		t.Fatalf("fleetd_node_failures_total by from = %v, want booting 3, provisioning 1", got)
	}
}
