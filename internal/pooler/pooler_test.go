package pooler

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/testkit"
	"github.com/jackc/pgx/v5"
)

var errInvalid = errors.New("invalid config")

// TestCheckExecMode: the modes that prepare statements across round trips
// or sessions are refused with an error naming the field and the fix; the
// others pass.
func TestCheckExecMode(t *testing.T) {
	refused := map[pgx.QueryExecMode]bool{pgx.QueryExecModeCacheStatement: true, pgx.QueryExecModeDescribeExec: true}
	for _, m := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		err := CheckExecMode(testkit.LazyPool(t, m), "x.Config.TransactionPooler", errInvalid)
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
