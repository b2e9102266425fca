package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlStateInFailedTx is 25P02: "current transaction is aborted, commands
// ignored until end of transaction block", the answer to every statement
// after one failed (until a rollback to a savepoint).
const sqlStateInFailedTx = "25P02"

// causeTx is the pgx.Tx a handler gets: the store's transaction, watching
// every statement the handler sends through it (Exec, Query and its rows,
// QueryRow, SendBatch and its results, CopyFrom, Prepare, and the same on a
// nested transaction from Begin) for the server error that aborted the
// transaction: the last one that is not 25P02. A handler that swallows that
// error and goes on sees 25P02 for its later statements (or returns nil and
// leaves the transaction aborted); explain then records the cause, not the
// symptom. Statements sent through Conn() are not watched.
//
// Like pgx's transactions it is not safe for concurrent use.
type causeTx struct {
	pgx.Tx
	c *txCause
}

// txCause is the cause a causeTx and its nested transactions share.
type txCause struct{ err *pgconn.PgError }

var _ pgx.Tx = (*causeTx)(nil)

// watchCause returns tx as the handler gets it (see causeTx).
func watchCause(tx pgx.Tx) *causeTx { return &causeTx{Tx: tx, c: &txCause{}} }

// keep keeps err's server error when it aborted the transaction.
func (t *causeTx) keep(err error) {
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && pgErr.Code != sqlStateInFailedTx {
		t.c.err = pgErr
	}
}

// note is keep that returns err.
func (t *causeTx) note(err error) error {
	t.keep(err)
	return err
}

// explain is the handler's failure herr as the store records it. A nil
// herr with the transaction left aborted (base's connection says so) is
// errLeftAborted. When herr is the symptom of an earlier failed statement
// of the handler (errLeftAborted, 25P02, a COMMIT answered ROLLBACK) that
// it does not already wrap, the result is a *causedError: that statement's
// error first (its SQLSTATE and constraint give dedup.ErrorClass and
// dedup.Classify), then herr. Any other herr is returned as it is.
func (t *causeTx) explain(herr error, base pgx.Tx) error {
	if sp, ok := base.(*savepointTx); ok {
		base = sp.Tx // its Conn would send the pending savepoint
	}
	if herr == nil && txAborted(base) {
		herr = errLeftAborted
	}
	cause := t.c.err
	if herr == nil || cause == nil || errors.Is(herr, cause) {
		return herr
	}
	var pgErr *pgconn.PgError
	symptom := errors.Is(herr, errLeftAborted) || errors.Is(herr, pgx.ErrTxCommitRollback) ||
		(errors.As(herr, &pgErr) && pgErr.Code == sqlStateInFailedTx)
	if !symptom {
		return herr
	}
	return &causedError{err: herr, cause: cause}
}

// causedError is a handler failure whose cause is an earlier statement's
// server error (see causeTx.explain). errors.Is/As see the cause first,
// then the failure.
type causedError struct {
	err   error           // the failure as the handler or the store saw it
	cause *pgconn.PgError // the statement that aborted the transaction
}

// Error is the failure, then the cause.
func (e *causedError) Error() string {
	return e.err.Error() + " (caused by the handler's failed statement: " + e.cause.Error() + ")"
}

// Unwrap is the cause, then the failure.
func (e *causedError) Unwrap() []error { return []error{e.cause, e.err} }

// Exec is the transaction's Exec, watched.
func (t *causeTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	tag, err := t.Tx.Exec(ctx, sql, arguments...)
	return tag, t.note(err)
}

// Query is the transaction's Query; its rows are watched.
func (t *causeTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := t.Tx.Query(ctx, sql, args...)
	t.keep(err)
	if rows == nil {
		return nil, err
	}
	return &causeRows{Rows: rows, t: t}, err
}

// QueryRow is the transaction's QueryRow; its Scan is watched.
func (t *causeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return causeRow{row: t.Tx.QueryRow(ctx, sql, args...), t: t}
}

// SendBatch is the transaction's SendBatch; its results are watched.
func (t *causeTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return &causeBatch{BatchResults: t.Tx.SendBatch(ctx, b), t: t}
}

// CopyFrom is the transaction's CopyFrom, watched.
func (t *causeTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	n, err := t.Tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, t.note(err)
}

// Prepare is the transaction's Prepare, watched.
func (t *causeTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	sd, err := t.Tx.Prepare(ctx, name, sql)
	return sd, t.note(err)
}

// Begin starts a nested transaction (a savepoint), watched with t.
func (t *causeTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, t.note(err)
	}
	return &causeTx{Tx: tx, c: t.c}, nil
}

// Commit is the nested transaction's Commit (RELEASE), watched.
func (t *causeTx) Commit(ctx context.Context) error { return t.note(t.Tx.Commit(ctx)) }

// causeRows are a handler's rows, watched.
type causeRows struct {
	pgx.Rows
	t *causeTx
}

// Next is the rows' Next; at their end their error is watched.
func (r *causeRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.t.keep(r.Rows.Err())
	return false
}

// Close closes the rows and watches their error.
func (r *causeRows) Close() {
	r.Rows.Close()
	r.t.keep(r.Rows.Err())
}

// Err is the rows' error, watched.
func (r *causeRows) Err() error { return r.t.note(r.Rows.Err()) }

// causeRow is a handler's row, watched.
type causeRow struct {
	row pgx.Row
	t   *causeTx
}

// Scan is the row's Scan, watched.
func (r causeRow) Scan(dest ...any) error { return r.t.note(r.row.Scan(dest...)) }

// causeBatch are a handler's batch results, watched.
type causeBatch struct {
	pgx.BatchResults
	t *causeTx
}

// Exec is the next result's Exec, watched.
func (b *causeBatch) Exec() (pgconn.CommandTag, error) {
	tag, err := b.BatchResults.Exec()
	return tag, b.t.note(err)
}

// Query is the next result's Query; its rows are watched.
func (b *causeBatch) Query() (pgx.Rows, error) {
	rows, err := b.BatchResults.Query()
	b.t.keep(err)
	if rows == nil {
		return nil, err
	}
	return &causeRows{Rows: rows, t: b.t}, err
}

// QueryRow is the next result's QueryRow; its Scan is watched.
func (b *causeBatch) QueryRow() pgx.Row { return causeRow{row: b.BatchResults.QueryRow(), t: b.t} }

// Close closes the results, watched.
func (b *causeBatch) Close() error { return b.t.note(b.BatchResults.Close()) }
