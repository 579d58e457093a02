package state

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The on-disk layout. Every bucket and meta key fleetd uses is declared here
// and nowhere else, so a layout change is one reviewable diff plus a
// migration below.
//
//	meta/                    daemon metadata; values are opaque bytes owned by their writer
//	    schema_version       decimal ASCII, e.g. "1" (written by the store only)
//	    daemon_id            16 lowercase hex chars, random at creation (written by the store only)
//	    created_at           RFC 3339 time the file was created
//	    <other keys>         free for the daemon (Tx.SetMeta)
//	fleets/                  fleet name → Fleet JSON (schema 2: with its incarnation)
//	nodes/                   one nested bucket per fleet, deleted with the fleet
//	    <fleet name>/        node id → Node JSON
//	events/                  big-endian uint64 seq → Event JSON; seq comes from the
//	                         bucket's NextSequence, so it is strictly increasing and
//	                         survives restarts
//	offerings/               providers.Offering.Key() → OfferingRecord JSON
//	staging/                 one nested bucket per fleet, deleted with the fleet (schema 3)
//	    <fleet name>/        <node id> NUL <mount path> → StagingRecord JSON; a node's
//	                         records are deleted with the node
//
// All values except meta are JSON, so a state file can be inspected with
// `bbolt get` and read by a future fleetd without this package's Go types.
var (
	bucketMeta      = []byte("meta")
	bucketFleets    = []byte("fleets")
	bucketNodes     = []byte("nodes")
	bucketEvents    = []byte("events")
	bucketOfferings = []byte("offerings")
	bucketStaging   = []byte("staging")
)

// topBuckets are created with a new state file and must exist in every file
// at the current schema version.
var topBuckets = [][]byte{bucketMeta, bucketFleets, bucketNodes, bucketEvents, bucketOfferings, bucketStaging}

// bucketSince is the schema version that added a top-level bucket, for
// those added after version 1: an older file is checked for the buckets
// it had, and its migration adds the rest.
var bucketSince = map[string]int{string(bucketStaging): 3}

// Meta keys written by the store. Tx.SetMeta refuses them: a changed schema
// version or daemon id would orphan the data or the cloud instances.
const (
	MetaSchemaVersion = "schema_version"
	MetaDaemonID      = "daemon_id"
	MetaCreatedAt     = "created_at"
)

// SchemaVersion is the layout version this fleetd writes. Bump it together
// with a new entry in migrations whenever the layout above changes in a way
// an older fleetd could misread.
//
//	1 → 2  fleets get an incarnation id (Fleet.Incarnation) and are marked
//	       LegacyUntagged: their instances predate the incarnation tag.
//	2 → 3  the staging bucket: nodes' staging reports, so status shows a
//	       copy's progress across a daemon restart. An older fleetd would
//	       leave a deleted node's reports behind.
const SchemaVersion = 3

// migration upgrades a state file from schema version from to from+1. It runs
// on the raw bbolt transaction because the typed Tx only knows the current
// layout. All pending migrations run in one transaction after the file has
// been copied to <path>.bak-v<old>.
type migration struct {
	from  int
	name  string
	apply func(tx *bolt.Tx) error
}

// migrations holds one entry per past layout change, in order.
var migrations = []migration{
	{from: 1, name: "fleet incarnations", apply: func(tx *bolt.Tx) error { return migrateIncarnations(&boltKV{tx: tx}) }},
	{from: 2, name: "staging reports", apply: func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketStaging)
		return err
	}},
}

// migrateIncarnations gives every fleet record without one an incarnation
// id and marks it LegacyUntagged. It edits the JSON as a map so that
// fields this version does not know survive.
func migrateIncarnations(k kv) error {
	type rec struct {
		name string
		m    map[string]json.RawMessage
	}
	var todo []rec
	err := k.scan(refFleets, "", func(name string, v []byte) (bool, error) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(v, &m); err != nil {
			return false, fmt.Errorf("fleet %q: %w", name, err)
		}
		if inc, ok := m["incarnation"]; !ok || string(inc) == `""` {
			todo = append(todo, rec{name, m})
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, r := range todo {
		inc, err := NewIncarnation()
		if err != nil {
			return err
		}
		r.m["incarnation"], _ = json.Marshal(inc)
		r.m["legacy_untagged"] = json.RawMessage("true")
		b, err := json.Marshal(r.m)
		if err != nil {
			return err
		}
		if err := k.put(refFleets, r.name, b); err != nil {
			return err
		}
	}
	return nil
}

// schema is the target of Open: a version and the migrations that reach it.
// Production code uses currentSchema; tests pass their own to exercise the
// migration machinery.
type schema struct {
	version    int
	migrations []migration
}

var currentSchema = schema{version: SchemaVersion, migrations: migrations}

// plan returns the migrations that take a file from version from to s.version.
func (s schema) plan(from int) ([]migration, error) {
	return planMigrations(s.migrations, func(m migration) int { return m.from }, from, s.version)
}

// planMigrations returns the migrations of ms (bbolt's or etcd's) that
// take a layout from version from to version to: exactly one must start
// at each version in between.
func planMigrations[M any](ms []M, start func(M) int, from, to int) ([]M, error) {
	var out []M
	for v := from; v < to; v++ {
		found := false
		for _, m := range ms {
			if start(m) == v {
				if found {
					return nil, fmt.Errorf("two migrations from schema version %d", v)
				}
				out = append(out, m)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("no migration from schema version %d to %d", v, v+1)
		}
	}
	return out, nil
}
