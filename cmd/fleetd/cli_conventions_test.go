package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/internal/freeport"
)

// clearClientEnv keeps the CLI's flag defaults (shown in help) independent
// of the environment the tests run in.
func clearClientEnv(t *testing.T) {
	for _, k := range []string{"FLEETD_ADDR", "FLEETD_TOKEN", "FLEETD_CACERT", "FLEETD_CA_FINGERPRINT"} {
		t.Setenv(k, "")
	}
}

// helpTopics are every page `fleetd help` can show: the visible commands
// and the subcommands of groups.
func helpTopics() []string {
	var topics []string
	for _, n := range visibleCommands() {
		topics = append(topics, n)
		if n == "completion" {
			continue
		}
		for _, s := range helpTexts[n].subs {
			topics = append(topics, n+" "+s)
		}
	}
	return topics
}

func TestHelpPages(t *testing.T) {
	clearClientEnv(t)
	for _, topic := range helpTopics() {
		t.Run(strings.ReplaceAll(topic, " ", "_"), func(t *testing.T) {
			if _, ok := helpTexts[topic]; !ok {
				t.Fatalf("no help text for %q: add it to helpTexts", topic)
			}
			words := strings.Fields(topic)
			out, errOut, code := runCmd(append([]string{"help"}, words...)...)
			if code != exitOK || errOut != "" {
				t.Fatalf("fleetd help %s: exit %d, stderr %q", topic, code, errOut)
			}
			if first := strings.SplitN(out, "\n", 2)[0]; !strings.HasPrefix(first, "Usage: fleetd "+topic) {
				t.Errorf("first line %q, want the usage line", first)
			}
			if i := strings.Index(out, "\nExamples:\n  "); i < 0 || !strings.Contains(out[i:], "fleetd") {
				t.Errorf("no examples in\n%s", out)
			}
			// Every spelling of -h gives the same page, with exit 0, also
			// after other arguments (flags may follow FILE).
			for _, h := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"x.hcl", "-h"}} {
				o, e, c := runCmd(append(append([]string{}, words...), h...)...)
				if c != exitOK || o != out || e != "" {
					t.Errorf("fleetd %s %v: exit %d, stderr %q, same page %v", topic, h, c, e, o == out)
				}
			}
			checkGolden(t, filepath.Join("help", strings.ReplaceAll(topic, " ", "_")+".golden"), []byte(out))
		})
	}
}

// TestCLIReferenceCoversEveryCommand keeps docs/cli.md's command table in
// step with the binary: every help topic has a row that starts with it.
func TestCLIReferenceCoversEveryCommand(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "| `fleetd ") {
			rows = append(rows, l)
		}
	}
	for _, topic := range helpTopics() {
		if !slices.ContainsFunc(rows, func(r string) bool {
			return strings.Contains(r, "`fleetd "+topic+" ") || strings.Contains(r, "`fleetd "+topic+"`")
		}) {
			t.Errorf("docs/cli.md has no row for `fleetd %s`", topic)
		}
	}
}

func TestHelpListsRealFlags(t *testing.T) {
	clearClientEnv(t)
	tests := []struct{ topic, flag string }{
		{"apply", "-var-file FILE"},
		{"plan", "-detailed-exitcode"},
		{"destroy", "-auto-approve"},
		{"destroy", "-wait"},
		{"validate", "-var-file FILE"},
		{"check", "-var-file FILE"},
		{"offerings", "-var-file FILE"},
		{"token create", "-role string"},
		{"sim", "-var-file FILE"},
	}
	for _, tt := range tests {
		out, _, _ := runCmd(append([]string{"help"}, strings.Fields(tt.topic)...)...)
		if !strings.Contains(out, "\n  "+tt.flag) {
			t.Errorf("help %s: no flag %q in\n%s", tt.topic, tt.flag, out)
		}
	}
}

func TestDidYouMean(t *testing.T) {
	tests := []struct {
		typed, want string
	}{
		{"aply", "apply"},
		{"aplpy", "apply"},
		{"destory", "destroy"},
		{"stauts", "status"},
		{"evnets", "events"},
		{"dest", "destroy"},
		{"valdate", "validate"},
		{"xyzzy", ""},
		{"a", ""},
		{"deploy", ""},
	}
	for _, tt := range tests {
		t.Run(tt.typed, func(t *testing.T) {
			if got := suggest(tt.typed); got != tt.want {
				t.Errorf("suggest(%q) = %q, want %q", tt.typed, got, tt.want)
			}
			_, errOut, code := runCmd(tt.typed)
			if code != exitUsage {
				t.Errorf("exit %d", code)
			}
			hint := "did you mean " + tt.want + "?"
			if tt.want != "" && !strings.Contains(errOut, hint) {
				t.Errorf("stderr %q lacks %q", errOut, hint)
			}
			if tt.want == "" && (strings.Contains(errOut, "did you mean") || !strings.Contains(errOut, "Commands:")) {
				t.Errorf("stderr %q: want the command list, no guess", errOut)
			}
		})
	}
	// help of a mistyped command guesses too.
	if _, errOut, code := runCmd("help", "aply"); code != exitUsage || !strings.Contains(errOut, "did you mean apply?") {
		t.Errorf("help aply: exit %d, %q", code, errOut)
	}
}

func TestVarFile(t *testing.T) {
	spec := writeTemp(t, "fleet.hcl", validSpec)
	dir := filepath.Dir(spec)
	write := func(name, src string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("prod.tfvars", "# comment\nnodes = 4\n")
	good2 := write("more.hcl", "nodes = 7\n")
	notLiteral := write("bad.tfvars", "nodes = 1\nnodes2 = var.x\n")
	block := write("block.tfvars", "fleet \"x\" {}\n")
	syntax := write("syntax.tfvars", "nodes = \n")
	undeclared := write("undeclared.tfvars", "gpus = 2\n")
	tests := []struct {
		name string
		args []string
		want string
		code int
	}{
		{"tfvars", []string{"-var-file", good, spec}, "nodes 1..4,", exitOK},
		{"after the file", []string{spec, "-var-file", good}, "nodes 1..4,", exitOK},
		{"later -var wins", []string{"-var-file", good, "-var", "nodes=5", spec}, "nodes 1..5,", exitOK},
		{"later file wins", []string{"-var", "nodes=5", "-var-file", good, spec}, "nodes 1..4,", exitOK},
		{"two files", []string{"-var-file", good, "-var-file", good2, spec}, "nodes 1..7,", exitOK},
		{"not a literal", []string{"-var-file", notLiteral, spec}, notLiteral + ":2:10", exitUsage},
		{"a block", []string{"-var-file", block, spec}, block + ":1:1", exitUsage},
		{"syntax", []string{"-var-file", syntax, spec}, syntax + ":1:", exitUsage},
		{"undeclared", []string{"-var-file", undeclared, spec}, "Value for undeclared variable", exitUsage},
		{"missing file", []string{"-var-file", filepath.Join(dir, "nope.tfvars"), spec}, "no such file", exitUsage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := runCmd(append([]string{"validate"}, tt.args...)...)
			if code != tt.code || !strings.Contains(out+errOut, tt.want) {
				t.Errorf("exit %d, want %d; want %q in\nstdout:\n%s\nstderr:\n%s", code, tt.code, tt.want, out, errOut)
			}
		})
	}
	// validate -json carries var-file diagnostics with their positions.
	out, _, code := runCmd("validate", "-json", "-var-file", notLiteral, spec)
	var res validateOutput
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != exitUsage || res.Valid || res.ErrorCount == 0 {
		t.Fatalf("validate -json: exit %d, %v, %+v", code, err, res)
	}
	if !strings.Contains(out, notLiteral) {
		t.Errorf("no position in %s", out)
	}
}

func TestParseVarFileValues(t *testing.T) {
	src := "s = \"a b\"\nn = 2.5\nb = true\nl = [\"x\", \"y\"]\nm = { k = 1 }\n"
	kvs, _, diags := parseVarFile("v.tfvars", []byte(src))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	want := []string{"s=a b", "n=2.5", "b=true", `l=["x", "y"]`, "m={ k = 1 }"}
	if strings.Join(kvs, "|") != strings.Join(want, "|") {
		t.Errorf("got %q, want %q", kvs, want)
	}
}

// fakeDaemon answers the few API calls the CLI tests need and records what
// was asked.
type fakeDaemon struct {
	mu       sync.Mutex
	calls    []string
	plan     api.Plan
	planCode int
	fleets   map[string]int // fleet → GETs left before it is gone (after delete)
	deleted  map[string]bool
	// summaries and details, when set, are the status and fleet answers.
	summaries []api.FleetSummary
	details   map[string]api.FleetDetail
}

func (f *fakeDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r.Method+" "+r.URL.Path)
	name := strings.TrimPrefix(r.URL.Path, "/v1/fleets/")
	switch {
	case r.URL.Path == "/v1/plan":
		if f.planCode != 0 {
			w.WriteHeader(f.planCode)
			json.NewEncoder(w).Encode(api.Error{Error: "provider aws: auth: credentials expired"})
			return
		}
		json.NewEncoder(w).Encode(f.plan)
	case r.URL.Path == "/v1/events":
		json.NewEncoder(w).Encode(api.EventsResponse{Events: []state.Event{{Seq: 1, Fleet: "bert", Type: "fleet.applied"}}, Next: 1})
	case r.URL.Path == "/v1/status" && f.summaries != nil:
		json.NewEncoder(w).Encode(api.Status{Fleets: f.summaries})
	case strings.HasSuffix(r.URL.Path, "/logs"):
		// The real daemon answers [] for any name, a fleet or not.
		w.Write([]byte("[]"))
	case f.details != nil && strings.HasPrefix(r.URL.Path, "/v1/fleets/"):
		json.NewEncoder(w).Encode(f.details[name])
	case r.URL.Path == "/v1/status":
		var st api.Status
		for n := range f.fleets {
			st.Fleets = append(st.Fleets, api.FleetSummary{Name: n})
		}
		sort.Slice(st.Fleets, func(i, j int) bool { return st.Fleets[i].Name < st.Fleets[j].Name })
		json.NewEncoder(w).Encode(st)
	case strings.HasPrefix(r.URL.Path, "/v1/fleets/"):
		left, ok := f.fleets[name]
		if !ok || (f.deleted[name] && left <= 0) {
			w.WriteHeader(http.StatusNotFound)
			// The real daemon's words, which name the fleet twice.
			json.NewEncoder(w).Encode(api.Error{Error: fmt.Sprintf("fleet %q: fleet %q: not found", name, name)})
			return
		}
		if r.Method == http.MethodDelete {
			f.deleted[name] = true
			json.NewEncoder(w).Encode(api.FleetSummary{Name: name})
			return
		}
		if f.deleted[name] {
			f.fleets[name] = left - 1
		}
		json.NewEncoder(w).Encode(api.FleetDetail{FleetSummary: api.FleetSummary{Name: name, NodesByState: map[string]int{"draining": left}},
			Nodes: []api.NodeInfo{{ID: name + "-0", State: "running"}, {ID: name + "-1", State: "running"}}})
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeDaemon) start(t *testing.T) string {
	if f.fleets == nil {
		f.fleets = map[string]int{}
	}
	f.deleted = map[string]bool{}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	clearClientEnv(t)
	t.Setenv("FLEETD_ADDR", srv.URL)
	return srv.URL
}

func TestPlanDetailedExitcode(t *testing.T) {
	spec := writeTemp(t, "fleet.hcl", validSpec)
	tests := []struct {
		name     string
		plan     api.Plan
		planCode int
		args     []string
		code     int
	}{
		{"no changes", api.Plan{Fleets: []api.FleetPlan{{Fleet: "small", Action: api.ActionNoop}}}, 0, nil, 0},
		{"create", api.Plan{Fleets: []api.FleetPlan{{Fleet: "small", Action: api.ActionCreate, Launch: 1}}}, 0, nil, 2},
		{"noop but launches", api.Plan{Fleets: []api.FleetPlan{{Fleet: "small", Action: api.ActionNoop, Launch: 1}}}, 0, nil, 2},
		{"daemon error", api.Plan{}, http.StatusBadGateway, nil, 1},
		{"spec error", api.Plan{}, 0, []string{"-var", "nodes=lots"}, 1},
		{"without the flag, changes are 0", api.Plan{Fleets: []api.FleetPlan{{Fleet: "small", Action: api.ActionCreate}}}, 0, []string{"-detailed-exitcode=false"}, 0},
		{"without the flag, spec errors are 2", api.Plan{}, 0, []string{"-detailed-exitcode=false", "-var", "nodes=lots"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			(&fakeDaemon{plan: tt.plan, planCode: tt.planCode}).start(t)
			args := append([]string{"plan", "-detailed-exitcode"}, tt.args...)
			out, errOut, code := runCmd(append(args, spec)...)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, out, errOut)
			}
		})
	}
}

func TestDestroyConfirmation(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		stdin   string
		code    int
		deleted bool
		want    string
	}{
		{"fleet name", nil, "bert\n", exitOK, true, "is being destroyed"},
		{"yes", nil, "yes\n", exitOK, true, "is being destroyed"},
		{"no", nil, "no\n", exitError, false, "destroy cancelled"},
		{"another name", nil, "gpt\n", exitError, false, "destroy cancelled"},
		{"no input, no terminal", nil, "", exitError, false, "pass -auto-approve"},
		{"auto-approve", []string{"-auto-approve"}, "", exitOK, true, "is being destroyed"},
		{"unknown fleet", []string{"nope"}, "yes\n", exitError, false, `unknown fleet "nope"`},
		{"unknown fleet, auto-approve", []string{"-auto-approve", "nope"}, "", exitError, false, `unknown fleet "nope"`},
		{"wait", []string{"-auto-approve", "-wait"}, "", exitOK, true, `Fleet "bert" destroyed in`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fd := &fakeDaemon{fleets: map[string]int{"bert": 2}}
			fd.start(t)
			args := tt.args
			if len(args) == 0 || strings.HasPrefix(args[len(args)-1], "-") {
				args = append(args, "bert")
			}
			var out, errb strings.Builder
			code := destroy(args, strings.NewReader(tt.stdin), &out, &errb)
			if code != tt.code || !strings.Contains(out.String()+errb.String(), tt.want) {
				t.Errorf("exit %d, want %d; want %q in\nstdout:\n%s\nstderr:\n%s", code, tt.code, tt.want, out.String(), errb.String())
			}
			name := args[len(args)-1]
			fd.mu.Lock()
			got := fd.deleted[name]
			fd.mu.Unlock()
			if got != tt.deleted {
				t.Errorf("destroyed: %v, want %v", got, tt.deleted)
			}
			// An error is said once.
			if n := strings.Count(errb.String(), "Error:"); n > 1 {
				t.Errorf("%d errors in %q", n, errb.String())
			}
		})
	}
}

func TestDestroyWaitJSON(t *testing.T) {
	(&fakeDaemon{fleets: map[string]int{"bert": 2}}).start(t)
	var out, errb strings.Builder
	if code := destroy([]string{"-auto-approve", "-wait", "-json", "bert"}, strings.NewReader(""), &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q is not one JSON object: %v", l, err)
		}
	}
	var last map[string]any
	json.Unmarshal([]byte(lines[len(lines)-1]), &last)
	if last["destroyed"] != true {
		t.Errorf("last line %v", last)
	}
}

func TestConnectionErrorHints(t *testing.T) {
	clearClientEnv(t)
	// A port nothing listens on. From freeport, not a closed ":0"
	// listener: the kernel hands ":0" ports out again, and the TLS server
	// below (or a parallel test's daemon) took one in CI.
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + addr
	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler())
	defer tlsSrv.Close()
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"refused", []string{"status", "-addr", closed}, []string{"connection refused", "Hint:", "fleetd serve", "FLEETD_ADDR"}},
		{"unknown CA", []string{"status", "-addr", tlsSrv.URL}, []string{"unknown authority", "Hint:", "-ca-cert", "-ca-fingerprint"}},
		{"refused in logs", []string{"logs", "-addr", closed, "bert"}, []string{"Hint:", "fleetd serve"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, code := runCmd(tt.args...)
			if code != exitError {
				t.Errorf("exit %d", code)
			}
			for _, w := range tt.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut)
				}
			}
			if strings.Count(errOut, "Hint:") != 1 {
				t.Errorf("want one hint:\n%s", errOut)
			}
		})
	}
}

func TestUnknownFleetIsAnError(t *testing.T) {
	(&fakeDaemon{fleets: map[string]int{"bert": 1}}).start(t)
	for _, args := range [][]string{
		{"logs", "nope"},
		{"events", "-fleet", "nope"},
		{"status", "nope"},
	} {
		_, errOut, code := runCmd(args...)
		if code != exitError || strings.Count(errOut, "nope") != 1 || !strings.Contains(errOut, `unknown fleet "nope"`) {
			t.Errorf("%v: exit %d, stderr %q (want the error once)", args, code, errOut)
		}
	}
}

// completionCase: the words typed so far (the last one being completed) and
// what must be offered.
type completionCase struct {
	name  string
	words []string
	want  []string // all offered (order aside), or...
	has   []string // ...at least these
}

var completionCases = []completionCase{
	{"commands", []string{"fleetd", "ap"}, []string{"apply"}, nil},
	{"commands d", []string{"fleetd", "de"}, []string{"debug", "destroy"}, nil},
	{"help topic", []string{"fleetd", "help", "pl"}, []string{"plan"}, nil},
	{"flags", []string{"fleetd", "plan", "-d"}, []string{"-detailed-exitcode"}, nil},
	{"flags after file", []string{"fleetd", "apply", "x.hcl", "-auto"}, []string{"-auto-approve"}, nil},
	{"destroy flags", []string{"fleetd", "destroy", "-"}, nil, []string{"-auto-approve", "-wait", "-json", "-addr"}},
	{"fleet names", []string{"fleetd", "destroy", ""}, []string{"bert", "gpt"}, nil},
	{"fleet names prefix", []string{"fleetd", "status", "g"}, []string{"gpt"}, nil},
	{"fleet after flag", []string{"fleetd", "logs", "-f", "b"}, []string{"bert"}, nil},
	{"fleet after a flag's value", []string{"fleetd", "logs", "-n", "20", "g"}, []string{"gpt"}, nil},
	{"flag value is no fleet", []string{"fleetd", "logs", "-n", ""}, []string{}, nil},
	{"after the fleet, nothing", []string{"fleetd", "logs", "-n", "20", "bert", "-f", ""}, []string{}, nil},
	{"events -fleet", []string{"fleetd", "events", "-fleet", ""}, []string{"bert", "gpt"}, nil},
	{"second positional", []string{"fleetd", "destroy", "bert", ""}, []string{}, nil},
	{"spec files", []string{"fleetd", "plan", ""}, []string{"sub", "train.hcl"}, nil},
	{"var-file", []string{"fleetd", "apply", "-var-file", "p"}, []string{"prod.tfvars"}, nil},
	{"value flag", []string{"fleetd", "apply", "-timeout", ""}, []string{}, nil},
	{"subcommands", []string{"fleetd", "token", ""}, []string{"create", "list", "revoke"}, nil},
	{"subcommand flags", []string{"fleetd", "token", "create", "-r"}, []string{"-role"}, nil},
	{"role words", []string{"fleetd", "token", "create", "-role", ""}, []string{"operate", "read"}, nil},
	{"debug interrupt fleet", []string{"fleetd", "debug", "interrupt", ""}, []string{"bert", "gpt"}, nil},
	{"completion shells", []string{"fleetd", "completion", ""}, []string{"bash", "zsh"}, nil},
}

// completionDir makes a directory with files to complete.
func completionDir(t *testing.T) string {
	dir := t.TempDir()
	for _, f := range []string{"train.hcl", "notes.txt", "prod.tfvars", "sub/a.hcl"} {
		p := filepath.Join(dir, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, nil, 0o644)
	}
	return dir
}

func checkCompletion(t *testing.T, tc completionCase, got []string) {
	t.Helper()
	sort.Strings(got)
	if tc.want != nil {
		want := append([]string{}, tc.want...)
		sort.Strings(want)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%v: got %q, want %q", tc.words, got, want)
		}
	}
	for _, h := range tc.has {
		if !contains(got, h) {
			t.Errorf("%v: %q not offered in %q", tc.words, h, got)
		}
	}
}

// completionScript finds shell on PATH (the test skips without it), checks
// `fleetd completion SHELL` against its golden file and writes it to a
// file called name; dir is the completion test's working directory.
func completionScript(t *testing.T, shell, name string) (shellPath, script, dir string) {
	t.Helper()
	shellPath, err := exec.LookPath(shell)
	if err != nil {
		t.Skip("no " + shell)
	}
	clearClientEnv(t)
	out, _, code := runCmd("completion", shell)
	if code != exitOK {
		t.Fatal(code)
	}
	checkGolden(t, "completion."+shell+".golden", []byte(out))
	dir = completionDir(t)
	script = filepath.Join(t.TempDir(), name)
	os.WriteFile(script, []byte(out), 0o644)
	return shellPath, script, dir
}

// TestBashCompletion runs the script in bash, with `fleetd` a shell function
// standing in for the daemon lookup (the lookup itself is
// TestCompletionFleets).
func TestBashCompletion(t *testing.T) {
	bash, script, dir := completionScript(t, "bash", "fleetd.bash")
	for _, tc := range completionCases {
		t.Run(tc.name, func(t *testing.T) {
			words := make([]string, len(tc.words))
			for i, w := range tc.words {
				words[i] = shellQuote(w)
			}
			prog := "source " + shellQuote(script) + "\n" +
				"fleetd() { [[ $1 == completion && $2 == fleets ]] && printf 'bert\\ngpt\\n'; }\n" +
				"COMP_WORDS=(" + strings.Join(words, " ") + ")\n" +
				"COMP_CWORD=" + itoa(len(words)-1) + "\n" +
				"_fleetd\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
			cmd := exec.Command(bash, "--norc", "--noprofile", "-c", prog)
			cmd.Dir = dir
			b, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, b)
			}
			checkCompletion(t, tc, nonEmptyLines(string(b)))
		})
	}
}

// TestZshCompletion runs the script's function in zsh with compadd,
// _describe and _files replaced by functions that print what they would
// offer, so the dispatch logic is what is tested.
func TestZshCompletion(t *testing.T) {
	zsh, script, dir := completionScript(t, "zsh", "_fleetd")
	if b, err := exec.Command(zsh, "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("zsh -n: %v: %s", err, b)
	}
	stubs := `
fleetd() { [[ $1 == completion && $2 == fleets ]] && printf 'bert\ngpt\n'; }
compdef() { : }
compadd() { [[ $1 == -- ]] && shift; local w; for w in "$@"; do [[ $w == ${cur}* ]] && print -r -- $w; done; }
_describe() { local w arr=${@[-1]}; for w in "${(@P)arr}"; do w=${w%%:*}; [[ $w == ${words[CURRENT]}* ]] && print -r -- $w; done; }
_files() {
  local pat='*'
  [[ $1 == -g ]] && pat=$2
  local f
  if [[ $1 == -/ ]]; then for f in ${cur}*(N/); do print -r -- $f; done; return; fi
  for f in ${cur}*(N/) ${~cur}${~pat}(N.); do print -r -- $f; done
}
`
	for _, tc := range completionCases {
		t.Run(tc.name, func(t *testing.T) {
			words := make([]string, len(tc.words))
			for i, w := range tc.words {
				words[i] = shellQuote(w)
			}
			prog := stubs + "source " + shellQuote(script) + "\n" +
				"words=(" + strings.Join(words, " ") + ")\n" +
				"CURRENT=" + itoa(len(words)) + "\n" +
				"cur=${words[CURRENT]}\n" +
				"_fleetd\n"
			cmd := exec.Command(zsh, "-f", "-c", prog)
			cmd.Dir = dir
			b, err := cmd.CombinedOutput()
			if err != nil && len(b) > 0 && strings.Contains(string(b), "zsh:") {
				t.Fatalf("%v: %s", err, b)
			}
			got := nonEmptyLines(string(b))
			// _files lists directories with their slash-less names in the
			// stub; the real _files adds the slash.
			checkCompletion(t, tc, got)
		})
	}
}

func TestCompletionFleets(t *testing.T) {
	(&fakeDaemon{fleets: map[string]int{"bert": 1, "gpt": 1}}).start(t)
	out, _, code := runCmd("completion", "fleets")
	if code != exitOK || out != "bert\ngpt\n" {
		t.Errorf("exit %d, %q", code, out)
	}
	// No daemon: nothing printed, quickly.
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("FLEETD_ADDR", "http://"+addr)
	out, errOut, code := runCmd("completion", "fleets")
	if code != exitError || out != "" || errOut != "" {
		t.Errorf("without a daemon: exit %d, %q, %q", code, out, errOut)
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func nonEmptyLines(s string) []string {
	out := []string{}
	for _, l := range strings.Split(s, "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

func TestApplyWaitProgress(t *testing.T) {
	alert := api.AlertInfo{Kind: "quota", Subject: "aws/us-east-1/p4d.24xlarge/spot", Message: "GPU quota exceeded; backing off 30m"}
	stuck := api.FleetSummary{Name: "bert", TargetNodes: 2, NodesByState: map[string]int{"running": 1, "booting": 1}, AlertCount: 1}
	done := api.FleetSummary{Name: "bert", TargetNodes: 2, NodesByState: map[string]int{"running": 2}}
	tests := []struct {
		name    string
		fleet   api.FleetSummary
		json    bool
		wantErr bool
		want    []string
	}{
		{"timeout names the alert and shows the last state", stuck, false, true,
			[]string{"bert: 1/2 running", "waiting on alert quota aws/us-east-1/p4d.24xlarge/spot (fleet bert): GPU quota exceeded", "Last state:", "bert"}},
		{"timeout, json", stuck, true, true, []string{`"converged":false`, `"last_state":[`, `"kind":"quota"`}},
		{"converged", done, false, false, []string{"bert: 2/2 running", "All fleets converged in"}},
		{"converged, json", done, true, false, []string{`"running":2`, `"converged":true`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fd := &fakeDaemon{summaries: []api.FleetSummary{tt.fleet},
				details: map[string]api.FleetDetail{"bert": {FleetSummary: tt.fleet, Alerts: []api.AlertInfo{alert}}}}
			url := fd.start(t)
			c, err := api.NewClient(url, api.ClientOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			err = waitConverged(t.Context(), c, []string{"bert"}, 1500*time.Millisecond, tt.json, &out)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("no %q in\n%s", w, out.String())
				}
			}
			if tt.json {
				for _, l := range nonEmptyLines(out.String()) {
					var ev progressEvent
					if err := json.Unmarshal([]byte(l), &ev); err != nil {
						t.Errorf("line %q: %v", l, err)
					}
				}
			}
		})
	}
}

func TestValidateJSONDurationsInSeconds(t *testing.T) {
	out, errOut, code := runCmd("validate", "-json", filepath.Join("..", "..", "configs", "examples", "aws.hcl"))
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Fleets []map[string]any `json:"fleets"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Fleets) == 0 {
		t.Fatalf("%v: %s", err, out)
	}
	training, _ := doc.Fleets[0]["training"].(map[string]any)
	if g, ok := training["drain_grace_seconds"].(float64); !ok || g <= 0 || g > 3600 {
		t.Errorf("training.drain_grace_seconds = %v in %v", training["drain_grace_seconds"], training)
	}
	if _, ok := training["drain_grace"]; ok {
		t.Error("drain_grace in nanoseconds is still there")
	}
}

func TestSecondsJSON(t *testing.T) {
	type inner struct {
		Wait time.Duration `json:"wait"`
	}
	type Embedded struct {
		Grace time.Duration `json:"grace,omitempty"`
	}
	type outer struct {
		Embedded
		Name    string           `json:"name"`
		Every   time.Duration    `json:"every"`
		Skip    time.Duration    `json:"-"`
		Inner   *inner           `json:"inner"`
		List    []inner          `json:"list"`
		ByName  map[string]inner `json:"by_name"`
		Untaged time.Duration
	}
	v := outer{Embedded: Embedded{Grace: 1500 * time.Millisecond}, Name: "x", Every: time.Minute, Skip: time.Hour,
		Inner: &inner{Wait: 2 * time.Second}, List: []inner{{Wait: time.Second}}, ByName: map[string]inner{"a": {Wait: 3 * time.Second}}, Untaged: time.Second}
	got, err := secondsJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(got)
	want := `{"Untaged_seconds":1,"by_name":{"a":{"wait_seconds":3}},"every_seconds":60,"grace_seconds":1.5,"inner":{"wait_seconds":2},"list":[{"wait_seconds":1}],"name":"x"}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
}

// TestPluginLogsFollowLogJSON: what the plugin manager and go-plugin log
// (including a plugin's stderr, re-logged through StandardWriter) comes out
// in serve's format and level.
func TestPluginLogsFollowLogJSON(t *testing.T) {
	for _, asJSON := range []bool{true, false} {
		var b strings.Builder
		log, err := newLogger(&b, "info", asJSON)
		if err != nil {
			t.Fatal(err)
		}
		pl := pluginLogger(log, "info")
		pl.Named("aws").Info("plugin started", "pid", 42)
		pl.Debug("not shown at info")
		w := pl.StandardWriter(&hclog.StandardLoggerOptions{InferLevels: true})
		w.Write([]byte("[WARN] provider aws: throttled\n"))
		lines := nonEmptyLines(b.String())
		if len(lines) != 2 {
			t.Fatalf("json %v: %d lines:\n%s", asJSON, len(lines), b.String())
		}
		if !asJSON {
			if !strings.Contains(lines[0], `msg="plugin started"`) || !strings.Contains(lines[0], "logger=plugins.aws") {
				t.Errorf("text line %q", lines[0])
			}
			continue
		}
		var first, second map[string]any
		if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
			t.Fatalf("%q: %v", lines[0], err)
		}
		if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
			t.Fatalf("%q: %v", lines[1], err)
		}
		if first["msg"] != "plugin started" || first["logger"] != "plugins.aws" || first["pid"] != float64(42) || first["level"] != "INFO" {
			t.Errorf("first %v", first)
		}
		if second["level"] != "WARN" || !strings.Contains(fmt.Sprint(second["msg"]), "throttled") {
			t.Errorf("second %v", second)
		}
	}
}

func TestIsTerminal(t *testing.T) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	// /dev/null is a character device, but no terminal: destroy must not
	// wait for an answer there.
	for name, in := range map[string]any{"/dev/null": null, "pipe": r, "reader": strings.NewReader("")} {
		if isTerminal(in.(interface{ Read([]byte) (int, error) })) {
			t.Errorf("%s is taken for a terminal", name)
		}
	}
	var out, errb strings.Builder
	(&fakeDaemon{fleets: map[string]int{"bert": 1}}).start(t)
	if code := destroy([]string{"bert"}, null, &out, &errb); code != exitError || !strings.Contains(errb.String(), "pass -auto-approve") {
		t.Errorf("destroy with stdin /dev/null: exit %d, %q", code, errb.String())
	}
}

func TestApplyConfirmation(t *testing.T) {
	spec := writeTemp(t, "fleet.hcl", validSpec)
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	tests := []struct {
		name string
		args []string
		in   io.Reader
		code int
		want string
	}{
		{"no answer, no terminal", nil, null, exitError, "pass -auto-approve"},
		{"no", nil, strings.NewReader("no\n"), exitError, "Apply cancelled."},
		{"-json without -auto-approve", []string{"-json"}, strings.NewReader("yes\n"), exitUsage, "-json needs -auto-approve"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			(&fakeDaemon{plan: api.Plan{Fleets: []api.FleetPlan{{Fleet: "small", Action: api.ActionCreate}}}}).start(t)
			var out, errb strings.Builder
			code := apply(append(tt.args, spec), tt.in, &out, &errb)
			if code != tt.code || !strings.Contains(errb.String(), tt.want) {
				t.Errorf("exit %d, want %d; want %q in %q", code, tt.code, tt.want, errb.String())
			}
		})
	}
}
