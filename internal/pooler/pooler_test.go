package pooler

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var errInvalid = errors.New("invalid config")

// lazyPool is a pool in mode that never connects (pgxpool connects lazily).
func lazyPool(t *testing.T, mode pgx.QueryExecMode) *pgxpool.Pool {
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

// TestCheckExecMode: the modes that prepare statements across round trips
// or sessions are refused with an error naming the field and the fix; the
// others pass.
func TestCheckExecMode(t *testing.T) {
	refused := map[pgx.QueryExecMode]bool{pgx.QueryExecModeCacheStatement: true, pgx.QueryExecModeDescribeExec: true}
	for _, m := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		err := CheckExecMode(lazyPool(t, m), "x.Config.TransactionPooler", errInvalid)
		if !refused[m] {
			if err != nil {
				t.Errorf("%s: %v", m, err)
			}
			continue
		}
		if !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), "x.Config.TransactionPooler") ||
			!strings.Contains(err.Error(), "default_query_exec_mode=exec") {
			t.Errorf("%s: %v, want errInvalid naming the field and default_query_exec_mode=exec", m, err)
		}
	}
	if err := CheckExecMode(nil, "f", errInvalid); err != nil {
		t.Errorf("nil pool: %v", err)
	}
}
