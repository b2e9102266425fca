package pgstore

// The store-level tests (the Postgres-only scenarios that used to live in the
// integration module): they run the Store's public calls, which open and
// commit their own transactions, so they cannot share the SQL tests'
// rolled-back transaction. Each test instead gets, on the package's test
// schema (dbtest_test.go, migrated once per run), a scope of its own, and a
// schema of its own for its business tables; it runs in parallel. A test
// that puts triggers on the record table, purges it or reads its statistics
// takes a migrated schema of its own (newOwnSchemaEnv) so that it never
// touches, or waits on, another test's records.

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// storeEnv is one store-level test's bundle.
type storeEnv struct {
	t      *testing.T
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string // the store's schema (the idemq tables)
	biz    string // the test's schema for its business tables, dropped at the end
	store  *Store
	scope  string // the test's scope: no other test reads or writes its records
}

// newEnv returns a Store on the package's test schema with tweak applied to
// its Config (Schema and Fingerprinter set), a fresh scope and a business
// schema, and marks the test parallel. Without TEST_POSTGRES_DSN it skips
// (fails under CI=true).
func newEnv(t *testing.T, tweak func(*Config)) *storeEnv {
	t.Helper()
	needDB(t)
	t.Parallel()
	return newEnvOn(t, dbStore.cfg.Schema, tweak)
}

// newOwnSchemaEnv is newEnv on a schema of the test's own, migrated for it
// and dropped at its end.
func newOwnSchemaEnv(t *testing.T, tweak func(*Config)) *storeEnv {
	t.Helper()
	needDB(t)
	t.Parallel()
	schema := "pgstore_own_" + randomHex(6)
	e := newEnvOn(t, schema, tweak)
	if err := e.store.Migrate(e.ctx); err != nil {
		t.Fatalf("migrate %s: %v", schema, err)
	}
	t.Cleanup(func() { e.dropSchema(schema) })
	return e
}

func newEnvOn(t *testing.T, schema string, tweak func(*Config)) *storeEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	e := &storeEnv{t: t, ctx: ctx, pool: dbStore.pool, schema: schema, biz: "pgstore_biz_" + randomHex(6), scope: "s_" + randomHex(6)}
	e.store = e.newStore(dbStore.pool, tweak)
	e.exec(`create schema ` + e.biz)
	t.Cleanup(func() { e.dropSchema(e.biz) })
	return e
}

// newStore is another Store on the test's schema, over pool.
func (e *storeEnv) newStore(pool *pgxpool.Pool, tweak func(*Config)) *Store {
	e.t.Helper()
	cfg := Config{Schema: e.schema, Fingerprinter: dbStore.cfg.Fingerprinter}
	if tweak != nil {
		tweak(&cfg)
	}
	st, err := New(pool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// newPool is a pool of the test's own on TEST_POSTGRES_DSN, closed at its
// end; tweak adjusts its config.
func (e *storeEnv) newPool(tweak func(*pgxpool.Config)) *pgxpool.Pool {
	e.t.Helper()
	cfg := dbStore.pool.Config() // a copy
	tweak(cfg)
	p, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Close)
	return p
}

func (e *storeEnv) dropSchema(schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = dbStore.pool.Exec(ctx, "drop schema if exists "+pgx.Identifier{schema}.Sanitize()+" cascade")
}

// table is a quoted table name in the test's business schema.
func (e *storeEnv) table(name string) string { return pgx.Identifier{e.biz, name}.Sanitize() }

// records is the quoted consumption-record table of the store's schema.
func (e *storeEnv) records() string {
	return pgx.Identifier{e.schema, "consumption_records"}.Sanitize()
}

// msg is a delivery of the test's scope with a normalized identity.
func (e *storeEnv) msg(messageID, businessKey, payload string) *dedup.Message {
	e.t.Helper()
	id, err := dedup.NewIdentity(e.scope, messageID, "", businessKey)
	if err != nil {
		e.t.Fatal(err)
	}
	return &dedup.Message{Identity: id, Payload: []byte(payload), Topic: "payments", Source: "test:" + messageID}
}

func (e *storeEnv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *storeEnv) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// record is the test's record of messageID.
func (e *storeEnv) record(messageID string) dedup.Record {
	e.t.Helper()
	r, err := e.store.Lookup(e.ctx, e.scope, messageID)
	if err != nil {
		e.t.Fatalf("record %s/%s: %v", e.scope, messageID, err)
	}
	return r
}

// deadLetters are the test's dead letters.
func (e *storeEnv) deadLetters() []dedup.DeadLetter {
	e.t.Helper()
	dl, err := e.store.DeadLetters(e.ctx, e.scope, 0, 1000)
	if err != nil {
		e.t.Fatal(err)
	}
	return dl
}
