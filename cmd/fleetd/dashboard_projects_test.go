package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// projectsPage is what the test reads from the dashboard's projects view.
type projectsPage struct {
	Projects map[string]projectRow `json:"projects"`
	Pool     string                `json:"pool"`
	Queue    []queueRow            `json:"queue"`
	Fleets   []string              `json:"fleets"`
	Conn     string                `json:"conn"`
	Login    bool                  `json:"login"`
}

type projectRow struct {
	Quota, Used, Borrowed, Lent, Spend, Burn, Budget, SetBy string
}

type queueRow struct {
	Fleet, Position, Reason string
}

const readProjectsPage = `(() => {
  const q = (s) => Array.from(document.querySelectorAll(s));
  const txt = (r, c) => ((r.querySelector(c) || {}).textContent || '').trim();
  const projects = {};
  for (const r of q('#projects tbody tr[data-project]')) {
    projects[r.dataset.project] = {Quota: txt(r, '.project-quota'), Used: txt(r, '.project-used'), Borrowed: txt(r, '.project-borrowed'),
      Lent: txt(r, '.project-lent'), Spend: txt(r, '.project-spend'), Burn: txt(r, '.project-burn'), Budget: txt(r, '.project-budget'),
      SetBy: txt(r, 'td:last-child')};
  }
  return {
    projects,
    pool: document.getElementById('pool').textContent,
    queue: q('#queue tbody tr[data-fleet]').map((r) => ({Fleet: r.dataset.fleet, Position: r.dataset.position, Reason: txt(r, '.queue-reason')})),
    fleets: q('#fleets tbody tr[data-fleet]').map((r) => r.dataset.fleet),
    conn: (document.getElementById('conn') || {}).textContent || '',
    login: !document.getElementById('login').hidden,
  };
})()`

// localProjectSpec is configs/examples/local.hcl as fleet name of project,
// at one node, its workers running in repo.
func localProjectSpec(t *testing.T, repo, name, project string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "configs", "examples", "local.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	for _, r := range [][2]string{
		{`fleet "demo" {`, `fleet "` + name + `" {` + "\n  project = \"" + project + "\""},
		{"min_nodes     = 2", "min_nodes     = 1"},
		{"max_nodes     = 4", "max_nodes     = 1"},
		{"desired_nodes = 3", "desired_nodes = 1"},
		{`abspath("../..")`, `"` + repo + `"`},
		{`default     = 600`, `default     = 100000`},
	} {
		if !strings.Contains(src, r[0]) {
			t.Fatalf("configs/examples/local.hcl changed: no %q", r[0])
		}
		src = strings.Replace(src, r[0], r[1], 1)
	}
	return strings.Replace(src, `default     = "/tmp/fleetd-demo/checkpoints"`, `default     = "`+t.TempDir()+`"`, 1)
}

// TestDashboardProjectsInBrowser opens the dashboard of a real `fleetd
// serve -dev` with a 1-GPU pool in headless Chromium: project a's fleet
// holds the pool, project b's waits in the queue, and the projects view
// shows quota, use, spend against a's budget and the queue with its
// reason; a project an admin adds with `fleetd projects set` appears
// without a reload. A read token limited to project b sees only b.
func TestDashboardProjectsInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary, a local node and a browser")
	}
	requireChromium(t)
	bin := fleetdBinary(t)
	d, repo, dir := e2eDaemon(t, bin, `
max_gpus = 1
project "a" {
  quota_gpus = 1
  budget {
    per_hour = 50
    total    = 1000
  }
}
project "b" {
  quota_gpus = 0
  max_gpus   = 1
}
allocation {
  min_interval = "1s"
}
`)
	applySpec(t, d, bin, dir, "alpha", localProjectSpec(t, repo, "alpha", "a"))
	applySpec(t, d, bin, dir, "bravo", localProjectSpec(t, repo, "bravo", "b"))
	defer logOnFailure(t, d, bin, "alpha", "bravo")

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	waitPage := func(browser context.Context, what string, cond func(projectsPage) bool) {
		t.Helper()
		waitDashboard(t, browser, readProjectsPage, 45*time.Second, what, cond)
	}

	browser := openDashboard(t, ctx, d, 1300)
	waitPage(browser, "a holding the pool with its budget, bravo queued with a reason", func(s projectsPage) bool {
		a, b := s.Projects["a"], s.Projects["b"]
		return a.Quota == "1" && a.Used == "1" && strings.Contains(a.Spend, "of $1000.00") && strings.Contains(a.Burn, "cap $50.00/h") &&
			a.Budget == "ok" && a.SetBy == "daemon.hcl" && b.Quota == "0" && b.Used == "0" &&
			strings.Contains(s.Pool, "1 of 1 GPUs") && len(s.Queue) == 1 && s.Queue[0].Fleet == "bravo" && s.Queue[0].Position == "1" &&
			s.Queue[0].Reason != "" && s.Conn == "live"
	})
	if out, errOut, code := d.cli(t, bin, "projects", "set", "c", "-quota", "0", "-max", "1", "-budget-total", "20"); code != 0 {
		t.Fatalf("projects set: exit %d\n%s\n%s", code, out, errOut)
	}
	// No reload: the project.created event makes the page refresh.
	waitPage(browser, "project c, set by the admin", func(s projectsPage) bool {
		c, ok := s.Projects["c"]
		return ok && c.SetBy == "admin" && strings.Contains(c.Spend, "of $20.00")
	})
	shot := filepath.Join(os.TempDir(), "fleetd-dashboard-projects.png")
	saveScreenshot(t, browser, shot)
	t.Logf("projects view: %s", shot)

	// A read token limited to b: b's project and fleet only, live.
	out, errOut, code := d.cli(t, bin, "token", "create", "-role", "read", "-project", "b", "-name", "b-dashboard")
	if code != 0 {
		t.Fatalf("token create: exit %d %s", code, errOut)
	}
	scoped := openDashboardAs(t, ctx, d.addr, strings.TrimSpace(out), 1300)
	waitPage(scoped, "only project b and its fleet", func(s projectsPage) bool {
		_, hasB := s.Projects["b"]
		return len(s.Projects) == 1 && hasB && len(s.Fleets) == 1 && s.Fleets[0] == "bravo" &&
			len(s.Queue) == 1 && s.Queue[0].Fleet == "bravo" && s.Conn == "live" && !s.Login
	})
	d.stop(t)
}
