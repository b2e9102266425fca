package pgstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// savepointTx is the pgx.Tx a batched per-message handler gets (ProcessBatch):
// the batch's transaction, with the handler's savepoint (and the release of
// the previous message's) pending until the handler's first statement, in
// whose round trip it travels, as lazyTx's BEGIN travels with the claim.
// Exec, Query, QueryRow and SendBatch queue the pending statements in front
// of the handler's (one round trip for both); an Exec without arguments,
// which pgx sends with the simple protocol (it may hold several statements),
// gets them in front of its text, in the same simple query (when that fails,
// whether the savepoint was set is not known — a syntax error runs none of
// the query — so the failure is the pending statements': see err). Every
// other use
// of the transaction (CopyFrom, which cannot be pipelined; Begin, Prepare,
// LargeObjects, Conn, Commit, Rollback) and a statement with a pgx option
// argument (QueryExecMode, QueryRewriter such as pgx.NamedArgs, result
// formats) sends the pending statements alone first, then delegates. Once
// they were sent, every method delegates to the transaction.
//
// sent reports whether the savepoint was set (or at least sent: its outcome
// is then the transaction's): a handler that did nothing on the
// transaction set none, and has nothing to roll back. err is the pending
// statements' own failure, when it is known apart from the handler's
// statement (it then fails the handler's statement too).
//
// Like pgx's transactions it is not safe for concurrent use.
type savepointTx struct {
	pgx.Tx
	pending []string // the statements to send first; nil once sent
	sent    bool
	err     error
}

var _ pgx.Tx = (*savepointTx)(nil)

// withPending returns tx with pending in front of its first statement; with
// no pending statement it is tx itself.
func withPending(tx pgx.Tx, pending ...string) pgx.Tx {
	if len(pending) == 0 {
		return tx
	}
	return &savepointTx{Tx: tx, pending: pending}
}

// handlerSent reports whether the handler's pending savepoint statements were
// sent on tx (a *savepointTx), and their own failure if known; any other tx
// had nothing pending.
func handlerSent(tx pgx.Tx) (sent bool, err error) {
	if t, ok := tx.(*savepointTx); ok {
		return t.sent, t.err
	}
	return true, nil
}

// fail records the pending statements' failure.
func (t *savepointTx) fail(err error) error {
	t.err = fmt.Errorf("idemq: savepoint: %w", err)
	return t.err
}

// flush sends the pending statements alone (one round trip), when a use of
// the transaction other than a plain statement comes first.
func (t *savepointTx) flush(ctx context.Context) error {
	if t.pending == nil {
		return t.err
	}
	b := t.prefixBatch(0)
	t.pending, t.sent = nil, true
	if err := t.Tx.SendBatch(ctx, b).Close(); err != nil {
		return t.fail(err)
	}
	return nil
}

// prefixBatch is a batch of the pending statements, with room for n more.
func (t *savepointTx) prefixBatch(n int) *pgx.Batch {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(t.pending)+n)}
	for _, sql := range t.pending {
		b.Queue(sql)
	}
	return b
}

// send sends the pending statements with b's queries (one round trip) and
// reads the pending ones' results; on their failure the batch is closed and
// the error returned. When the batch failed before anything ran (pgx could
// not encode an argument of b's: the transaction is still in progress, not
// aborted), nothing is sent yet and again is set: the caller sends the
// pending statements alone, then its own (which fail as they would have).
// When b's statement fails to prepare (pgx prepares a statement it has not
// cached before it runs the batch), the transaction is aborted before the
// savepoint was set: that is the pending statements' failure (err), so that
// the store does not roll back to an older savepoint; it fails the batch's
// try, which is rerun one message per transaction.
func (t *savepointTx) send(ctx context.Context, b *pgx.Batch) (br pgx.BatchResults, again bool, err error) {
	nb := t.prefixBatch(len(b.QueuedQueries))
	n := len(nb.QueuedQueries)
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
	pending := t.pending
	t.pending, t.sent = nil, true
	br = t.Tx.SendBatch(ctx, nb)
	for range n {
		if _, err = br.Exec(); err != nil {
			_ = br.Close() // the same error
			if c := t.Tx.Conn(); c != nil && !c.IsClosed() && c.PgConn().TxStatus() == 'T' {
				t.pending, t.sent = pending, false
				return nil, true, nil
			}
			return nil, false, t.fail(err)
		}
	}
	return br, false, nil
}

// hasOption reports whether args start with a pgx option (see pgx.Conn.Exec
// and Query), which a batch does not take as a plain statement would.
func hasOption(args []any) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryRewriter, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return true
	}
	return false
}

// Exec sends the pending statements with sql: in one batch when it has
// arguments, in front of its text when it has none (pgx's simple protocol).
func (t *savepointTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	switch {
	case t.pending == nil:
	case hasOption(arguments):
		if err := t.flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
	case len(arguments) == 0:
		// One simple query: the pending statements, then sql (the command
		// tag returned is its last statement's, as pgx's).
		var prefix strings.Builder
		for _, p := range t.pending {
			prefix.WriteString(strings.TrimRight(strings.TrimSpace(p), ";"))
			prefix.WriteString(";\n")
		}
		t.pending, t.sent = nil, true
		tag, err := t.Tx.Exec(ctx, prefix.String()+sql)
		if err != nil {
			// Whether the savepoint was set is not known: a syntax error
			// anywhere in a simple query runs none of it.
			return tag, t.fail(err)
		}
		return tag, nil
	default:
		b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 1)}
		b.Queue(sql, arguments...)
		br, again, err := t.send(ctx, b)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		if again {
			if err := t.flush(ctx); err != nil {
				return pgconn.CommandTag{}, err
			}
			return t.Tx.Exec(ctx, sql, arguments...)
		}
		tag, err := br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return tag, err
	}
	return t.Tx.Exec(ctx, sql, arguments...)
}

// Query sends the pending statements with sql, in one batch; the batch is
// closed with the rows.
func (t *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.pending != nil && hasOption(args) {
		if err := t.flush(ctx); err != nil {
			return nil, err
		}
	}
	if t.pending == nil {
		return t.Tx.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 1)}
	b.Queue(sql, args...)
	br, again, err := t.send(ctx, b)
	if err != nil {
		return nil, err
	}
	if again {
		if err := t.flush(ctx); err != nil {
			return nil, err
		}
		return t.Tx.Query(ctx, sql, args...)
	}
	rows, err := br.Query()
	if err != nil {
		rows.Close()
		_ = br.Close()
		return nil, err
	}
	return &closingRows{Rows: rows, br: br}, nil
}

// QueryRow sends the pending statements with sql, in one batch.
func (t *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.pending != nil && hasOption(args) {
		if err := t.flush(ctx); err != nil {
			return errRow{err}
		}
	}
	if t.pending == nil {
		return t.Tx.QueryRow(ctx, sql, args...)
	}
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 1)}
	b.Queue(sql, args...)
	br, again, err := t.send(ctx, b)
	if err != nil {
		return errRow{err}
	}
	if again {
		if err := t.flush(ctx); err != nil {
			return errRow{err}
		}
		return t.Tx.QueryRow(ctx, sql, args...)
	}
	return closingRow{br}
}

// SendBatch sends the pending statements in front of b's queries (one round
// trip); when they fail, every result of b reports that error.
func (t *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.pending == nil {
		return t.Tx.SendBatch(ctx, b)
	}
	br, again, err := t.send(ctx, b)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if again {
		if err := t.flush(ctx); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
		return t.Tx.SendBatch(ctx, b)
	}
	return br
}

// CopyFrom sends the pending statements alone first (COPY cannot be
// pipelined), then delegates.
func (t *savepointTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

// Begin sends the pending statements alone first, then starts a pseudo
// nested transaction (a savepoint of pgx's own), as pgx.Tx.Begin.
func (t *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

// Prepare sends the pending statements alone first (a failed prepare aborts
// the transaction), then delegates.
func (t *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

// LargeObjects sends the pending statements alone first (with a background
// context: pgx's method takes none), then delegates.
func (t *savepointTx) LargeObjects() pgx.LargeObjects {
	_ = t.flush(context.Background())
	return t.Tx.LargeObjects()
}

// Conn sends the pending statements alone first (with a background context:
// whatever the handler sends on the connection must come after the
// savepoint), then returns the transaction's connection.
func (t *savepointTx) Conn() *pgx.Conn {
	_ = t.flush(context.Background())
	return t.Tx.Conn()
}

// Commit sends the pending statements alone first, then delegates (the
// store's transaction is not the handler's to end; the store then fails).
func (t *savepointTx) Commit(ctx context.Context) error {
	if err := t.flush(ctx); err != nil {
		return err
	}
	return t.Tx.Commit(ctx)
}

// Rollback sends the pending statements alone first, then delegates (as
// Commit).
func (t *savepointTx) Rollback(ctx context.Context) error {
	if err := t.flush(ctx); err != nil {
		return err
	}
	return t.Tx.Rollback(ctx)
}

// closingRows are the rows of the last query of a batch: the batch is closed
// with them (when Next reports no more rows, or at Close).
type closingRows struct {
	pgx.Rows
	br  pgx.BatchResults // nil once closed
	err error            // the batch's close error
}

func (r *closingRows) closeBatch() {
	if r.br != nil {
		r.err = r.br.Close()
		r.br = nil
	}
}

// Next is the rows' Next; at the end of the rows the batch is closed.
func (r *closingRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.closeBatch()
	return false
}

// Close closes the rows, then the batch.
func (r *closingRows) Close() {
	r.Rows.Close()
	r.closeBatch()
}

// Err is the rows' error, else the batch's.
func (r *closingRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}
