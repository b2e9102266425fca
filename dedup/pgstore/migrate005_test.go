package pgstore

import (
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/idemq/idemq/internal/pgmigrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Migration 005 on a populated table at version 004: the expires_at index
// goes (and only the store's own: a same-named index in another schema of
// the search path stays), fillfactor becomes 90, the records stay, and a
// purge then deletes the expired ones.
func TestMigration005OnPopulatedTable(t *testing.T) {
	needDB(t)
	t.Parallel()
	e := newEnvOn(t, "pgstore_own_"+randomHex(6), nil)
	t.Cleanup(func() { e.dropSchema(e.schema) })
	upTo4 := fstest.MapFS{}
	err := fs.WalkDir(migrationFS, "migrations", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), "005_") || d.Name() > "005" {
			return err
		}
		b, err := migrationFS.ReadFile(path)
		upTo4[d.Name()] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil || len(upTo4) != 4 {
		t.Fatalf("migrations 001-004: %d files, %v", len(upTo4), err)
	}
	if err := pgmigrate.Apply(e.ctx, e.pool, e.schema, "consumption_records_schema_version", upTo4, e.store.q.tables); err != nil {
		t.Fatal(err)
	}
	records := e.records()
	// 10,000 records: a tenth expired, the rest live or not terminal.
	e.exec(`insert into ` + records + ` (scope, message_id, fingerprint, fingerprint_key_id, status, expires_at)
		select 's', 'm-' || g, '\x00', 'k1',
		  case when g % 10 = 0 then 'SUCCEEDED' when g % 10 = 1 then 'FAILED_RETRYABLE' else 'SUCCEEDED' end,
		  case when g % 10 = 0 then now() - interval '1 hour' when g % 10 = 1 then null else now() + interval '1 hour' end
		from generate_series(1, 10000) g`)
	// A decoy: an index of the same name in the business schema, on the
	// search path of the migrating connections.
	e.exec(`create table ` + e.table("decoy") + ` (x int)`)
	e.exec(`create index consumption_records_expires_idx on ` + e.table("decoy") + ` (x)`)
	onPath := e.newPool(func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["search_path"] = e.biz })
	if err := e.newStore(onPath, nil).Migrate(e.ctx); err != nil {
		t.Fatal(err)
	}
	var version int
	var idx, decoy int
	var opts []string
	if err := e.pool.QueryRow(e.ctx, `select version from `+pgx.Identifier{e.schema, "consumption_records_schema_version"}.Sanitize()).Scan(&version); err != nil || version < 5 {
		t.Fatalf("schema version %d (%v), want 5 or later", version, err)
	}
	if err := e.pool.QueryRow(e.ctx, `select count(*) filter (where schemaname = $1), count(*) filter (where schemaname = $2)
		from pg_indexes where indexname = 'consumption_records_expires_idx'`, e.schema, e.biz).Scan(&idx, &decoy); err != nil || idx != 0 || decoy != 1 {
		t.Fatalf("expires_at index: %d in the store's schema, %d in the other (%v); want 0 and 1", idx, decoy, err)
	}
	if err := e.pool.QueryRow(e.ctx, `select coalesce(reloptions, '{}') from pg_class where oid = $1::regclass`, records).Scan(&opts); err != nil ||
		len(opts) != 1 || opts[0] != "fillfactor=90" {
		t.Fatalf("reloptions %v (%v), want [fillfactor=90]", opts, err)
	}
	if n := e.count(`select count(*) from ` + records); n != 10000 {
		t.Fatalf("%d records after the migration, want 10000", n)
	}
	n, err := e.store.Purge(e.ctx, 500)
	if err != nil || n != 1000 {
		t.Fatalf("purge: %d, %v; want 1000", n, err)
	}
	if n := e.count(`select count(*) from ` + records + ` where expires_at < now()`); n != 0 {
		t.Fatalf("%d expired records left", n)
	}
	if n := e.count(`select count(*) from ` + records); n != 9000 {
		t.Fatalf("%d records left, want 9000", n)
	}
}
