package pgstore

// The SQL package tests, after River's riverdbtest: TestMain migrates a
// schema of its own once per test binary (a random name, dropped at the
// end), and each test runs its statements in one transaction that is rolled
// back when it ends, so tests leave nothing behind and run in parallel. They
// need TEST_POSTGRES_DSN; without it they skip, saying how to start
// Postgres, except under CI=true, where they fail.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// dbStore is the store on the test schema; nil without TEST_POSTGRES_DSN.
var dbStore *Store

// dbSetupErr is why TestMain could not prepare the schema.
var dbSetupErr error

const startPostgres = "TEST_POSTGRES_DSN is not set: start Postgres with `make services-up` " +
	"(or `bash scripts/services.sh up`), then `eval \"$(bash scripts/services.sh env)\"` and run the tests again"

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dsn := os.Getenv("TEST_POSTGRES_DSN")
	if dsn == "" {
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		dbSetupErr = err
		return m.Run()
	}
	defer pool.Close()
	schema := "pgstore_test_" + randomHex(6)
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err == nil {
		dbStore, err = New(pool, Config{Schema: schema, Fingerprinter: fp})
	}
	if err == nil {
		err = dbStore.Migrate(ctx)
	}
	if err != nil {
		dbStore, dbSetupErr = nil, fmt.Errorf("migrate schema %s: %w", schema, err)
		return m.Run()
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		_, _ = pool.Exec(dctx, "drop schema "+pgx.Identifier{schema}.Sanitize()+" cascade")
	}()
	return m.Run()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// dbBundle is what a SQL test works with.
type dbBundle struct {
	ctx   context.Context
	tx    pgx.Tx   // rolled back when the test ends
	q     *queries // the store's statements
	s     *Store
	scope string // a scope of this test's own: parallel tests never wait on each other's rows
}

// setup begins the test's transaction (rolled back at its end) and marks the
// test parallel. Without TEST_POSTGRES_DSN it skips, or fails under CI=true.
func setup(t *testing.T) *dbBundle {
	t.Helper()
	needDB(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	tx, err := dbStore.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
	return &dbBundle{ctx: ctx, tx: tx, q: &dbStore.q, s: dbStore, scope: "t_" + randomHex(6)}
}

// needDB skips the test without TEST_POSTGRES_DSN (fails it under CI=true,
// or when the schema could not be prepared).
func needDB(t *testing.T) {
	t.Helper()
	if dbStore != nil {
		return
	}
	switch {
	case dbSetupErr != nil:
		t.Fatalf("TEST_POSTGRES_DSN is set, but the test schema could not be prepared: %v", dbSetupErr)
	case os.Getenv("CI") == "true":
		t.Fatal(startPostgres + " (CI=true: the SQL tests must run, not skip)")
	default:
		t.Skip(startPostgres)
	}
}

// msg is a delivery of this test's scope.
func (b *dbBundle) msg(messageID, businessKey string) *dedup.Message {
	return &dedup.Message{Identity: dedup.Identity{Scope: b.scope, MessageID: messageID, BusinessKey: businessKey},
		Topic: "orders", Key: []byte("k"), Payload: []byte(`{"n":1}`), Headers: map[string]string{"h": "v"}, Source: "test"}
}

// row is a record as the test's transaction sees it.
type row struct {
	status      dedup.Status
	attempts    int
	lastError   string
	fence       int64
	expiresIn   *float64 // seconds from now; nil: never
	owner       string
	startMark   *int
	leaseLiveIn *float64 // seconds from now; nil: no lease
}

func (b *dbBundle) row(t *testing.T, id int64) row {
	t.Helper()
	var r row
	var status string
	err := b.tx.QueryRow(b.ctx, `select status, attempts, coalesce(last_error, ''), fence,
  extract(epoch from expires_at - now())::float8, coalesce(owner_token::text, ''), start_mark,
  extract(epoch from lease_until - now())::float8
from `+b.q.tables["records"].(string)+` where id = $1`, id).
		Scan(&status, &r.attempts, &r.lastError, &r.fence, &r.expiresIn, &r.owner, &r.startMark, &r.leaseLiveIn)
	if err != nil {
		t.Fatalf("record %d: %v", id, err)
	}
	r.status = dedup.Status(status)
	return r
}

// insert claims a new record, failing the test when it was not inserted.
func (b *dbBundle) insert(t *testing.T, r newRecord) int64 {
	t.Helper()
	id, err := b.q.insert(b.ctx, b.tx, r)
	if err != nil || id == 0 {
		t.Fatalf("insert %s: id %d, %v", r.msg.Identity, id, err)
	}
	return id
}

func secs(d time.Duration) *float64 { f := d.Seconds(); return &f }
