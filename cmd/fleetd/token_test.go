package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/fleettest"
)

// startInProcessDaemon serves a daemon in this process (fleettest's, on the
// mem provider, which the token commands never use) and points the CLI's
// environment at it.
func startInProcessDaemon(t *testing.T) *fleet.Daemon {
	t.Helper()
	d, stop, err := fleettest.Start(context.Background(), fleettest.Options{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	t.Setenv("FLEETD_ADDR", d.URL())
	t.Setenv("FLEETD_TOKEN", d.Token())
	return d
}

func statusWith(t *testing.T, url, tok string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestTokenCommands: create prints the secret alone on stdout, list shows
// it without the secret, a scoped token cannot manage tokens, revoke ends
// it; bad invocations are usage errors.
func TestTokenCommands(t *testing.T) {
	d := startInProcessDaemon(t)
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(append([]string{"token"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}

	for _, c := range []struct {
		name string
		args []string
	}{
		{"no subcommand", nil},
		{"unknown subcommand", []string{"rotate"}},
		{"create without role", []string{"create"}},
		{"create with admin role", []string{"create", "-role", "admin"}},
		{"revoke without id", []string{"revoke"}},
		{"list with an argument", []string{"list", "x"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if code, _, _ := cli(c.args...); code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
		})
	}

	code, secret, msg := cli("create", "-role", "read", "-name", "prometheus")
	secret = strings.TrimSpace(secret)
	if code != exitOK || !strings.HasPrefix(secret, "fleetd_read_") || strings.Contains(secret, "\n") {
		t.Fatalf("create: exit %d, stdout %q, stderr %q", code, secret, msg)
	}
	if got := statusWith(t, d.URL(), secret); got != 200 {
		t.Fatalf("status with the new read token: HTTP %d", got)
	}
	code, js, msg := cli("create", "-role", "operate", "-json")
	var op api.TokenCreated
	if code != exitOK || json.Unmarshal([]byte(js), &op) != nil || op.Role != "operate" || op.Token == "" {
		t.Fatalf("create -json: exit %d %q %q", code, js, msg)
	}

	code, list, _ := cli("list")
	if code != exitOK || !strings.Contains(list, "prometheus") || !strings.Contains(list, op.ID) || strings.Contains(list, secret) {
		t.Fatalf("list: exit %d\n%s", code, list)
	}
	code, js, _ = cli("list", "-json")
	var infos []api.TokenInfo
	if code != exitOK || json.Unmarshal([]byte(js), &infos) != nil || len(infos) != 2 || strings.Contains(js, op.Token) {
		t.Fatalf("list -json: exit %d\n%s", code, js)
	}

	// A scoped token in FLEETD_TOKEN cannot manage tokens, and the error says why.
	t.Setenv("FLEETD_TOKEN", op.Token)
	if code, _, msg := cli("list"); code != exitError || !strings.Contains(msg, "admin token") {
		t.Errorf("list with an operate token: exit %d, %q", code, msg)
	}
	t.Setenv("FLEETD_TOKEN", d.Token())

	readID := ""
	for _, i := range infos {
		if i.Name == "prometheus" {
			readID = i.ID
		}
	}
	if code, out, msg := cli("revoke", readID); code != exitOK || !strings.Contains(out, "Revoked read token "+readID) {
		t.Fatalf("revoke: exit %d %q %q", code, out, msg)
	}
	if got := statusWith(t, d.URL(), secret); got != http.StatusUnauthorized {
		t.Errorf("status with the revoked token: HTTP %d, want 401", got)
	}
	if code, _, msg := cli("revoke", readID); code != exitError || !strings.Contains(msg, "404") {
		t.Errorf("second revoke: exit %d %q", code, msg)
	}
}

// TestProjectCommandsAndProjectTokens: an admin sets and deletes projects
// with `fleetd projects set|delete`; bad settings are usage errors; a
// token made with -project sees only that project and cannot change
// projects.
func TestProjectCommandsAndProjectTokens(t *testing.T) {
	d := startInProcessDaemon(t)
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		return code, out.String(), errb.String()
	}
	for _, c := range []struct {
		name string
		args []string
		code int
		want string // in stdout+stderr
	}{
		{"set without quota", []string{"projects", "set", "vision"}, exitUsage, "Usage: fleetd projects set"},
		{"set without name", []string{"projects", "set", "-quota", "2"}, exitUsage, "Usage: fleetd projects set"},
		{"quota above max", []string{"projects", "set", "vision", "-quota", "8", "-max", "4"}, exitUsage, "quota_gpus (8) must not exceed max_gpus (4)"},
		{"negative budget", []string{"projects", "set", "vision", "-quota", "2", "-budget-total", "-5"}, exitUsage, "total must not be negative"},
		{"bad name", []string{"projects", "set", "Vision", "-quota", "2"}, exitUsage, "not a valid project name"},
		{"create", []string{"projects", "set", "vision", "-quota", "2", "-max", "4", "-priority", "10", "-budget-total", "100"}, exitOK,
			"Project vision created: quota 2, max 4 GPUs, priority 10, budget $100.00 total (warn at 0.8, on exhausted pause)."},
		{"update", []string{"projects", "set", "vision", "-quota", "3", "-max", "4"}, exitOK, "Project vision updated: quota 3, max 4 GPUs, priority 0, no budget."},
		{"second project", []string{"projects", "set", "nlp", "-quota", "1"}, exitOK, "Project nlp created: quota 1, max 1 GPUs"},
		{"list", []string{"projects"}, exitOK, "vision   3      4"},
		{"token for an unknown project", []string{"token", "create", "-role", "read", "-project", "vison"}, exitError, `no project "vison"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, msg := cli(c.args...)
			if code != c.code || !strings.Contains(out+msg, c.want) {
				t.Fatalf("exit %d, want %d containing %q\nstdout: %s\nstderr: %s", code, c.code, c.want, out, msg)
			}
		})
	}
	if _, out, _ := cli("projects"); !strings.Contains(out, "admin") {
		t.Errorf("projects does not say the admin set them:\n%s", out)
	}

	code, secret, msg := cli("token", "create", "-role", "operate", "-project", "vision", "-name", "ci")
	secret = strings.TrimSpace(secret)
	if code != exitOK || !strings.Contains(msg, "limited to project vision") {
		t.Fatalf("create -project: exit %d %q %q", code, secret, msg)
	}
	if _, list, _ := cli("token", "list"); !strings.Contains(list, "vision") {
		t.Errorf("token list lacks the project:\n%s", list)
	}
	t.Setenv("FLEETD_TOKEN", secret)
	code, out, _ := cli("projects", "-json")
	var pr api.ProjectsResponse
	if code != exitOK || json.Unmarshal([]byte(out), &pr) != nil || len(pr.Projects) != 1 || pr.Projects[0].Name != "vision" {
		t.Errorf("projects with a vision token: exit %d\n%s", code, out)
	}
	if code, _, msg := cli("projects", "set", "vision", "-quota", "4", "-max", "4"); code != exitError || !strings.Contains(msg, "admin token") {
		t.Errorf("set with a project token: exit %d %q", code, msg)
	}
	if code, _, msg := cli("projects", "delete", "nlp"); code != exitError || !strings.Contains(msg, "403") {
		t.Errorf("delete with a project token: exit %d %q", code, msg)
	}
	t.Setenv("FLEETD_TOKEN", d.Token())

	if code, out, msg := cli("projects", "delete", "nlp"); code != exitOK || !strings.Contains(out, "Project nlp deleted.") {
		t.Fatalf("delete: exit %d %q %q", code, out, msg)
	}
	if code, _, msg := cli("projects", "delete", "nlp"); code != exitError || !strings.Contains(msg, "404") {
		t.Errorf("second delete: exit %d %q", code, msg)
	}
	if _, out, _ := cli("projects"); strings.Contains(out, "nlp") {
		t.Errorf("deleted project still listed:\n%s", out)
	}
}
