package integration

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// dataOnlyRole creates a login role that may only use schema and read and
// write its tables (USAGE on the schema; SELECT, INSERT, UPDATE, DELETE on
// its tables; no CREATE anywhere), and returns a pool logged in as it. The
// role is dropped when the test ends.
func dataOnlyRole(t *testing.T, e *env) *pgxpool.Pool {
	t.Helper()
	role, password := randomName("idemq_data_"), randomName("pw")
	e.exec(fmt.Sprintf("create role %s login password '%s' nosuperuser nocreatedb nocreaterole", role, password))
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = e.pool.Exec(ctx, "drop owned by "+role)
		_, _ = e.pool.Exec(ctx, "drop role if exists "+role)
	})
	schema := pgx.Identifier{e.schema}.Sanitize()
	e.exec("revoke create on schema public from " + role) // nothing to create anywhere (PUBLIC may hold it before PG 15)
	e.exec("grant usage on schema " + schema + " to " + role)
	e.exec("grant select, insert, update, delete on all tables in schema " + schema + " to " + role)
	cfg, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, password
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	var canCreate bool
	if err := p.QueryRow(e.ctx, "select has_database_privilege(current_database(), 'CREATE') or has_schema_privilege($1, 'CREATE')", e.schema).Scan(&canCreate); err != nil || canCreate {
		t.Fatalf("the data-only role may create (%v): the test proves nothing", err)
	}
	return p
}

// Migrations without DDL rights: after an admin migrated, a data-only role's
// store and outbox pass CheckSchema, Migrate succeeds without DDL (it used to
// fail with "permission denied for database"), and the store processes
// messages in atomic, batched (per message and set-based) and lease mode;
// the CLI's `migrate -check` and `migrate` work under that role. A missing or outdated schema gives
// ErrSchemaMissing / ErrSchemaOutdated naming the versions and the command to
// run, and Migrate then fails for want of rights instead of pretending.
func TestMigrateWithDataOnlyRole(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	admin, err := outbox.New(e.pool, outbox.Config{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Migrate(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.exec("create table " + e.table("ledger") + " (message_id text primary key)")
	data := dataOnlyRole(t, e)

	st, err := pgstore.New(data, pgstore.Config{Schema: e.schema, Fingerprinter: testFingerprinter(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CheckSchema(e.ctx); err != nil {
		t.Fatalf("CheckSchema as the data-only role: %v", err)
	}
	if err := st.Migrate(e.ctx); err != nil {
		t.Fatalf("Migrate as the data-only role on a current schema: %v", err)
	}
	ob, err := outbox.New(data, outbox.Config{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.CheckSchema(e.ctx); err != nil {
		t.Fatalf("outbox CheckSchema as the data-only role: %v", err)
	}
	if err := ob.Migrate(e.ctx); err != nil {
		t.Fatalf("outbox Migrate as the data-only role on a current schema: %v", err)
	}

	// The store works under the role, in every mode.
	msg := func(id string) *dedup.Message {
		ident, err := dedup.NewIdentity("billing", id, "", "")
		if err != nil {
			t.Fatal(err)
		}
		return &dedup.Message{Identity: ident, Payload: []byte("p-" + id), Topic: "payments", Source: "test:" + id}
	}
	write := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if _, err := tx.Exec(ctx, "insert into "+e.table("ledger")+" values ($1)", m.Identity.MessageID); err != nil {
			return err
		}
		_, err := ob.Add(ctx, tx, outbox.Message{Topic: "payments-out", Key: []byte(m.Identity.MessageID), Payload: m.Payload})
		return err
	}
	for i := 0; i < 2; i++ { // the second round is all duplicates
		if res, err := st.Process(e.ctx, msg("atomic"), write); err != nil || (i == 0) != (res.Outcome == dedup.OutcomeProcessed) {
			t.Fatalf("round %d: Process: %+v, %v", i, res, err)
		}
		res, err := st.ProcessBatch(e.ctx, []*dedup.Message{msg("batch-1"), msg("batch-2")}, write)
		if err != nil || len(res) != 2 || (i == 0) != (res[1].Outcome == dedup.OutcomeProcessed) {
			t.Fatalf("round %d: ProcessBatch: %+v, %v", i, res, err)
		}
		sres, err := st.ProcessBatchSet(e.ctx, []*dedup.Message{msg("set-1"), msg("set-2")}, func(ctx context.Context, tx pgx.Tx, ms []*dedup.Message) error {
			for _, m := range ms {
				if err := write(ctx, tx, m); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil || len(sres) != 2 || (i == 0) != (sres[0].Outcome == dedup.OutcomeProcessed) {
			t.Fatalf("round %d: ProcessBatchSet: %+v, %v", i, sres, err)
		}
		lres, err := st.ProcessLeased(e.ctx, msg("leased"), func(context.Context, *dedup.Message) error { return nil }, dedup.LeaseOptions{})
		if err != nil || (i == 0) != (lres.Outcome == dedup.OutcomeProcessed) {
			t.Fatalf("round %d: ProcessLeased: %+v, %v", i, lres, err)
		}
	}
	if n := e.count("select count(*) from " + e.table("ledger")); n != 5 {
		t.Fatalf("%d ledger rows, want 5 (one per message)", n)
	}
	if s, err := ob.Stats(e.ctx); err != nil || s.Pending != 5 {
		t.Fatalf("outbox stats as the data-only role: %+v, %v; want 5 pending", s, err)
	}

	// The CLI, as the role: -check and migrate need no DDL on a current schema.
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	cc := data.Config().ConnConfig
	dataDSN := fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cc.User, cc.Password, cc.Host, cc.Port, cc.Database)
	for _, args := range [][]string{{"migrate", "--check"}, {"migrate"}, {"outbox", "migrate", "--check"}, {"outbox", "migrate"}} {
		if out, err := exec.Command(bin, append(args, "--dsn", dataDSN, "--schema", e.schema)...).CombinedOutput(); err != nil {
			t.Fatalf("idemq %v as the data-only role: %v\n%s", args, err, out)
		}
	}

	// Outdated: the store must not run, and the role cannot migrate it.
	vt := e.table("consumption_records_schema_version")
	var want int
	if err := e.pool.QueryRow(e.ctx, "select version from "+vt).Scan(&want); err != nil {
		t.Fatal(err)
	}
	e.exec("update "+vt+" set version = $1", want-1)
	err = st.CheckSchema(e.ctx)
	var se *pgstore.SchemaError
	if !errors.Is(err, pgstore.ErrSchemaOutdated) || !errors.As(err, &se) || se.Found != want-1 || se.Want != want ||
		!strings.Contains(err.Error(), fmt.Sprintf("found version %d, want %d", want-1, want)) || !strings.Contains(err.Error(), "idemq migrate --print --schema "+e.schema) {
		t.Fatalf("CheckSchema on an outdated schema: %v", err)
	}
	if out, err := exec.Command(bin, "migrate", "--check", "--dsn", dataDSN, "--schema", e.schema).CombinedOutput(); err == nil || !strings.Contains(string(out), "outdated") {
		t.Fatalf("idemq migrate --check on an outdated schema: %v\n%s", err, out)
	}
	if err := st.Migrate(e.ctx); err == nil {
		t.Fatal("Migrate as the data-only role applied a migration: the role has DDL rights after all")
	}
	e.exec("update "+vt+" set version = $1", want)
	obVT := e.table("outbox_schema_version")
	var obWant int
	if err := e.pool.QueryRow(e.ctx, "select version from "+obVT).Scan(&obWant); err != nil {
		t.Fatal(err)
	}
	e.exec("update " + obVT + " set version = 1")
	if err := ob.CheckSchema(e.ctx); !errors.Is(err, outbox.ErrSchemaOutdated) || !strings.Contains(err.Error(), "found version 1") {
		t.Fatalf("outbox CheckSchema on an outdated schema: %v", err)
	}
	e.exec("update "+obVT+" set version = $1", obWant)

	// Missing: nothing was ever migrated in that schema.
	other, err := pgstore.New(data, pgstore.Config{Schema: randomName("t_"), Fingerprinter: testFingerprinter(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.CheckSchema(e.ctx); !errors.Is(err, pgstore.ErrSchemaMissing) || errors.Is(err, pgstore.ErrSchemaOutdated) {
		t.Fatalf("CheckSchema on a missing schema: %v", err)
	}
	otherOb, err := outbox.New(data, outbox.Config{Schema: e.schema, Table: "never_migrated"})
	if err != nil {
		t.Fatal(err)
	}
	if err := otherOb.CheckSchema(e.ctx); !errors.Is(err, outbox.ErrSchemaMissing) {
		t.Fatalf("outbox CheckSchema on a missing table: %v", err)
	}
}

// The SQL that `idemq migrate --print` / pgstore.MigrationSQL (and the outbox's)
// emit, applied block by block as a migration tool would, gives the same
// tables, columns and indexes as Migrate, passes CheckSchema, and Migrate
// then has nothing to do.
func TestMigrationSQLMatchesMigrate(t *testing.T) {
	t.Parallel()
	ref := setup(t, nil) // migrated by Migrate
	refOb, err := outbox.New(ref.pool, outbox.Config{Schema: ref.schema, Table: "ob"})
	if err != nil {
		t.Fatal(err)
	}
	if err := refOb.Migrate(ref.ctx); err != nil {
		t.Fatal(err)
	}

	p := testPool(t)
	ctx := ref.ctx
	schema := randomName("t_")
	t.Cleanup(func() {
		_, _ = p.Exec(context.Background(), "drop schema if exists "+pgx.Identifier{schema}.Sanitize()+" cascade")
	})
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	out, err := exec.Command(bin, "migrate", "--print", "--schema", schema).Output() // no -dsn: it needs no database
	if err != nil {
		t.Fatalf("idemq migrate --print: %v", err)
	}
	recordsSQL, err := pgstore.MigrationSQL(pgstore.Config{Schema: schema})
	if err != nil || string(out) != recordsSQL {
		t.Fatalf("idemq migrate --print differs from pgstore.MigrationSQL (%v)", err)
	}
	outboxSQL, err := outbox.MigrationSQL(outbox.Config{Schema: schema, Table: "ob"})
	if err != nil {
		t.Fatal(err)
	}
	for name, script := range map[string]string{"records": recordsSQL, "outbox": outboxSQL} {
		blocks := strings.Split(script, "\n-- idemq "+name+" version ")
		if len(blocks) < 3 {
			t.Fatalf("%s: %d blocks", name, len(blocks))
		}
		for i, b := range blocks {
			if i > 0 && !strings.HasPrefix(b, fmt.Sprintf("%d: ", i)) {
				t.Fatalf("%s: block %d starts %q", name, i, b[:20])
			}
			tx, err := p.Begin(ctx) // one transaction per block, as Flyway or goose would
			if err != nil {
				t.Fatal(err)
			}
			if i > 0 {
				b = "-- idemq " + name + " version " + b
			}
			if _, err := tx.Exec(ctx, b); err != nil {
				t.Fatalf("%s block %d: %v", name, i, err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	st, err := pgstore.New(p, pgstore.Config{Schema: schema, Fingerprinter: testFingerprinter(t)})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(p, outbox.Config{Schema: schema, Table: "ob"})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ob.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	shape := func(s string) string {
		var out string
		err := p.QueryRow(ctx, `select string_agg(x, E'\n' order by x) from (
			select 'col ' || table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '') x
			  from information_schema.columns where table_schema = $1
			union all
			select 'idx ' || tablename || ' ' || replace(indexdef, quote_ident($1) || '.', 'S.') from pg_indexes where schemaname = $1
			union all
			select 'opt ' || c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '') from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname = $1
			union all
			select 'ver ' || 'records ' || version from `+pgx.Identifier{s, "consumption_records_schema_version"}.Sanitize()+`
			union all
			select 'ver ' || 'outbox ' || version from `+pgx.Identifier{s, "ob_schema_version"}.Sanitize()+`
		) t`, s).Scan(&out)
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(out, s, "S")
	}
	got, want := shape(schema), shape(ref.schema)
	for _, part := range []string{"col consumption_records.message_id text", "col dead_letters.", "col ob.last_error_at", "col ob.message_id", "idx consumption_records CREATE UNIQUE INDEX", "opt consumption_records fillfactor=90", "ver records ", "ver outbox "} {
		if !strings.Contains(want, part) {
			t.Fatalf("the schema description lacks %q: it compares nothing:\n%s", part, want)
		}
	}
	if got != want {
		t.Fatalf("the printed SQL's schema differs from Migrate's:\n--- printed\n%s\n--- Migrate\n%s", got, want)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if got2 := shape(schema); got2 != got {
		t.Fatalf("Migrate changed a schema migrated with the printed SQL:\n%s", got2)
	}
}

// consumer.Run checks a *pgstore.Store's schema before it fetches
// (consumer.Config.CheckSchema).
var _ consumer.SchemaChecker = (*pgstore.Store)(nil)
