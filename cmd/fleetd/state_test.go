package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/state/etcdtest"
)

// export → import → export, bbolt → etcd → bbolt, through the CLI.
func TestStateExportImport(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	s, err := state.Open(filepath.Join(src, "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Update(ctx, func(tx state.Tx) error {
		for i := range 3 {
			f := fmt.Sprintf("f%d", i)
			if _, err := tx.PutFleet(state.Fleet{Name: f, Source: []byte(`fleet "x" {}`)}); err != nil {
				return err
			}
			for j := range 50 {
				if err := tx.PutNode(state.Node{Fleet: f, ID: fmt.Sprintf("n%d", j), State: state.NodeRunning}); err != nil {
					return err
				}
			}
			if _, err := tx.AppendEvent(state.Event{Fleet: f, Type: "fleet.applied"}); err != nil {
				return err
			}
		}
		if err := tx.PutOffering(state.OfferingRecord{Key: "local/r1/r1-a/gpu8/spot", Launches: 2}); err != nil {
			return err
		}
		return tx.SetMeta("rdzv/f0", []byte(`{"round":3}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	srcID, _ := state.DaemonID(ctx, s)
	s.Close()

	cli := func(wantCode int, args ...string) (string, string) {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(append([]string{"state"}, args...), &out, &errb); code != wantCode {
			t.Fatalf("fleetd state %s: exit %d; want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, wantCode, out.String(), errb.String())
		}
		return out.String(), errb.String()
	}
	file := func(name, content string) string {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	dump, summary := cli(exitOK, "export", "-data-dir", src)
	if !strings.Contains(summary, "3 fleets, 150 nodes, 3 events (last seq 3), 1 offerings") {
		t.Errorf("export summary: %s", summary)
	}
	dumpFile := file("dump.jsonl", dump)

	ep := strings.Join(etcdtest.StartCluster(t, 1).Endpoints(), ",")
	out, _ := cli(exitOK, "import", "-etcd", ep, "-prefix", "/fleetd/test/", dumpFile)
	if !strings.Contains(out, "verified") {
		t.Errorf("import into etcd: %s", out)
	}
	fromEtcd, _ := cli(exitOK, "export", "-etcd", ep, "-prefix", "/fleetd/test/")
	if fromEtcd != dump {
		t.Fatal("etcd export differs from the bbolt export")
	}

	dst := t.TempDir()
	cli(exitOK, "import", "-data-dir", dst, file("etcd.jsonl", fromEtcd))
	if again, _ := cli(exitOK, "export", "-data-dir", dst); again != dump {
		t.Fatal("bbolt → etcd → bbolt changed the state")
	}
	d, err := state.Open(filepath.Join(dst, "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := state.DaemonID(ctx, d); id != srcID {
		t.Errorf("daemon id %q after the round trip; want %q", id, srcID)
	}
	d.Close()

	// A non-empty target is refused unless -force.
	_, errOut := cli(exitError, "import", "-etcd", ep, "-prefix", "/fleetd/test/", dumpFile)
	if !strings.Contains(errOut, "not empty") {
		t.Errorf("import into a non-empty prefix: %s", errOut)
	}
	cli(exitOK, "import", "-force", "-etcd", ep, "-prefix", "/fleetd/test/", dumpFile)

	// Usage errors.
	cli(exitUsage, "export")
	cli(exitUsage, "export", "-data-dir", src, "-etcd", ep)
	cli(exitUsage, "frobnicate")
	// Exporting a data dir without a state file does not create one.
	empty := t.TempDir()
	cli(exitError, "export", "-data-dir", empty)
	if _, err := os.Stat(filepath.Join(empty, "state.db")); err == nil {
		t.Error("export created a state file")
	}
}
