// Package testkit holds test helpers shared by the package tests of
// dedup/pgstore and the integration module, so that neither keeps a copy.
// Only tests import it (internal/archcheck).
package testkit

import (
	"bytes"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
)

// AtCommit returns the statements that install on table tbl a deferred
// constraint trigger named name, so that it runs at COMMIT, after the
// handler returned: for each row of events ("insert", "update") where cond
// holds (SQL over NEW), the first n times (n < 0: every time), it runs action
// (PL/pgSQL). seq and fn are the quoted, schema-qualified names of the
// sequence that counts the firings (sequences are not rolled back, so the
// count survives failed commits and the test is deterministic) and of the
// trigger function.
func AtCommit(seq, fn, name, tbl, events, cond, action string, n int) []string {
	limit := "true"
	if n >= 0 {
		limit = "nextval('" + seq + "') <= " + strconv.Itoa(n)
	}
	return []string{
		`create sequence ` + seq,
		`create function ` + fn + `() returns trigger language plpgsql as $$
begin
  if (` + cond + `) and ` + limit + ` then
    ` + action + `;
  end if;
  return null;
end $$`,
		`create constraint trigger ` + pgx.Identifier{name}.Sanitize() + ` after ` + events + ` on ` + tbl +
			` deferrable initially deferred for each row execute function ` + fn + `()`,
	}
}

// KillOwnBackend is an AtCommit action that terminates the committing session
// itself: the client gets FATAL 57P01 at COMMIT and the transaction does not
// commit. Only the test's own backend is ever terminated.
const KillOwnBackend = `perform pg_terminate_backend(pg_backend_pid())`

// RaiseSQLState is an AtCommit action that raises an error with SQLSTATE
// code.
func RaiseSQLState(code string) string {
	return `raise exception 'simulated SQLSTATE ` + code + ` at commit' using errcode = '` + code + `'`
}

// LogBuffer collects a logger's output; safe for concurrent writes.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
