package testkit

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LazyPool returns a pool in exec mode mode that never connects: pgxpool
// connects lazily, and its address (127.0.0.1:1) answers nothing, so a test
// of configuration checks can hold a real *pgxpool.Pool without a server.
// The pool is closed when the test ends.
func LazyPool(t testing.TB, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://u@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
