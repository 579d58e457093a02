package local

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/procstat"

	"github.com/fleetd/fleetd/providers"
	"golang.org/x/sys/unix"
)

func gzB64(s string) string {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, _ = w.Write([]byte(s))
	_ = w.Close()
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

func TestParseCloudConfig(t *testing.T) {
	cases := []struct {
		name    string
		doc     string
		wantErr string
	}{
		{"empty document", "#cloud-config\n", ""},
		{"crlf header", "#cloud-config\r\nwrite_files: []\r\n", ""},
		{"other modules ignored", "#cloud-config\npackages: [htop]\nusers: [default]\n", ""},
		{"unquoted octal permissions", "#cloud-config\nwrite_files:\n  - path: /a\n    permissions: 0644\n    content: x\n", ""},
		{"0o permissions", "#cloud-config\nwrite_files:\n  - path: /a\n    permissions: '0o600'\n    content: x\n", ""},
		{"no header", "write_files: []\n", "#cloud-config"},
		{"shell script", "#!/bin/bash\n", "#cloud-config"},
		{"relative path", "#cloud-config\nwrite_files:\n  - path: a/b\n    content: x\n", "absolute"},
		{"root path", "#cloud-config\nwrite_files:\n  - path: /\n    content: x\n", "root"},
		{"bad base64", "#cloud-config\nwrite_files:\n  - path: /a\n    encoding: b64\n    content: '!!!'\n", "base64"},
		{"gzip not gzip", "#cloud-config\nwrite_files:\n  - path: /a\n    encoding: gz+b64\n    content: aGVsbG8=\n", "gzip"},
		{"decimal permissions", "#cloud-config\nwrite_files:\n  - path: /a\n    permissions: '0999'\n    content: x\n", "permissions"},
		{"write_files not a list", "#cloud-config\nwrite_files: hello\n", "user-data"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseCloudConfig([]byte(c.doc))
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, c.wantErr)
			}
		})
	}
}

func TestWriteFilesStaysInRoot(t *testing.T) {
	doc := "#cloud-config\nwrite_files:\n" +
		"  - path: /etc/fleetd/agent.json\n    content: '{}'\n" +
		"  - path: /../../escape.txt\n    content: caught\n" +
		"  - path: /var/lib/x/data.bin\n    encoding: gzip+base64\n    permissions: '0640'\n    content: " + gzB64("unzipped") + "\n" +
		"  - path: /var/log/app.log\n    content: \"one\\n\"\n" +
		"  - path: /var/log/app.log\n    append: true\n    content: \"two\\n\"\n" +
		"  - path: /opt/plain.txt\n    encoding: text/plain\n    owner: root:root\n    defer: true\n    content: plain\n"
	cc, err := parseCloudConfig([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	root := filepath.Join(base, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cc.writeFiles(root); err != nil {
		t.Fatal(err)
	}
	check := func(rel, want string, mode os.FileMode) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil || string(b) != want {
			t.Fatalf("%s = %q, %v; want %q", rel, b, err, want)
		}
		if fi, _ := os.Stat(filepath.Join(root, rel)); fi.Mode().Perm() != mode {
			t.Fatalf("%s mode %v, want %v", rel, fi.Mode().Perm(), mode)
		}
	}
	check("escape.txt", "caught", 0o644) // ".." cannot climb out of the node
	check("var/lib/x/data.bin", "unzipped", 0o640)
	check("var/log/app.log", "one\ntwo\n", 0o644)
	check("opt/plain.txt", "plain", 0o644)
	if _, err := os.Stat(filepath.Join(base, "escape.txt")); !os.IsNotExist(err) {
		t.Fatal("a write_files entry escaped the node root")
	}
}

func TestDecodeSettings(t *testing.T) {
	s, err := decodeSettings(providers.Config{})
	if err != nil {
		t.Fatal(err)
	}
	offs := s.offerings(nil)
	if len(offs) != 4 || s.NoticeLead != 120*time.Second || s.AddressPrefix != "127.0.10." {
		t.Fatalf("defaults: %+v, %d offerings", s, len(offs))
	}
	want := providers.Offering{Provider: "local", Region: "local", Zone: "local-a", InstanceType: "local.gpu1", CapacityType: providers.Spot,
		PricePerHour: 0.30, GPUs: 1, GPUType: "sim", VCPUs: 2, MemoryGiB: 4, Available: -1}
	if offs[0] != want || offs[1].CapacityType != providers.OnDemand || offs[1].PricePerHour != 1.00 || offs[2].Zone != "local-b" {
		t.Fatalf("default offerings: %+v", offs)
	}

	s, err = decodeSettings(providers.Config{Raw: json.RawMessage(`{"zones":["z1"],"instance_types":{"big":{"gpus":8,"spot_price":2.5,"on_demand_price":9}},"capacity":{"z1":3},"notice_lead":"30s","address_prefix":"127.1.2."}`)})
	if err != nil {
		t.Fatal(err)
	}
	offs = s.offerings(map[string]int{"z1": 1})
	if len(offs) != 2 || offs[0].GPUs != 8 || offs[0].VCPUs != 16 || offs[0].MemoryGiB != 32 || offs[0].Available != 2 || offs[1].Available != -1 || s.NoticeLead != 30*time.Second {
		t.Fatalf("custom offerings: %+v", offs)
	}

	for name, raw := range map[string]string{
		"unknown attribute":    `{"zone":"a"}`,
		"unknown type field":   `{"instance_types":{"x":{"gpu":1,"spot_price":1,"on_demand_price":2}}}`,
		"missing price":        `{"instance_types":{"x":{"gpus":1}}}`,
		"duplicate zone":       `{"zones":["a","a"]}`,
		"capacity bad zone":    `{"capacity":{"local-c":1}}`,
		"negative capacity":    `{"capacity":{"local-a":-1}}`,
		"bad notice lead":      `{"notice_lead":"2 minutes"}`,
		"non-loopback prefix":  `{"address_prefix":"10.0.0."}`,
		"prefix without dot":   `{"address_prefix":"127.0.10"}`,
		"prefix too short":     `{"address_prefix":"127.0."}`,
		"capacity not integer": `{"capacity":{"local-a":1.5}}`,
	} {
		if _, err := decodeSettings(providers.Config{Raw: json.RawMessage(raw)}); !providers.IsInvalidConfig(err) {
			t.Errorf("%s: err = %v, want invalid config", name, err)
		}
	}
}

func TestReadStatAndAlive(t *testing.T) {
	st, err := procstat.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// The session id may be 0 when the test runs in a container whose
	// session leader lives outside our pid namespace, so compare it with
	// the kernel's own answer rather than expect a positive number.
	sid, err := unix.Getsid(0)
	if err != nil {
		t.Fatal(err)
	}
	if st.State == 'Z' || st.Start == 0 || st.Session != sid {
		t.Fatalf("own stat %+v, getsid %d", st, sid)
	}
	if !alive(os.Getpid(), st.Start) || alive(os.Getpid(), st.Start+1) || alive(0, 0) {
		t.Fatal("alive() does not tell a process from a reused pid")
	}

	// A session leader we start ourselves must read as leading its session.
	child := exec.Command("sleep", "30")
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	cst, err := procstat.Read(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if cst.Session != child.Process.Pid {
		t.Fatalf("child stat %+v, want session %d", cst, child.Process.Pid)
	}
}

// TestSessionSweep starts a process in a new session whose child moves to
// a process group of its own (as workers will): a process-group kill
// would miss the child, the session sweep must not.
func TestSessionSweep(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// See TestMain (main_test.go): this mode starts a child with Setpgid
	// and reaps it when it dies.
	cmd := exec.Command(exe, "test-pgroup-tree")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sid := cmd.Process.Pid
	defer cmd.Wait()
	defer signalSession(sid, 0, syscall.SIGKILL)
	buf := make([]byte, 32)
	n, _ := out.Read(buf)
	child, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		t.Fatalf("child pid %q", buf[:n])
	}
	start, _ := startTime(sid)
	cst, err := procstat.Read(child)
	if err != nil || cst.Session != sid {
		t.Fatalf("child %d not in session %d: %+v %v", child, sid, cst, err)
	}
	if pgid, _ := syscall.Getpgid(child); pgid == sid {
		t.Fatal("child is in the leader's process group; the test needs it elsewhere")
	}
	if !sessionIsOurs(sid, start) || sessionIsOurs(sid, start+1) {
		t.Fatal("sessionIsOurs wrong")
	}
	if got := sessionMembers(sid, 0); len(got) != 2 {
		t.Fatalf("session members %v, want leader and child", got)
	}
	// Sweep everything but the leader, which reaps its child (no orphans).
	if n := signalSession(sid, sid, syscall.SIGKILL); n != 1 {
		t.Fatalf("signalled %d processes, want 1", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(child, cst.Start) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(child, cst.Start) {
		t.Fatal("session sweep missed the child")
	}
	if got := sessionMembers(sid, sid); len(got) != 0 {
		t.Fatalf("members left: %v", got)
	}
}

func TestAllocateAddressSkipsListeners(t *testing.T) {
	// Something else listens on .1 of a private prefix: allocation must
	// skip it even though binding .1:0 would succeed.
	other, err := net.Listen("tcp4", "127.0.77.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if !listeningIPs()["127.0.77.1"] {
		t.Fatal("listeningIPs misses a listener")
	}
	ln, addr, err := allocateAddress("127.0.77.", map[string]bool{"127.0.77.2": true})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if addr != "127.0.77.3" {
		t.Fatalf("allocated %s, want 127.0.77.3", addr)
	}
}

func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{"i-0123456789abcdef0": true, "i-": false, "../x": false, "i-../../": false, "i-ABC": false, newInstanceID(): true} {
		if validID(id) != ok {
			t.Errorf("validID(%q) != %v", id, ok)
		}
	}
}
