package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fleetd/fleetd/agent/ckpt"
	_ "github.com/fleetd/fleetd/agent/ckpt/nodestores" // s3:// for the moto test
	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/providers/aws/motoserver"
)

// dataset writes files of the given sizes (deterministic content) under
// dir and returns them by key.
func dataset(t *testing.T, dir string, sizes map[string]int) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for k, n := range sizes {
		b := bytes.Repeat([]byte(k), n/len(k)+1)[:n]
		p := filepath.Join(dir, filepath.FromSlash(k))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		out[k] = b
	}
	return out
}

var datasetSizes = map[string]int{"train/shard-000.bin": 3 << 20, "train/shard-001.bin": 2 << 20, "val/shard.bin": 700 << 10, "meta.json": 120}

// recorder keeps the reports a stager sends.
type recorder struct {
	reports[agentwire.StagingReport]
}

func (r *recorder) send(_ context.Context, s agentwire.StagingReport) error {
	r.add(s)
	return nil
}

func newTestStager(t *testing.T, root string, rec *recorder) *stager {
	return &stager{root: root,
		open: func(ctx context.Context, source string) (stageSource, error) { return ckpt.OpenBucket(ctx, source) },
		send: rec.send, log: func(msg string, args ...any) { t.Log(append([]any{msg}, args...)...) }, now: time.Now}
}

func checkStaged(t *testing.T, dir string, want map[string][]byte) {
	t.Helper()
	for k, b := range want {
		got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(k)))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s: %d bytes, %v; want %d bytes", k, len(got), err, len(b))
		}
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "*", "*"+partSuffix))
	if len(matches) > 0 {
		t.Fatalf("part files left: %v", matches)
	}
}

func total(m map[string][]byte) (n int64) {
	for _, b := range m {
		n += int64(len(b))
	}
	return n
}

// stageSources are the sources a staging test runs against: a node
// directory and a moto S3 bucket.
func stageSources(t *testing.T) map[string]func(t *testing.T) (string, map[string][]byte) {
	return map[string]func(t *testing.T) (string, map[string][]byte){
		"file": func(t *testing.T) (string, map[string][]byte) {
			src := t.TempDir()
			return "file://" + src, dataset(t, src, datasetSizes)
		},
		"moto-s3": func(t *testing.T) (string, map[string][]byte) {
			srv := motoserver.StartT(t) // its own server, stopped by pid when the test ends
			motoserver.UseStaticKeys(t)
			c := s3.NewFromConfig(srv.Config("us-east-1"), func(o *s3.Options) { o.UsePathStyle = true })
			if _, err := c.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: aws.String("corpus")}); err != nil {
				t.Fatal(err)
			}
			data := dataset(t, t.TempDir(), datasetSizes)
			for k, b := range data {
				if _, err := c.PutObject(t.Context(), &s3.PutObjectInput{Bucket: aws.String("corpus"), Key: aws.String("tokens/" + k), Body: bytes.NewReader(b)}); err != nil {
					t.Fatal(err)
				}
			}
			return fmt.Sprintf("s3://corpus/tokens?endpoint=%s&region=us-east-1&use_path_style=true", srv.URL()), data
		},
	}
}

func TestStageAll(t *testing.T) {
	defer func(p int, e time.Duration) { stageParallel, stageReportEvery = p, e }(stageParallel, stageReportEvery)
	stageParallel, stageReportEvery = 3, 20*time.Millisecond
	for name, mk := range stageSources(t) {
		t.Run(name, func(t *testing.T) {
			source, want := mk(t)
			root := t.TempDir()
			rec := &recorder{}
			s := newTestStager(t, root, rec)
			d := agentwire.DataConfig{Source: source, MountPath: "/data/corpus", Mode: dataStage}
			data := []agentwire.DataConfig{d, {Source: "s3://other/x", MountPath: "/other", Mode: dataStream}}
			if err := s.stageAll(t.Context(), data); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(root, "data", "corpus")
			checkStaged(t, dir, want)
			r := rec.last()
			if !r.Done || r.Error != "" || r.Bytes != total(want) || r.Total != total(want) || r.Files != len(want) || r.From != "bucket" || r.RateBps <= 0 {
				t.Fatalf("final report %+v; want done, %d bytes in %d files from the bucket", r, total(want), len(want))
			}
			if strings.Contains(r.Source, "endpoint=") {
				t.Fatalf("report source keeps the query: %s", r.Source)
			}
			if _, err := os.Stat(filepath.Join(root, "other")); err == nil {
				t.Fatal("a streamed source was copied")
			}
			// A restarted agent finds the copy and does not read the source.
			rec2 := &recorder{}
			s2 := newTestStager(t, root, rec2)
			s2.open = func(context.Context, string) (stageSource, error) { t.Fatal("source opened again"); return nil, nil }
			if err := s2.stageAll(t.Context(), data); err != nil {
				t.Fatal(err)
			}
			if r := rec2.last(); !r.Done || r.From != "disk" || r.Bytes != total(want) {
				t.Fatalf("restart report %+v", r)
			}
		})
	}
}

func TestStageProgressAndErrors(t *testing.T) {
	defer func(p int, e time.Duration) { stageParallel, stageReportEvery = p, e }(stageParallel, stageReportEvery)
	stageParallel, stageReportEvery = 2, 5*time.Millisecond
	src := t.TempDir()
	want := dataset(t, src, datasetSizes)
	root := t.TempDir()
	rec := &recorder{}
	s := newTestStager(t, root, rec)
	bucket, err := ckpt.OpenBucket(t.Context(), "file://"+src)
	if err != nil {
		t.Fatal(err)
	}
	s.open = func(context.Context, string) (stageSource, error) {
		return throttled{bucket, 40 * time.Millisecond}, nil
	}
	if err := s.stageAll(t.Context(), []agentwire.DataConfig{{Source: "file://" + src, MountPath: "/d", Mode: dataStage}}); err != nil {
		t.Fatal(err)
	}
	checkStaged(t, filepath.Join(root, "d"), want)
	var mid []agentwire.StagingReport
	for _, r := range rec.got() {
		if !r.Done && r.Bytes < r.Total {
			mid = append(mid, r)
		}
	}
	if len(mid) == 0 {
		t.Fatalf("no progress report while copying: %+v", rec.got())
	}
	for i := 1; i < len(mid); i++ {
		if mid[i].Bytes < mid[i-1].Bytes {
			t.Fatalf("bytes went back: %+v", mid)
		}
	}
	if r := mid[len(mid)-1]; r.Bytes > 0 && (r.RateBps <= 0 || r.ETASeconds <= 0) {
		t.Fatalf("a report mid-copy has no rate or ETA: %+v", r)
	}

	// A missing source fails with a done-with-error report and no marker.
	rec2 := &recorder{}
	s2 := newTestStager(t, t.TempDir(), rec2)
	err = s2.stageAll(t.Context(), []agentwire.DataConfig{{Source: "file:///no/such/dir", MountPath: "/d", Mode: dataStage}})
	if err == nil || !strings.Contains(err.Error(), "staging file:///no/such/dir to /d") {
		t.Fatalf("err = %v", err)
	}
	if r := rec2.last(); !r.Done || r.Error == "" {
		t.Fatalf("report %+v; want done with the error", r)
	}
}

// throttled sleeps before each open: copies take long enough for the
// reporter to see them in progress.
type throttled struct {
	*ckpt.BucketStore
	d time.Duration
}

func (s throttled) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	time.Sleep(s.d)
	return s.BucketStore.Open(ctx, key)
}

func TestSafeKey(t *testing.T) {
	for k, ok := range map[string]bool{"a/b.bin": true, "x": true, "../etc/passwd": false, "/abs": false, "a//b": false, "a/./b": false,
		"a/..": false, stagedMarker: false, "f" + partSuffix: false, `a\b`: false, "": false} {
		if safeKey(k) != ok {
			t.Errorf("safeKey(%q) = %v, want %v", k, !ok, ok)
		}
	}
}

func TestDataEnv(t *testing.T) {
	tc := withDataEnv(agentwire.TrainingConfig{Env: map[string]string{"FLEETD_DATA_0_PATH": "/mine"}, Data: []agentwire.DataConfig{
		{Source: "s3://b/p", MountPath: "/data", Mode: dataStream}, {Source: "fsx://fs-1", MountPath: "/fsx", Mode: "mount"}}}, "")
	want := map[string]string{"FLEETD_DATA_COUNT": "2", "FLEETD_DATA_0_PATH": "/mine", "FLEETD_DATA_0_SOURCE": "s3://b/p", "FLEETD_DATA_0_MODE": "stream",
		"FLEETD_DATA_1_PATH": "/fsx", "FLEETD_DATA_1_SOURCE": "fsx://fs-1", "FLEETD_DATA_1_MODE": "mount"}
	if fmt.Sprint(tc.Env) != fmt.Sprint(want) {
		t.Fatalf("env = %v\nwant %v", tc.Env, want)
	}
	if tc := withDataEnv(agentwire.TrainingConfig{Data: []agentwire.DataConfig{{MountPath: "/d"}}}, "/node1"); tc.Env["FLEETD_DATA_0_PATH"] != "/node1/d" {
		t.Fatalf("re-rooted path = %v", tc.Env)
	}
	if tc := withDataEnv(agentwire.TrainingConfig{}, ""); tc.Env != nil {
		t.Fatalf("env without data = %v", tc.Env)
	}
}

// countingSource counts the bytes read through it.
type countingSource struct {
	stageSource
	n *atomic.Int64
}

func (s countingSource) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	r, err := s.stageSource.Open(ctx, key)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{ckpt.CountingReader(r, s.n), r}, nil
}

// TestPeerStaging: node A stages from the bucket and serves its copy; a
// replacement B in its zone copies from A (no bucket bytes) with the grant
// the daemon would mint from A's token; a forged grant is refused and B
// falls back to the bucket.
func TestPeerStaging(t *testing.T) {
	for name, mk := range stageSources(t) {
		t.Run(name, func(t *testing.T) {
			source, want := mk(t)
			var bucketBytes atomic.Int64
			open := func(ctx context.Context, s string) (stageSource, error) {
				b, err := ckpt.OpenBucket(ctx, s)
				if err != nil {
					return nil, err
				}
				return countingSource{b, &bucketBytes}, nil
			}
			d := agentwire.DataConfig{Source: source, MountPath: "/data", Mode: dataStage}
			const tokenA = "fleetd_node_aaaa"
			srvA := &peerServer{token: tokenA, now: time.Now}
			recA := &recorder{}
			a := newTestStager(t, t.TempDir(), recA)
			a.open = open
			a.serve = func(mp, dir string) string {
				srvA.add(mp, dir)
				u, err := srvA.start(t.Context(), "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				return u
			}
			if err := a.stageAll(t.Context(), []agentwire.DataConfig{d}); err != nil {
				t.Fatal(err)
			}
			ra := recA.last()
			if ra.PeerURL == "" || ra.From != "bucket" || bucketBytes.Load() != total(want) {
				t.Fatalf("A: report %+v, %d bytes from the bucket", ra, bucketBytes.Load())
			}
			t.Logf("A: %d bytes from the bucket; serves %s", bucketBytes.Load(), ra.PeerURL)

			stageB := func(mac string) (*recorder, string, int64, error) {
				bucketBytes.Store(0)
				var peerBytes atomic.Int64
				rec := &recorder{}
				b := newTestStager(t, t.TempDir(), rec)
				b.open = open
				exp := time.Now().Add(time.Hour).Unix()
				if mac == "" {
					mac = agentwire.PeerMAC(tokenA, "node-b", exp)
				}
				b.peers = func(context.Context, agentwire.DataConfig) (stageSource, string, bool) {
					p := agentwire.PeerStaging{Node: "node-a", URL: ra.PeerURL, Grant: agentwire.PeerGrant{Requester: "node-b", Expires: exp, MAC: mac}}
					return countingSource{peerSource{p: p, mp: "/data", me: "node-b", hc: &http.Client{}}, &peerBytes}, "node-a", true
				}
				err := b.stageAll(t.Context(), []agentwire.DataConfig{d})
				return rec, b.root, peerBytes.Load(), err
			}
			rec, root, fromPeer, err := stageB("")
			if err != nil {
				t.Fatal(err)
			}
			checkStaged(t, filepath.Join(root, "data"), want)
			if r := rec.last(); r.From != "node-a" || !r.Done || fromPeer != total(want) || bucketBytes.Load() != 0 {
				t.Fatalf("B: report %+v, %d bytes from the peer, %d from the bucket", r, fromPeer, bucketBytes.Load())
			}
			t.Logf("B (replacement): %d bytes from peer node-a, %d from the bucket", fromPeer, bucketBytes.Load())

			// A grant B forged (keyed by its own token) is refused; B copies
			// from the bucket instead.
			rec, root, fromPeer, err = stageB(agentwire.PeerMAC("fleetd_node_bbbb", "node-b", time.Now().Add(time.Hour).Unix()))
			if err != nil {
				t.Fatal(err)
			}
			checkStaged(t, filepath.Join(root, "data"), want)
			if r := rec.last(); r.From != "bucket" || fromPeer != 0 || bucketBytes.Load() != total(want) {
				t.Fatalf("B with a forged grant: report %+v, %d bytes from the peer, %d from the bucket", r, fromPeer, bucketBytes.Load())
			}
		})
	}
}

// dataCheckScript is a worker that lists the staged data it is pointed at
// (FLEETD_DATA_0_PATH) and writes the sizes it saw.
const dataCheckScript = `
import json, os
p = os.environ["FLEETD_DATA_0_PATH"]
seen = {}
for d, _, fs in os.walk(p):
    for f in fs:
        seen[os.path.relpath(os.path.join(d, f), p)] = os.path.getsize(os.path.join(d, f))
out = os.path.join(os.environ["DATA_OUT"], "seen-%s.json" % os.environ["RANK"])
with open(out + ".tmp", "w") as f:
    json.dump(seen, f)
os.rename(out + ".tmp", out)
# Stay until every rank has looked: the first to exit finishes the job.
import time
deadline = time.time() + 20
while not all(os.path.exists(os.path.join(os.environ["DATA_OUT"], "seen-%d.json" % r)) for r in range(int(os.environ["WORLD_SIZE"]))):
    if time.time() > deadline:
        raise SystemExit("peers never looked")
    time.sleep(0.05)
`

// TestAgentsStageBeforeJoin runs two real agents against the test daemon
// with a staged data block: each copies the data before it joins, reports
// its progress, and its workers find the data at FLEETD_DATA_0_PATH.
func TestAgentsStageBeforeJoin(t *testing.T) {
	py := needPython(t)
	addrs := loopbackAddrs(t, 2)
	src, dir, out := t.TempDir(), t.TempDir(), t.TempDir()
	want := dataset(t, src, datasetSizes)
	script := filepath.Join(dir, "datacheck.py")
	if err := os.WriteFile(script, []byte(dataCheckScript), 0o644); err != nil {
		t.Fatal(err)
	}
	// A fixed peer port (training.peer_port), as a security group rule
	// between the nodes would name it; each node serves on its own address.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	peerPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	tc := TrainingConfig{Command: []string{py, script}, NprocPerNode: 1, MaxRestarts: 1, DrainGrace: 5 * time.Second, Workdir: dir,
		Env:      map[string]string{"DATA_OUT": out},
		Data:     []agentwire.DataConfig{{Source: "file://" + src, MountPath: "/data/corpus", Mode: dataStage}},
		PeerPort: peerPort}
	d := newFakeDaemon(t, rdzvConfig(t, 2, 2), tc)
	agents := []*testAgent{startAgent(t, d, "a", addrs[0]), startAgent(t, d, "b", addrs[1])}
	waitAll(t, 60*time.Second, agents...)
	wantDone(t, d, true)
	for _, a := range agents {
		checkStaged(t, filepath.Join(a.root, "data", "corpus"), want)
	}
	for rank := range 2 {
		b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("seen-%d.json", rank)))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range want {
			if !strings.Contains(string(b), fmt.Sprintf("%q: %d", k, len(v))) {
				t.Fatalf("rank %d saw %s; missing %s", rank, b, k)
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	final := map[string]agentwire.StagingReport{}
	for _, s := range d.stagings {
		if s.r.Done {
			final[s.node] = s.r
		}
	}
	for _, n := range []string{"a", "b"} {
		if r := final[n]; r.Bytes != total(want) || r.Error != "" || !strings.HasSuffix(r.PeerURL, fmt.Sprintf(":%d", peerPort)) {
			t.Fatalf("node %s final staging report %+v, want a peer URL on port %d", n, r, peerPort)
		}
	}
}
