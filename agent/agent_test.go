package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleetd/internal/testutil"
	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/interruption/gcemeta"
	"github.com/fleetd/fleetd/interruption/gcemeta/fakemeta"
	"github.com/fleetd/fleetd/providers/local/imdsfake"
)

// reports keeps, in order, what a fake receives from concurrent senders.
type reports[T any] struct {
	mu  sync.Mutex
	all []T
}

func (r *reports[T]) add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, v)
}

func (r *reports[T]) got() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

func (r *reports[T]) last() T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.all[len(r.all)-1]
}

type recordingReporter struct{ reports[interruption.Notice] }

func (r *recordingReporter) ReportNotice(_ context.Context, n interruption.Notice) error {
	r.add(n)
	return errors.New("daemon unreachable") // the agent must drain regardless
}

// waitFor polls cond every 20 ms for at most limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, limit, 20*time.Millisecond, what, cond)
}

// serveIMDS serves fake as the instance metadata service on a loopback
// port until the test ends; MetadataURL is its URL.
func serveIMDS(t *testing.T, fake *imdsfake.Server) *imdsfake.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := imdsfake.Serve(ln, fake)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func TestRunDrainsOnSpotNotice(t *testing.T) {
	fake := imdsfake.New(imdsfake.Identity{InstanceID: "i-0agent", AvailabilityZone: "local-a", LifeCycle: "spot"}, nil)
	srv := serveIMDS(t, fake)

	root := t.TempDir()
	cfg, err := ParseConfig([]byte(`{"fleet":"f","node_id":"node-7","metadata":{"kind":"aws-imds","url":"http://192.0.2.1:9"}}`))
	if err != nil {
		t.Fatal(err)
	}
	rep := &recordingReporter{}
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Config: cfg, Root: root, MetadataURL: srv.URL, NodeAddr: "127.0.10.9",
			Stderr: pw, Reporter: rep, PollInterval: 50 * time.Millisecond})
		pw.Close()
	}()
	stderrLines := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		stderrLines <- lines
	}()

	paths := PathsFor(cfg, root)
	waitFor(t, 5*time.Second, "pid file", func() bool {
		b, err := os.ReadFile(paths.PIDFile)
		return err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(os.Getpid())
	})
	deadline := time.Now().Add(90 * time.Second).UTC().Truncate(time.Second)
	fake.SetSpotAction("terminate", deadline)
	fake.SetRebalance(time.Now())

	waitFor(t, 5*time.Second, "drain file", func() bool { _, err := os.Stat(paths.DrainFile); return err == nil })
	d, err := ReadDrain(paths.DrainFile)
	if err != nil {
		t.Fatal(err)
	}
	if d.Kind != interruption.SpotInterruption || !d.Deadline.Equal(deadline) || d.Source != "aws-imds" {
		t.Fatalf("drain file %+v", d)
	}
	waitFor(t, 5*time.Second, "two reported notices", func() bool { return len(rep.got()) == 2 })

	// A later maintenance event must not postpone the drain.
	fake.SetScheduledEvents([]imdsfake.ScheduledEvent{{Code: "instance-stop", EventID: "e1", State: "active", NotBefore: deadline.Add(time.Hour), NotAfter: deadline.Add(2 * time.Hour)}})
	waitFor(t, 5*time.Second, "maintenance notice", func() bool { return len(rep.got()) == 3 })
	if d2, _ := ReadDrain(paths.DrainFile); !d2.Deadline.Equal(deadline) {
		t.Fatalf("drain deadline moved to %v", d2.Deadline)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Stat(paths.PIDFile); !os.IsNotExist(err) {
		t.Fatalf("pid file left behind: %v", err)
	}
	for _, n := range rep.got() {
		if n.Node != "node-7" || n.Instance != "i-0agent" {
			t.Fatalf("notice without identity: %+v", n)
		}
	}

	// The log file and stderr carry the same JSON lines, notices included.
	logBytes, err := os.ReadFile(paths.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := <-stderrLines
	if strings.Join(lines, "\n")+"\n" != string(logBytes) {
		t.Fatalf("stderr and log file differ:\n%s\n---\n%s", strings.Join(lines, "\n"), logBytes)
	}
	kinds := map[string]bool{}
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		if rec["msg"] == "notice" {
			kinds[rec["kind"].(string)] = true
		}
	}
	if !kinds["spot-interruption"] || !kinds["rebalance"] || !kinds["maintenance"] {
		t.Fatalf("notices logged: %v", kinds)
	}
}

func TestRunDrainsOnGCEPreemption(t *testing.T) {
	meta := fakemeta.New(fakemeta.Options{Spot: true})
	defer meta.Close()
	cfg, err := ParseConfig([]byte(`{"fleet":"f","node_id":"n","metadata":{"kind":"gce"}}`))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	rep := &recordingReporter{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	// A bare host URL gets the v1 path appended.
	go func() {
		done <- Run(ctx, Options{Config: cfg, Root: root, MetadataURL: meta.URL, Stderr: io.Discard, Reporter: rep})
	}()
	paths := PathsFor(cfg, root)
	waitFor(t, 5*time.Second, "pid file", func() bool { _, err := os.Stat(paths.PIDFile); return err == nil })
	meta.Set(gcemeta.PathPreempted, "TRUE")
	waitFor(t, 5*time.Second, "drain file", func() bool { _, err := os.Stat(paths.DrainFile); return err == nil })
	d, err := ReadDrain(paths.DrainFile)
	if err != nil {
		t.Fatal(err)
	}
	if d.Kind != interruption.Preempted || d.Source != gcemeta.Source || d.Deadline.IsZero() {
		t.Fatalf("drain file %+v", d)
	}
	waitFor(t, 5*time.Second, "reported notice", func() bool { return len(rep.got()) == 1 })
	if n := rep.got()[0]; n.Node != "n" || n.Instance != "us-central1-a/fleetd-node-1" {
		t.Errorf("notice %+v", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestDiscoverIdentityFromMetadata(t *testing.T) {
	gce := fakemeta.New(fakemeta.Options{Zone: "europe-west4-b", Name: "node-3"})
	defer gce.Close()
	gce.Set("instance/network-interfaces/0/ip", "10.128.0.7")
	aws := imdsfake.New(imdsfake.Identity{InstanceID: "i-0abc", AvailabilityZone: "us-east-1c", LocalIPv4: "10.0.3.9"}, nil)
	awsSrv := serveIMDS(t, aws)

	tests := []struct {
		name, kind, url, nodeAddr string
		want                      identity
	}{
		{name: "gce", kind: MetadataGCE, url: gce.BaseURL(),
			want: identity{Addr: "10.128.0.7", Zone: "europe-west4-b", InstanceID: "europe-west4-b/node-3"}},
		{name: "aws", kind: MetadataAWSIMDS, url: awsSrv.URL,
			want: identity{Addr: "10.0.3.9", Zone: "us-east-1c", InstanceID: "i-0abc"}},
		{name: "FLEETD_NODE_ADDR wins", kind: MetadataAWSIMDS, url: awsSrv.URL, nodeAddr: "127.0.10.4",
			want: identity{Addr: "127.0.10.4", Zone: "us-east-1c", InstanceID: "i-0abc", Ifname: ifnameOf("127.0.10.4")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &agent{log: slog.New(slog.NewTextHandler(io.Discard, nil)), opts: Options{
				Config:   Config{Fleet: "f", NodeID: "n", Metadata: MetadataConfig{Kind: tt.kind}},
				NodeAddr: tt.nodeAddr, MetadataURL: tt.url,
			}}
			got := a.discoverIdentity(t.Context())
			if got != tt.want {
				t.Errorf("identity %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRunWithoutMetadataStopsOnCancel(t *testing.T) {
	cfg, _ := ParseConfig([]byte(`{"fleet":"f","node_id":"n"}`))
	root := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Options{Config: cfg, Root: root, Stderr: io.Discard}) }()
	waitFor(t, 5*time.Second, "pid file", func() bool { _, err := os.Stat(PathsFor(cfg, root).PIDFile); return err == nil })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
