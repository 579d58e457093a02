package state

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetd/fleetd/fleet/state/etcdtest"
)

// v1Fleets are fleet records as a schema-1 fleetd wrote them (no
// incarnation), plus one that somehow has one already and must keep it.
var v1Fleets = map[string]string{
	"old":  `{"name":"old","generation":3,"source":"eA==","future_field":{"x":1}}`,
	"kept": `{"name":"kept","generation":1,"incarnation":"abcd2345"}`,
}

func checkMigratedFleets(t *testing.T, s Store) {
	t.Helper()
	err := s.View(context.Background(), func(tx Tx) error {
		old, err := tx.Fleet("old")
		if err != nil {
			return err
		}
		if len(old.Incarnation) != 8 || !old.LegacyUntagged || old.Generation != 3 || string(old.Source) != "x" {
			t.Errorf("migrated fleet = %+v; want an 8-character incarnation, legacy_untagged, generation 3, source kept", old)
		}
		kept, err := tx.Fleet("kept")
		if err != nil {
			return err
		}
		if kept.Incarnation != "abcd2345" || kept.LegacyUntagged {
			t.Errorf("fleet with an incarnation = %+v; want it untouched", kept)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// An update keeps the incarnation; a re-create gets a new one.
	var before, after, again Fleet
	err = s.Update(context.Background(), func(tx Tx) error {
		before, _ = tx.Fleet("old")
		if after, err = tx.PutFleet(Fleet{Name: "old", Source: []byte("y")}); err != nil {
			return err
		}
		if err := tx.DeleteFleet("old"); err != nil {
			return err
		}
		again, err = tx.PutFleet(Fleet{Name: "old", Source: []byte("z")})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if after.Incarnation != before.Incarnation || !after.LegacyUntagged {
		t.Errorf("update changed the identity: %+v → %+v", before, after)
	}
	if again.Incarnation == before.Incarnation || again.LegacyUntagged || again.Generation != 1 {
		t.Errorf("re-created fleet = %+v; want a new incarnation, not legacy, generation 1", again)
	}
}

func TestMigrateIncarnationsBolt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := open(path, Options{NoSync: true}, schema{version: 1})
	if err != nil {
		t.Fatal(err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		for k, v := range v1Fleets {
			if err := tx.Bucket(bucketFleets).Put([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	m := testOpen(t, path, Options{NoSync: true})
	var raw []byte
	_ = m.db.View(func(tx *bolt.Tx) error { raw = append(raw, tx.Bucket(bucketFleets).Get([]byte("old"))...); return nil })
	if !strings.Contains(string(raw), `"future_field":{"x":1}`) {
		t.Errorf("migration dropped an unknown field: %s", raw)
	}
	checkMigratedFleets(t, m)
}

func TestMigrateIncarnationsEtcd(t *testing.T) {
	cli := etcdClient(t)
	ctx := context.Background()
	prefix := etcdtest.Prefix(t.Name())
	s, err := openEtcd(ctx, cli, EtcdOptions{Prefix: prefix}, etcdSchema{version: 1})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range v1Fleets {
		if _, err := cli.Put(ctx, s.layout.bucket(refFleets)+k, v); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	m, err := OpenEtcd(ctx, cli, EtcdOptions{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	checkMigratedFleets(t, m)
}
