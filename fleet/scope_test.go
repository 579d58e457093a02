package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/api/schema"
	"github.com/fleetd/fleetd/fleet/budget"
	"github.com/fleetd/fleetd/fleet/projects"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers/providertest"
)

// tokenClient is a client of td presenting tok.
func (td *testDaemon) tokenClient(t *testing.T, tok string) *api.Client {
	t.Helper()
	c, err := api.NewClient(td.URL(), api.ClientOptions{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// httpStatus is the HTTP status of err (200 for nil) and its message.
func httpStatus(t *testing.T, err error) (int, string) {
	t.Helper()
	if err == nil {
		return http.StatusOK, ""
	}
	var he *api.HTTPError
	if !errors.As(err, &he) {
		t.Fatalf("not an HTTP answer: %v", err)
	}
	return he.StatusCode, he.Body.Error
}

func fleetNames(fs []api.FleetSummary) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Name)
	}
	slices.Sort(out)
	return out
}

// TestProjectScopedTokens: a token limited to project a applies, sees,
// resumes and destroys only a's fleets; status, fleets, events, projects
// and the queue show only a; everything else is 403 naming the project,
// and nothing of b's changes.
func TestProjectScopedTokens(t *testing.T) {
	td := projectsDaemon(t)
	ctx := context.Background()
	for _, f := range []struct{ name, project string }{{"fa", "a"}, {"fb", "b"}} {
		if _, err := td.client.Apply(ctx, api.ApplyRequest{Filename: f.name + ".hcl", Source: projectSpec(f.name, f.project, 1, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	// Creation: the project must exist; it is listed with the token.
	var tc api.TokenCreated
	err := td.client.Do(ctx, http.MethodPost, "/v1/tokens", nil, api.TokenRequest{Role: "operate", Name: "ci-a", Project: "vison"}, &tc)
	if code, msg := httpStatus(t, err); code != 400 || !strings.Contains(msg, `no project "vison"`) {
		t.Fatalf("token for an unknown project: HTTP %d %q, want 400 naming it", code, msg)
	}
	if err := td.client.Do(ctx, http.MethodPost, "/v1/tokens", nil, api.TokenRequest{Role: "operate", Name: "ci-a", Project: "a"}, &tc); err != nil {
		t.Fatal(err)
	}
	var list []api.TokenInfo
	if err := td.client.Do(ctx, http.MethodGet, "/v1/tokens", nil, nil, &list); err != nil || len(list) != 1 || list[0].Project != "a" {
		t.Fatalf("token list %+v (%v), want one token of project a", list, err)
	}
	ca := td.tokenClient(t, tc.Token)

	// What it sees: a's fleets only.
	st, err := ca.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := fleetNames(st.Fleets); !slices.Equal(got, []string{"fa"}) || st.Fleets[0].Project != "a" {
		t.Errorf("status shows %v, want [fa] in project a", got)
	}
	var fleets []api.FleetSummary
	if err := ca.Do(ctx, http.MethodGet, "/v1/fleets", nil, nil, &fleets); err != nil || !slices.Equal(fleetNames(fleets), []string{"fa"}) {
		t.Errorf("fleets %v (%v), want [fa]", fleetNames(fleets), err)
	}
	evs, err := ca.Events(ctx, 0, 1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Events) == 0 {
		t.Error("no events of fa")
	}
	for _, e := range evs.Events {
		if e.Fleet != "fa" {
			t.Errorf("event %s of %q shown to a token of project a", e.Type, e.Fleet)
		}
	}
	// The event stream too (the dashboard follows it).
	streamed := readStream(t, td.URL()+"/v1/events/stream?since=0", tc.Token, time.Second)
	if len(streamed) == 0 {
		t.Error("the stream sent no event of fa")
	}
	for _, e := range streamed {
		if e.Fleet != "fa" {
			t.Errorf("streamed event %s of %q to a token of project a", e.Type, e.Fleet)
		}
	}
	var pr api.ProjectsResponse
	if err := ca.Do(ctx, http.MethodGet, "/v1/projects", nil, nil, &pr); err != nil || len(pr.Projects) != 1 || pr.Projects[0].Name != "a" {
		t.Errorf("projects %+v (%v), want only a", pr.Projects, err)
	}
	var q api.QueueResponse
	if err := ca.Do(ctx, http.MethodGet, "/v1/queue", nil, nil, &q); err != nil {
		t.Error(err)
	}
	for _, e := range q.Queue {
		if e.Project != "a" {
			t.Errorf("queue shows %s of project %s", e.Fleet, e.Project)
		}
	}

	// What it may not do: 403 saying why; b's fleet is untouched.
	for _, c := range []struct {
		name, method, path string
		body               any
		want               string
	}{
		{"read another project's fleet", "GET", "/v1/fleets/fb", nil, `fleet "fb" is in project "b"`},
		{"destroy another project's fleet", "DELETE", "/v1/fleets/fb", nil, `fleet "fb" is in project "b"`},
		{"resume another project's fleet", "POST", "/v1/fleets/fb/resume", nil, `fleet "fb" is in project "b"`},
		{"logs of another project's fleet", "GET", "/v1/fleets/fb/logs", nil, `fleet "fb" is in project "b"`},
		{"apply into another project", "POST", "/v1/fleets", api.ApplyRequest{Filename: "x.hcl", Source: projectSpec("fb2", "b", 1, 1)}, `fleet "fb2" is in project "b"`},
		{"plan into another project", "POST", "/v1/plan", api.ApplyRequest{Filename: "x.hcl", Source: projectSpec("fb2", "b", 1, 1)}, `fleet "fb2" is in project "b"`},
		{"take over another project's fleet name", "POST", "/v1/fleets", api.ApplyRequest{Filename: "x.hcl", Source: projectSpec("fb", "a", 1, 1)}, `fleet "fb" already exists in project "b"`},
		{"the default project", "POST", "/v1/fleets", api.ApplyRequest{Filename: "x.hcl", Source: projectSpec("fd", "", 1, 1)}, `is in project "default"`},
		{"metrics", "GET", "/metrics", nil, "daemon-wide"},
		{"offerings", "POST", "/v1/offerings", api.ApplyRequest{Filename: "x.hcl", Source: projectSpec("fa", "a", 1, 1)}, "daemon-wide"},
		{"project changes", "PUT", "/v1/projects/a", api.ProjectRequest{QuotaGPUs: 4, MaxGPUs: 4}, "needs admin"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := ca.Do(ctx, c.method, c.path, nil, c.body, nil)
			code, msg := httpStatus(t, err)
			if code != http.StatusForbidden || !strings.Contains(msg, c.want) {
				t.Fatalf("HTTP %d %q, want 403 containing %q", code, msg, c.want)
			}
			if c.want != "needs admin" && !strings.Contains(msg, `limited to project "a"`) {
				t.Errorf("%q does not name the token's project", msg)
			}
		})
	}
	if f, err := td.client.Fleet(ctx, "fb"); err != nil || f.Destroying {
		t.Errorf("fb after the refusals: %+v, %v", f.FleetSummary, err)
	}
	if _, err := td.client.Fleet(ctx, "fb2"); !errors.Is(err, state.ErrNotFound) {
		if code, _ := httpStatus(t, err); code != 404 {
			t.Errorf("fb2 was created by a refused apply (HTTP %d)", code)
		}
	}

	// What it may do: its own project's fleets.
	if _, err := ca.Apply(ctx, api.ApplyRequest{Filename: "fa2.hcl", Source: projectSpec("fa2", "a", 1, 1)}); err != nil {
		t.Fatalf("apply into project a: %v", err)
	}
	if _, err := ca.Fleet(ctx, "fa2"); err != nil {
		t.Errorf("read own fleet: %v", err)
	}
	if err := ca.Do(ctx, http.MethodDelete, "/v1/fleets/fa2", nil, nil, nil); err != nil {
		t.Errorf("destroy own fleet: %v", err)
	}
	// A missing fleet is a 404 whatever the project.
	if code, _ := httpStatus(t, ca.Do(ctx, http.MethodGet, "/v1/fleets/nope", nil, nil, nil)); code != 404 {
		t.Errorf("missing fleet: HTTP %d, want 404", code)
	}
}

// TestProjectAdminChanges: an admin creates, updates and deletes projects
// through the API; bad input is refused and changes nothing; a project
// whose fleets run cannot be deleted (the error names them); the changes
// override daemon.hcl and survive a restart.
func TestProjectAdminChanges(t *testing.T) {
	cfg, _, diags := ParseConfig("daemon.hcl", []byte(projectsConfig))
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	dir := t.TempDir()
	td := projectsDaemonAt(t, dir, cfg)
	ctx := context.Background()
	set := func(name string, req api.ProjectRequest) (int, string, api.ProjectChanged) {
		var out api.ProjectChanged
		code, msg := httpStatus(t, td.client.Do(ctx, http.MethodPut, "/v1/projects/"+name, nil, req, &out))
		return code, msg, out
	}
	get := func(name string) (api.Project, bool) {
		var pr api.ProjectsResponse
		if err := td.client.Do(ctx, http.MethodGet, "/v1/projects", nil, nil, &pr); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(pr.Projects, func(p api.Project) bool { return p.Name == name })
		if i < 0 {
			return api.Project{}, false
		}
		return pr.Projects[i], true
	}

	for _, c := range []struct {
		name, project string
		req           api.ProjectRequest
		code          int
		want          string // in the error; the action when it succeeds
	}{
		{"quota above max", "c", api.ProjectRequest{QuotaGPUs: 4, MaxGPUs: 2}, 400, "quota_gpus (4) must not exceed max_gpus (2)"},
		{"negative budget", "c", api.ProjectRequest{QuotaGPUs: 1, Budget: &budget.Limits{Total: -5}}, 400, "total must not be negative"},
		{"negative quota", "c", api.ProjectRequest{QuotaGPUs: -1, MaxGPUs: 2}, 400, "quota_gpus must be 0 or more"},
		{"bad name", "Vision_1", api.ProjectRequest{QuotaGPUs: 1}, 400, "not a valid project name"},
		{"bad on_exhausted", "c", api.ProjectRequest{QuotaGPUs: 1, Budget: &budget.Limits{Total: 5, OnExhausted: "explode"}}, 400, "on_exhausted"},
		{"update daemon.hcl's b: quota above max", "b", api.ProjectRequest{QuotaGPUs: 3, MaxGPUs: 2}, 400, "must not exceed"},
		{"create c", "c", api.ProjectRequest{QuotaGPUs: 1, MaxGPUs: 2, Priority: 5, Budget: &budget.Limits{Total: 100}}, 200, "created"},
		{"update c", "c", api.ProjectRequest{QuotaGPUs: 2, MaxGPUs: 3, Priority: 7, Budget: &budget.Limits{Total: 200, PerHour: 5}}, 200, "updated"},
		{"override daemon.hcl's a", "a", api.ProjectRequest{QuotaGPUs: 1, MaxGPUs: 3}, 200, "updated"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, msg, out := set(c.project, c.req)
			if code == 200 {
				msg = out.Action
				validateJSON(t, "ProjectChanged", out)
				validateJSON(t, "ProjectRequest", c.req)
			}
			if code != c.code || !strings.Contains(msg, c.want) {
				t.Fatalf("HTTP %d %q, want %d containing %q", code, msg, c.code, c.want)
			}
		})
	}
	if b, _ := get("b"); b.QuotaGPUs != 2 || b.MaxGPUs != 2 || b.Source != "config" {
		t.Errorf("b after a refused change: %+v, want daemon.hcl's (quota 2, max 2)", b)
	}
	if c, ok := get("c"); !ok || c.QuotaGPUs != 2 || c.MaxGPUs != 3 || c.Priority != 7 || c.Source != "api" || c.Budget == nil || c.Budget.TotalLimit != 200 {
		t.Errorf("c: %+v (%v)", c, ok)
	}
	if a, _ := get("a"); a.QuotaGPUs != 1 || a.MaxGPUs != 3 || a.Source != "api" {
		t.Errorf("a: %+v, want the admin's quota 1, max 3", a)
	}

	// A fleet of c holds it: deleting c is refused, naming the fleet.
	if _, err := td.client.Apply(ctx, api.ApplyRequest{Filename: "fc.hcl", Source: projectSpec("fc", "c", 1, 1)}); err != nil {
		t.Fatalf("apply into the new project: %v", err)
	}
	code, msg := httpStatus(t, td.client.Do(ctx, http.MethodDelete, "/v1/projects/c", nil, nil, nil))
	if code != http.StatusConflict || !strings.Contains(msg, "fc") {
		t.Fatalf("delete a project with a fleet: HTTP %d %q, want 409 naming fc", code, msg)
	}
	if _, ok := get("c"); !ok {
		t.Fatal("refused delete removed c")
	}
	if f, err := td.client.Fleet(ctx, "fc"); err != nil || f.Destroying {
		t.Fatalf("fc after the refused delete: %v", err)
	}
	if _, err := td.client.Destroy(ctx, "fc"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "fc gone", 20*time.Second, func() bool {
		_, err := td.client.Fleet(ctx, "fc")
		code, _ := httpStatus(t, err)
		return code == 404
	})
	for _, name := range []string{"c", "b"} {
		if code, msg := httpStatus(t, td.client.Do(ctx, http.MethodDelete, "/v1/projects/"+name, nil, nil, nil)); code != 200 {
			t.Fatalf("delete %s: HTTP %d %s", name, code, msg)
		}
	}
	if code, _ := httpStatus(t, td.client.Do(ctx, http.MethodDelete, "/v1/projects/c", nil, nil, nil)); code != 404 {
		t.Errorf("second delete of c: HTTP %d, want 404", code)
	}

	// A restart keeps it all: a as the admin set it, b (a daemon.hcl
	// project) and c deleted.
	td.stop()
	td = projectsDaemonAt(t, dir, cfg)
	if a, _ := get("a"); a.QuotaGPUs != 1 || a.MaxGPUs != 3 {
		t.Errorf("a after restart: %+v", a)
	}
	for _, name := range []string{"b", "c"} {
		if _, ok := get(name); ok {
			t.Errorf("deleted project %s is back after a restart", name)
		}
	}
	_, err := td.client.Plan(ctx, api.ApplyRequest{Filename: "fb.hcl", Source: projectSpec("fb", "b", 1, 1)})
	if code, msg := httpStatus(t, err); code != 422 || !strings.Contains(msg+errDetail(err), "b") {
		t.Errorf("a spec naming deleted b: HTTP %d %q, want a spec error", code, msg)
	}

	// Another server of a cluster changes the store: this one follows
	// within projectsCacheTTL.
	err = td.store.Update(ctx, func(tx state.Tx) error {
		doc, err := readProjectChanges(tx)
		if err != nil {
			return err
		}
		doc.Changes = append(doc.Changes, projects.Change{Project: projects.Project{Name: "d", QuotaGPUs: 1, MaxGPUs: 1}})
		return writeProjectChanges(tx, doc)
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "project d from the store", projectsCacheTTL+3*time.Second, func() bool { _, ok := get("d"); return ok })
}

// readStream reads an SSE stream for d and returns its events.
func readStream(t *testing.T, url, tok string, d time.Duration) []state.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("stream: HTTP %d", resp.StatusCode)
	}
	var evs []state.Event
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var e state.Event
			if err := json.Unmarshal([]byte(data), &e); err != nil {
				t.Fatalf("stream data %q: %v", data, err)
			}
			evs = append(evs, e)
		}
	}
	return evs
}

// validateJSON checks v, as the API encodes it, against def of the v1 schema.
func validateJSON(t *testing.T, def string, v any) {
	t.Helper()
	val, err := schema.Compile(def)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := val.Validate(b); err != nil {
		t.Errorf("%s does not match schema %s: %v", b, def, err)
	}
}

// projectsDaemonAt is a test daemon of cfg on dataDir with a fresh
// in-memory provider.
func projectsDaemonAt(t *testing.T, dataDir string, cfg Config) *testDaemon {
	t.Helper()
	mem := providertest.NewMemProvider()
	return launchTestDaemon(t, dataDir, staticProviders{providertest.MemName: mem}, mem, Options{Config: cfg})
}

func errDetail(err error) string {
	var he *api.HTTPError
	if errors.As(err, &he) {
		return he.Body.Rendered
	}
	return ""
}
