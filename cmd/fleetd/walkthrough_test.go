package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/aws/motoserver"
)

// A walkthrough page marks each fenced block with an HTML comment (which
// renders as nothing) saying what the test does with it:
//
//	<!-- walkthrough: run -->                 the next ```sh block runs in bash
//	<!-- walkthrough: file PATH -->           the next block is written to PATH
//	<!-- walkthrough: skip REASON -->         the next block is not run, for REASON
//	<!-- walkthrough: run-from DOC "HEADING" LANG -->
//	<!-- walkthrough: file-from PATH DOC "HEADING" LANG -->
//	                                          the first LANG block under HEADING of
//	                                          DOC (relative to docs/), run or written
//
// Every fenced block of the page must be marked, so none escapes the test.
type walkStep struct {
	kind string // run, file, skip
	path string // file: where to write
	body string
	line int // where the step's marker is
}

// awsForkScript keeps the aws CLI loaded between the page's commands.
var awsForkScript, _ = filepath.Abs(filepath.Join("testdata", "awsfork.py"))

// startAWSFork starts awsfork.py with the Python that has the aws CLI; the
// function it returns waits until it serves and gives the variables that
// make the steps' aws() use it: none (plain `aws`, slower) when no such
// Python is found.
func startAWSFork(t *testing.T, sock string) func() []string {
	t.Helper()
	var candidates []string
	if p, err := exec.LookPath("aws"); err == nil {
		if b, err := os.ReadFile(p); err == nil {
			if first, _, _ := strings.Cut(string(b), "\n"); strings.HasPrefix(first, "#!") && strings.Contains(first, "python") {
				candidates = append(candidates, strings.Fields(strings.TrimPrefix(first, "#!"))...)
			}
		}
	}
	candidates = append(candidates, "python3")
	py := ""
	for _, c := range candidates {
		// The real interpreter, not a version manager's shim script.
		out, err := exec.Command(c, "-c", "import sys, awscli.clidriver; print(sys.executable)").Output()
		if err == nil {
			py = strings.TrimSpace(string(out))
			break
		}
	}
	if py == "" {
		t.Log("no Python with the awscli package found: the steps run the aws command itself")
		return func() []string { return nil }
	}
	// Its environment does not matter: each command runs with its caller's.
	cmd := exec.Command(py, awsForkScript, "serve", sock)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	return func() []string {
		for i := 0; ; i++ {
			if _, err := os.Stat(sock); err == nil {
				return []string{"WALK_AWSFORK_PY=" + py, "WALK_AWSFORK_SOCK=" + sock}
			}
			select {
			case <-exited:
				t.Fatalf("awsfork.py exited:\n%s", logs.String())
			default:
			}
			if i > 300 {
				t.Fatalf("awsfork.py did not start in 30 s:\n%s", logs.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

var walkMarker = regexp.MustCompile(`^<!-- walkthrough: ([a-z-]+)\s*(.*?)\s*-->$`)

func parseWalkthrough(t *testing.T, docsDir, page string) []walkStep {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(docsDir, page))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	var steps []walkStep
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if strings.HasPrefix(line, "```") {
			t.Fatalf("%s:%d: a fenced block without a walkthrough marker before it", page, i+1)
		}
		m := walkMarker.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		st := walkStep{kind: m[1], line: i + 1}
		args := m[2]
		switch st.kind {
		case "run", "file", "skip":
			if st.kind == "file" {
				st.path = args
			}
			j := i + 1
			for j < len(lines) && strings.TrimSpace(lines[j]) == "" {
				j++
			}
			if j >= len(lines) || !strings.HasPrefix(lines[j], "```") {
				t.Fatalf("%s:%d: marker %q is not followed by a fenced block", page, i+1, line)
			}
			body, end := fencedBody(lines, j)
			st.body, i = body, end
		case "run-from", "file-from":
			f := splitQuoted(args)
			if st.kind == "file-from" {
				if len(f) != 4 {
					t.Fatalf("%s:%d: file-from wants PATH DOC \"HEADING\" LANG: %q", page, i+1, args)
				}
				st.path, f = f[0], f[1:]
			}
			if len(f) != 3 {
				t.Fatalf("%s:%d: %s wants DOC \"HEADING\" LANG: %q", page, i+1, st.kind, args)
			}
			st.body = blockUnder(t, filepath.Join(docsDir, f[0]), f[1], f[2])
			st.kind = strings.TrimSuffix(st.kind, "-from")
		default:
			t.Fatalf("%s:%d: unknown walkthrough marker %q", page, i+1, st.kind)
		}
		steps = append(steps, st)
	}
	return steps
}

// fencedBody returns the block opened at lines[open] and the index of its
// closing fence.
func fencedBody(lines []string, open int) (string, int) {
	var body []string
	for k := open + 1; k < len(lines); k++ {
		if strings.HasPrefix(lines[k], "```") {
			return strings.Join(body, "\n") + "\n", k
		}
		body = append(body, lines[k])
	}
	return strings.Join(body, "\n"), len(lines)
}

// blockUnder is the first ```lang block after the heading line in doc.
func blockUnder(t *testing.T, doc, heading, lang string) string {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != heading {
			continue
		}
		for j := i + 1; j < len(lines); j++ {
			if strings.HasPrefix(lines[j], "#") && !strings.HasPrefix(lines[j], "#!") && strings.HasPrefix(heading, strings.Repeat("#", strings.Count(strings.Fields(lines[j])[0], "#"))) {
				break // the next section of the same or a higher level
			}
			if strings.TrimSpace(lines[j]) == "```"+lang {
				body, _ := fencedBody(lines, j)
				return body
			}
		}
		break
	}
	t.Fatalf("%s: no ```%s block under %q", doc, lang, heading)
	return ""
}

// splitQuoted splits on spaces, keeping "quoted strings" whole.
func splitQuoted(s string) []string {
	var out []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		if s[0] == '"' {
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				return append(out, s)
			}
			out = append(out, s[1:end+1])
			s = s[end+2:]
			continue
		}
		f, rest, _ := strings.Cut(s, " ")
		out = append(out, f)
		s = rest
	}
	return out
}

// TestWalkthroughAWS follows docs/first-fleet-aws.md step by step against
// moto with the aws CLI and the real fleetd: the network, IAM and queue
// set-up, a `fleetd serve -config` started the way its systemd unit starts
// it, check, plan, apply (what EC2 was asked for is then checked in moto),
// status, destroy, and the backup and upgrade steps. The page's own
// "Not in the test" notes name what an emulator cannot show.
func TestWalkthroughAWS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs moto and the aws CLI")
	}
	if _, err := exec.LookPath("aws"); err != nil {
		t.Skip("the aws CLI is not on PATH (it comes with moto's Python environment; pip install awscli): the walkthrough's AWS steps cannot run")
	}
	docs, err := filepath.Abs(filepath.Join("..", "..", "docs"))
	if err != nil {
		t.Fatal(err)
	}
	steps := parseWalkthrough(t, docs, "first-fleet-aws.md")
	root := t.TempDir()
	awsForkReady := startAWSFork(t, filepath.Join(root, "aws.sock"))
	bin := fleetdBinary(t) // while the aws CLI loads
	began := time.Now()
	defer func() { t.Logf("walkthrough: %.1fs from moto's start to the last step", time.Since(began).Seconds()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	moto := motoserver.StartT(t)
	motoEnv(t, moto)
	// The aws CLI reads AWS_ENDPOINT_URL too; the page sets the region.
	t.Setenv("AWS_PAGER", "")

	dirs := map[string]string{}
	for _, d := range []string{"work", "bin", "etc", "data", "run"} {
		dirs[d] = filepath.Join(root, d)
		if err := os.MkdirAll(dirs[d], 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// The install steps (skipped: a release download) put fleetd in
	// /usr/local/bin; the upgrade step installs ./fleetd-linux-amd64.
	for _, dst := range []string{filepath.Join(dirs["bin"], "fleetd"), filepath.Join(dirs["work"], "fleetd-linux-amd64")} {
		copyFile(t, bin, dst, 0o755)
	}
	addr := freeAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	unit, err := os.ReadFile(filepath.Join("..", "..", "configs", "fleetd.service"))
	if err != nil {
		t.Fatal(err)
	}
	execStart := ""
	for _, l := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStart="); ok {
			execStart = v
		}
	}
	if execStart == "" {
		t.Fatal("configs/fleetd.service has no ExecStart")
	}
	// The page's host paths and addresses → this test's directories and a
	// loopback port. advertise_url stays what the page says: the nodes'
	// view, which only user-data shows here.
	paths := strings.NewReplacer("/var/lib/fleetd", dirs["data"], "/etc/fleetd", dirs["etc"], "/usr/local/bin", dirs["bin"])
	runSubst := func(s string) string {
		return strings.ReplaceAll(paths.Replace(s), "https://10.0.1.5:7777", "https://"+addr)
	}
	fileSubst := func(s string) string {
		return strings.ReplaceAll(paths.Replace(s), "0.0.0.0:7777", addr)
	}
	pidFile, daemonLog := filepath.Join(dirs["run"], "fleetd.pid"), filepath.Join(dirs["run"], "fleetd.log")
	t.Cleanup(func() { stopByPidFile(pidFile) })
	state := filepath.Join(dirs["run"], "shell-state")
	// sudo runs the command (the test is its own root); systemctl and
	// journalctl act on `fleetd serve` started as the unit's ExecStart
	// line, in its WorkingDirectory, with its output as the journal.
	prelude := fmt.Sprintf(`set -euo pipefail
[ -f %[1]q ] && . %[1]q
set -a
sudo() { "$@"; }
# aws-cli v1 sends SQS calls to queue.amazonaws.com whatever AWS_ENDPOINT_URL
# says, hence --endpoint-url; awsfork.py saves the CLI's start-up per call.
aws() {
  if [ -n "${WALK_AWSFORK_SOCK:-}" ]; then
    "$WALK_AWSFORK_PY" -S -E %[8]q call "$WALK_AWSFORK_SOCK" --endpoint-url "$AWS_ENDPOINT_URL" "$@"
  else
    command aws --endpoint-url "$AWS_ENDPOINT_URL" "$@"
  fi
}
_fleetd_start() {
  ( cd %[2]q && exec %[3]s ) </dev/null >>%[4]q 2>&1 &
  echo $! >%[5]q
  for _ in $(seq 150); do
    curl -fsk https://127.0.0.1:%[6]s/healthz >/dev/null 2>&1 && return 0
    kill -0 "$(cat %[5]q)" 2>/dev/null || break
    sleep 0.1
  done
  echo "walkthrough test: fleetd serve did not come up:" >&2; tail -n 30 %[4]q >&2; return 1
}
_fleetd_stop() {
  local pid; pid=$(cat %[5]q 2>/dev/null) || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  echo "walkthrough test: fleetd serve did not stop" >&2; return 1
}
systemctl() {
  case "$*" in
    daemon-reload) ;;
    "enable --now fleetd"|"start fleetd") _fleetd_start ;;
    "restart fleetd") _fleetd_stop; _fleetd_start ;;
    "stop fleetd") _fleetd_stop ;;
    *) echo "walkthrough test: systemctl $* is not emulated" >&2; return 1 ;;
  esac
}
journalctl() { tail -n 20 %[4]q; }
cd %[7]q
`, state, dirs["data"], paths.Replace(execStart), daemonLog, pidFile, port, dirs["work"], awsForkScript)
	// Assignments are exported (set -a) and saved for the next step.
	epilogue := fmt.Sprintf("\nexport -p | grep -v '^declare -[a-z]*r' >%q\n", state)
	// motoEnv blanks AWS_PROFILE and friends; the aws CLI takes an empty
	// profile for a name, so they are left out.
	var env []string
	for _, kv := range os.Environ() {
		if k, v, _ := strings.Cut(kv, "="); v == "" && strings.HasPrefix(k, "AWS_") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PATH="+dirs["bin"]+string(os.PathListSeparator)+os.Getenv("PATH"))
	env = append(env, awsForkReady()...)

	var ranApply, ranDestroy, ranExport bool
	for i, st := range steps {
		where := fmt.Sprintf("docs/first-fleet-aws.md:%d (step %d, %s)", st.line, i+1, st.kind)
		switch st.kind {
		case "skip":
			// The AMI step: moto's catalogue has an older Deep Learning AMI.
			if strings.Contains(st.body, "AMI=$(aws ec2 describe-images") {
				if err := appendState(state, "AMI", motoDeepLearningAMI(t, ctx, moto)); err != nil {
					t.Fatal(err)
				}
			}
			continue
		case "file":
			p := st.path
			if !filepath.IsAbs(p) {
				p = filepath.Join(dirs["work"], p)
			}
			p = paths.Replace(p)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(fileSubst(st.body)), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		script := prelude + runSubst(st.body) + epilogue
		began := time.Now()
		sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
		cmd := exec.CommandContext(sctx, "bash", "-c", script)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		scancel()
		t.Logf("%s, %.1fs:\n%s\n--- output\n%s", where, time.Since(began).Seconds(), st.body, out)
		if err != nil {
			log, _ := os.ReadFile(daemonLog)
			t.Fatalf("%s failed: %v\n%s\n--- daemon log (tail)\n%s", where, err, out, tail(string(log), 30))
		}
		switch {
		case strings.Contains(st.body, "fleetd apply"):
			ranApply = true
			checkWalkthroughLaunch(t, ctx, moto, readState(t, state))
		case strings.Contains(st.body, "fleetd destroy"):
			ranDestroy = true
			waitUntil(t, "no instance of fleet first left in moto", 60*time.Second, func() bool {
				return len(fleetInstances(t, ctx, moto, "first")) == 0
			})
		case strings.Contains(st.body, "fleetd state export"):
			ranExport = true
			exports, _ := filepath.Glob(filepath.Join(dirs["work"], "fleetd-state-*.jsonl"))
			if len(exports) != 1 {
				t.Fatalf("%s: state export files %v, want one", where, exports)
			}
			b, _ := os.ReadFile(exports[0])
			if !strings.Contains(string(b), `"first"`) {
				t.Errorf("%s: the export does not mention fleet first:\n%.500s", where, b)
			}
		}
	}
	if !ranApply || !ranDestroy || !ranExport {
		t.Fatalf("the page no longer runs apply (%v), destroy (%v) and state export (%v)", ranApply, ranDestroy, ranExport)
	}
}

// checkWalkthroughLaunch: what `fleetd apply` asked EC2 for, as moto
// recorded it. Nothing boots in moto, so this is as far as the nodes get.
func checkWalkthroughLaunch(t *testing.T, ctx context.Context, moto *motoserver.Server, vars map[string]string) {
	t.Helper()
	var insts []ec2types.Instance
	waitUntil(t, "a node of fleet first launched in moto", 30*time.Second, func() bool {
		insts = fleetInstances(t, ctx, moto, "first")
		return len(insts) >= 1
	})
	for _, in := range insts {
		id := awssdk.ToString(in.InstanceId)
		if in.InstanceLifecycle != ec2types.InstanceLifecycleTypeSpot {
			t.Errorf("%s lifecycle %q, want spot", id, in.InstanceLifecycle)
		}
		if sn := awssdk.ToString(in.SubnetId); sn != vars["SUBNET_A"] && sn != vars["SUBNET_B"] {
			t.Errorf("%s in subnet %s, want one of the walkthrough's %s %s", id, sn, vars["SUBNET_A"], vars["SUBNET_B"])
		}
		if len(in.SecurityGroups) != 1 || awssdk.ToString(in.SecurityGroups[0].GroupId) != vars["NODES_SG"] {
			t.Errorf("%s security groups %v, want only fleetd-nodes %s", id, in.SecurityGroups, vars["NODES_SG"])
		}
		if in.IamInstanceProfile == nil || !strings.HasSuffix(awssdk.ToString(in.IamInstanceProfile.Arn), "/fleetd-node") {
			t.Errorf("%s instance profile %v, want fleetd-node", id, in.IamInstanceProfile)
		}
		if awssdk.ToString(in.ImageId) != vars["AMI"] {
			t.Errorf("%s image %s, want %s", id, awssdk.ToString(in.ImageId), vars["AMI"])
		}
		ud, err := moto.EC2("us-east-1").DescribeInstanceAttribute(ctx, &ec2.DescribeInstanceAttributeInput{InstanceId: in.InstanceId, Attribute: ec2types.InstanceAttributeNameUserData})
		if err != nil || ud.UserData == nil {
			t.Fatalf("user data of %s: %v", id, err)
		}
		doc, _ := base64.StdEncoding.DecodeString(awssdk.ToString(ud.UserData.Value))
		for _, want := range []string{"#cloud-config", "https://10.0.1.5:7777/v1/agent/binary", "sha256sum -c", `"ca_fingerprint"`} {
			if !strings.Contains(string(doc), want) {
				t.Errorf("%s user-data lacks %q (the agent must reach advertise_url with the CA pinned):\n%.1500s", id, want, doc)
			}
		}
	}
}

// fleetInstances lists the pending and running instances moto holds for a
// fleet in us-east-1.
func fleetInstances(t *testing.T, ctx context.Context, moto *motoserver.Server, fleet string) []ec2types.Instance {
	t.Helper()
	resp, err := moto.EC2("us-east-1").DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
		{Name: awssdk.String("tag:" + providers.TagFleet), Values: []string{fleet}},
		{Name: awssdk.String("instance-state-name"), Values: []string{"pending", "running"}},
	}})
	if err != nil {
		t.Fatalf("moto DescribeInstances: %v", err)
	}
	var out []ec2types.Instance
	for _, r := range resp.Reservations {
		out = append(out, r.Instances...)
	}
	return out
}

// motoDeepLearningAMI is the newest "Deep Learning*" image moto's
// catalogue has for owner amazon.
func motoDeepLearningAMI(t *testing.T, ctx context.Context, moto *motoserver.Server) string {
	t.Helper()
	resp, err := moto.EC2("us-east-1").DescribeImages(ctx, &ec2.DescribeImagesInput{Owners: []string{"amazon"},
		Filters: []ec2types.Filter{{Name: awssdk.String("name"), Values: []string{"Deep Learning*"}}}})
	if err != nil || len(resp.Images) == 0 {
		t.Fatalf("moto has no Deep Learning AMI (%v)", err)
	}
	best := resp.Images[0]
	for _, im := range resp.Images[1:] {
		if awssdk.ToString(im.CreationDate) > awssdk.ToString(best.CreationDate) {
			best = im
		}
	}
	return awssdk.ToString(best.ImageId)
}

// readState reads the exported variables the steps left behind.
func readState(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	decl := regexp.MustCompile(`^declare -x ([A-Za-z_][A-Za-z0-9_]*)="(.*)"$`)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := decl.FindStringSubmatch(sc.Text()); m != nil {
			out[m[1]] = m[2]
		}
	}
	return out
}

// appendState sets a variable for the steps after a skipped one.
func appendState(path, name, value string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, "export %s=%s\n", name, strconv.Quote(value))
	return err
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// stopByPidFile stops the daemon a step started, if it still runs.
func stopByPidFile(pidFile string) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return
	}
	p, err := os.FindProcess(pid)
	if err != nil || p.Signal(syscall.Signal(0)) != nil {
		return
	}
	_ = p.Signal(syscall.SIGTERM)
	for i := 0; i < 100; i++ {
		if p.Signal(syscall.Signal(0)) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = p.Kill()
}

// TestWalkthroughGCPSpec: no emulator runs Compute Engine, so the GCP page
// is not followed end to end; its blocks must still be marked, and its
// fleet spec must pass the real `fleetd validate` (HCL, the gcp provider
// block's schema).
func TestWalkthroughGCPSpec(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	docs, err := filepath.Abs(filepath.Join("..", "..", "docs"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := 0
	for _, st := range parseWalkthrough(t, docs, "first-fleet-gcp.md") {
		switch st.kind {
		case "run":
			t.Fatalf("docs/first-fleet-gcp.md:%d: a run step, but nothing runs GCP commands here", st.line)
		case "file":
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(st.path)), []byte(st.body), 0o644); err != nil {
				t.Fatal(err)
			}
			files++
		}
	}
	if files != 1 {
		t.Fatalf("%d file steps, want the fleet spec", files)
	}
	cmd := exec.Command(fleetdBinary(t), "validate", "-var", "project=my-project", "first-fleet-gcp.hcl")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fleetd validate first-fleet-gcp.hcl: %v\n%s", err, out)
	} else if !strings.Contains(string(out), `fleet "first": valid`) {
		t.Fatalf("validate says:\n%s", out)
	}
}
