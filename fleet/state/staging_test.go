package state

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fleetd/fleetd/fleet/state/etcdtest"
)

// putStagingFixture writes fleet f, node n1 and one staging report.
func putStagingFixture(t *testing.T, s Store) {
	t.Helper()
	mustUpdate(t, s, func(tx Tx) error {
		if _, err := tx.PutFleet(Fleet{Name: "f"}); err != nil {
			return err
		}
		if err := tx.PutNode(Node{ID: "n1", Fleet: "f", State: NodeRunning}); err != nil {
			return err
		}
		return tx.PutStaging(StagingRecord{Fleet: "f", Node: "n1", MountPath: "/data", Report: []byte(`{"from":"n0","bytes":7}`)})
	})
}

// wantStagingFixture checks the report of putStagingFixture is there.
func wantStagingFixture(t *testing.T, s Store) {
	t.Helper()
	err := s.View(context.Background(), func(tx Tx) error {
		rs, err := tx.Stagings("f")
		if err != nil {
			return err
		}
		if len(rs) != 1 || rs[0].Node != "n1" || rs[0].MountPath != "/data" || string(rs[0].Report) != `{"from":"n0","bytes":7}` || rs[0].UpdatedAt.IsZero() {
			t.Errorf("staging records after reopening: %+v", rs)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Staging reports survive closing and reopening the store, on both
// backends; a schema-2 layout is migrated to hold them.
func TestStagingSurvivesReopenBolt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := testOpen(t, path, Options{})
	putStagingFixture(t, s)
	s.Close()
	wantStagingFixture(t, testOpen(t, path, Options{}))
}

// openEtcdAt opens the current layout under prefix, closed at cleanup.
func openEtcdAt(t *testing.T, cli *clientv3.Client, prefix string) *Etcd {
	t.Helper()
	s, err := OpenEtcd(context.Background(), cli, EtcdOptions{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestStagingSurvivesReopenEtcd(t *testing.T) {
	cli, prefix := etcdClient(t), etcdtest.Prefix(t.Name())
	s := openEtcdAt(t, cli, prefix)
	putStagingFixture(t, s)
	s.Close()
	wantStagingFixture(t, openEtcdAt(t, cli, prefix))
}

func TestMigrateStagingBolt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := open(path, Options{NoSync: true}, schema{version: 2})
	if err != nil {
		t.Fatal(err)
	}
	// A schema-2 file has no staging bucket.
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketStaging) }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	m := testOpen(t, path, Options{})
	if _, err := os.Stat(path + ".bak-v2"); err != nil {
		t.Errorf("no backup of the schema-2 file: %v", err)
	}
	putStagingFixture(t, m)
	wantStagingFixture(t, m)
}

func TestMigrateStagingEtcd(t *testing.T) {
	cli, ctx, prefix := etcdClient(t), context.Background(), etcdtest.Prefix(t.Name())
	s, err := openEtcd(ctx, cli, EtcdOptions{Prefix: prefix}, etcdSchema{version: 2})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	m := openEtcdAt(t, cli, prefix)
	putStagingFixture(t, m)
	wantStagingFixture(t, m)
}
