package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/fleetd/fleetd/agentwire"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
)

// TestStagingPeerAndStatus goes through the daemon: node A reports its
// staging (in status), finishes and offers its copy; node B of the same
// zone asks for a peer and gets A with a grant keyed by A's token, which
// A's agent can check and B cannot forge.
func TestStagingPeerAndStatus(t *testing.T) {
	sd := startSecDaemon(t, t.TempDir(), false)
	sd.applyMem(t)
	ns := sd.nodes(t, "train")
	a, b := ns[0], ns[1]
	if a.Offering.Zone != b.Offering.Zone {
		t.Fatalf("mem nodes in zones %s and %s; the test wants one zone", a.Offering.Zone, b.Offering.Zone)
	}
	tokA, tokB := "Bearer "+sd.NodeToken("train", a.ID), "Bearer "+sd.NodeToken("train", b.ID)
	for id, tok := range map[string]string{a.ID: tokA, b.ID: tokB} {
		if code, body, _ := sd.call(t, http.MethodPost, "/v1/agent/train/"+id+"/register", tok, []byte(`{"address":"127.0.0.21"}`)); code != 200 {
			t.Fatalf("register %s: %d %s", id, code, body)
		}
	}
	report := func(tok, node string, r agentwire.StagingReport) {
		t.Helper()
		if code, body, _ := sd.call(t, http.MethodPost, "/v1/agent/train/"+node+"/staging", tok, mustJSON(r)); code != http.StatusNoContent {
			t.Fatalf("staging report: %d %s", code, body)
		}
	}
	askPeer := func() (int, agentwire.PeerStaging) {
		t.Helper()
		code, body, _ := sd.call(t, http.MethodPost, "/v1/agent/train/"+b.ID+"/staging/peer", tokB,
			[]byte(`{"source":"s3://corpus/tokens?endpoint=http://127.0.0.1:1","mount_path":"/data"}`))
		var p agentwire.PeerStaging
		if code == 200 {
			if err := json.Unmarshal(body, &p); err != nil {
				t.Fatal(err)
			}
		}
		return code, p
	}

	report(tokA, a.ID, agentwire.StagingReport{Source: "s3://corpus/tokens", MountPath: "/data", From: "bucket", Bytes: 1 << 30, Total: 4 << 30, RateBps: 2e8, ETASeconds: 16})
	if code, _ := askPeer(); code != http.StatusNotFound {
		t.Fatalf("peer while A still copies: %d, want 404", code)
	}
	code, body, _ := sd.call(t, http.MethodGet, "/v1/fleets/train", "Bearer "+sd.Token(), nil)
	var det api.FleetDetail
	if code != 200 || json.Unmarshal(body, &det) != nil {
		t.Fatalf("status: %d %s", code, body)
	}
	var got []api.StagingReport
	for _, n := range det.Nodes {
		if n.ID == a.ID {
			got = n.Staging
		}
	}
	if len(got) != 1 || got[0].Bytes != 1<<30 || got[0].ETASeconds != 16 {
		t.Fatalf("status staging of %s = %+v", a.ID, got)
	}

	report(tokA, a.ID, agentwire.StagingReport{Source: "s3://corpus/tokens", MountPath: "/data", From: "bucket", Bytes: 4 << 30, Total: 4 << 30, Done: true, PeerURL: "http://127.0.0.21:7790"})
	code, p := askPeer()
	if code != 200 || p.Node != a.ID || p.URL != "http://127.0.0.21:7790" || p.Grant.Requester != b.ID {
		t.Fatalf("peer: %d %+v", code, p)
	}
	if p.Grant.MAC != agentwire.PeerMAC(sd.NodeToken("train", a.ID), b.ID, p.Grant.Expires) {
		t.Fatal("the grant is not keyed by A's token")
	}
	if strings.Contains(p.Grant.MAC, sd.NodeToken("train", a.ID)) {
		t.Fatal("the grant leaks A's token")
	}
	if !strings.Contains(p.Reason, "(assumed)") {
		t.Errorf("peer reason %q: want the expected costs, the peer's rate assumed", p.Reason)
	}
	// The source measured at 5 GB/s, free from this region: faster than a
	// peer is expected to be, so B copies from the source, and is told why.
	report(tokA, a.ID, agentwire.StagingReport{Source: "s3://corpus/tokens", MountPath: "/data", From: "bucket", Bytes: 4 << 30, Total: 4 << 30, RateBps: 5e9, Done: true, PeerURL: "http://127.0.0.21:7790"})
	code, body, _ = sd.call(t, http.MethodPost, "/v1/agent/train/"+b.ID+"/staging/peer", tokB,
		[]byte(`{"source":"s3://corpus/tokens?endpoint=http://127.0.0.1:1","mount_path":"/data"}`))
	if code != http.StatusNotFound || !strings.Contains(string(body), "from the source") || !strings.Contains(string(body), "5.00 GB/s (measured)") {
		t.Fatalf("peer with a fast source: %d %s; want 404 saying the source costs less", code, body)
	}
	report(tokA, a.ID, agentwire.StagingReport{Source: "s3://corpus/tokens", MountPath: "/data", From: "bucket", Bytes: 4 << 30, Total: 4 << 30, RateBps: 2e8, Done: true, PeerURL: "http://127.0.0.21:7790"})
	if code, p := askPeer(); code != 200 || p.Node != a.ID {
		t.Fatalf("peer with a slow source: %d %+v", code, p)
	}
	// A node never gets itself as a peer, nor a copy of another source.
	if code, _, _ := sd.call(t, http.MethodPost, "/v1/agent/train/"+a.ID+"/staging/peer", tokA, []byte(`{"source":"s3://corpus/tokens","mount_path":"/data"}`)); code != http.StatusNotFound {
		t.Fatalf("A asking for its own copy: %d", code)
	}
	if code, _, _ := sd.call(t, http.MethodPost, "/v1/agent/train/"+b.ID+"/staging/peer", tokB, []byte(`{"source":"s3://other/x","mount_path":"/data"}`)); code != http.StatusNotFound {
		t.Fatalf("another source: %d", code)
	}
}

// TestStagingSurvivesRestart: the staging reports a daemon took (progress,
// where the bytes came from) are in status after it restarts on the same
// data dir, before any agent reports again; a node that is gone takes
// its reports with it.
func TestStagingSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	sd := startSecDaemon(t, dir, false)
	sd.applyMem(t)
	ns := sd.nodes(t, "train")
	a, b := ns[0], ns[1]
	reports := map[string]agentwire.StagingReport{
		a.ID: {Source: "s3://corpus/tokens", MountPath: "/data", From: "bucket", Bytes: 1 << 30, Total: 4 << 30, RateBps: 2e8, ETASeconds: 16},
		b.ID: {Source: "s3://corpus/tokens", MountPath: "/data", From: a.ID, Bytes: 4 << 30, Total: 4 << 30, RateBps: 9e8, Done: true, PeerURL: "http://127.0.0.22:7790"},
	}
	for id, r := range reports {
		if code, body, _ := sd.call(t, http.MethodPost, "/v1/agent/train/"+id+"/staging", "Bearer "+sd.NodeToken("train", id), mustJSON(r)); code != http.StatusNoContent {
			t.Fatalf("staging report of %s: %d %s", id, code, body)
		}
	}
	sd.stop()

	sd = startSecDaemonOn(t, dir, false, sd.prov)
	code, body, _ := sd.call(t, http.MethodGet, "/v1/fleets/train", "Bearer "+sd.Token(), nil)
	var det api.FleetDetail
	if code != 200 || json.Unmarshal(body, &det) != nil {
		t.Fatalf("status after restart: %d %s", code, body)
	}
	for _, n := range det.Nodes {
		want, ok := reports[n.ID]
		if !ok {
			continue
		}
		if len(n.Staging) != 1 || n.Staging[0] != want {
			t.Errorf("staging of %s after restart = %+v, want %+v", n.ID, n.Staging, want)
		}
		delete(reports, n.ID)
	}
	if len(reports) != 0 {
		t.Errorf("nodes missing from status after restart: %v", reports)
	}

	// B is gone: its stored reports go with it.
	err := sd.store.Update(context.Background(), func(tx state.Tx) error { return tx.DeleteNode("train", b.ID) })
	if err != nil {
		t.Fatal(err)
	}
	err = sd.store.View(context.Background(), func(tx state.Tx) error {
		rs, err := tx.Stagings("train")
		if err != nil || len(rs) != 1 || rs[0].Node != a.ID {
			t.Errorf("stored staging after deleting %s: %+v, %v", b.ID, rs, err)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
