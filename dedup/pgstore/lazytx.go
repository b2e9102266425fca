package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lazyTx is a pgx.Tx whose BEGIN travels with the first batch sent on it:
// the store's first statements of a transaction (the claim) are a batch, so
// BEGIN costs no round trip of its own (pgx's Batch.BeginTx queues it in
// front). It runs on a connection acquired from the pool when it is made,
// and gives the connection back when it ends: at Commit, Rollback,
// commitWith that ends the transaction, or a BEGIN that fails.
//
// To a handler it is an ordinary transaction: the store has always sent its
// claim before the handler runs, so every method delegates to the begun
// transaction (pgx's own, on the acquired connection). A method other than
// SendBatch called before anything was sent begins the transaction at once
// (one round trip, as pgx.Conn.BeginTx), so the lazy BEGIN never changes what
// a statement sees. Commit or Rollback of a transaction that never sent
// anything sends nothing (there is nothing to end) and only gives the
// connection back.
//
// Like pgx's transactions it is not safe for concurrent use.
type lazyTx struct {
	c    *pgxpool.Conn // nil once given back to the pool
	opts pgx.TxOptions
	tx   pgx.Tx // the begun transaction; nil until BEGIN was sent
	done bool   // committed, rolled back, or BEGIN failed

	// first and firstResults are the first batch (BEGIN and the caller's
	// queries) and its results, kept here to spare two allocations.
	first        pgx.Batch
	firstResults lazyBatchResults
}

var _ pgx.Tx = (*lazyTx)(nil)

// beginLazy acquires a connection from pool for a transaction with opts
// whose BEGIN is sent with its first batch. Its errors are the pool's
// (pgxpool.Pool.Acquire): a failed connection attempt or the context ended.
func beginLazy(ctx context.Context, pool *pgxpool.Pool, opts pgx.TxOptions) (*lazyTx, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &lazyTx{c: c, opts: opts}, nil
}

// release gives the connection back to the pool (a closed connection, or one
// left inside a transaction, is destroyed by the pool) and ends t.
func (t *lazyTx) release() {
	t.done = true
	if t.c != nil {
		t.c.Release()
		t.c = nil
	}
}

// begin sends BEGIN alone when a statement other than a batch comes first.
func (t *lazyTx) begin(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	if t.tx != nil {
		return nil
	}
	tx, err := t.c.Conn().BeginTx(ctx, t.opts)
	if err != nil {
		t.release()
		return err
	}
	t.tx = tx
	return nil
}

// SendBatch sends b; the first batch of the transaction carries BEGIN in
// front of b's queries (one round trip for both). The BEGIN's result is
// read here: when it fails (or the batch cannot be sent), every result of b
// reports that error and the connection is given back.
func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.done {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	if t.tx != nil {
		return t.tx.SendBatch(ctx, b)
	}
	nb := &t.first
	nb.QueuedQueries = make([]*pgx.QueuedQuery, 0, len(b.QueuedQueries)+1)
	nb.BeginTx(t.opts)
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
	br := t.c.Conn().SendBatch(ctx, nb)
	if _, err := br.Exec(); err != nil {
		_ = br.Close() // the same error, or the connection is closed
		t.release()
		return pgx.FailedBatchResults(b, err)
	}
	t.tx = br.Tx()
	t.firstResults.BatchResults = br
	return &t.firstResults
}

// lazyBatchResults are the results of b's queries in a batch that also
// began the transaction; Tx is nil, as for any batch sent in a transaction.
type lazyBatchResults struct{ pgx.BatchResults }

func (*lazyBatchResults) Tx() pgx.Tx { return nil }

// commitWith sends b's queries and COMMIT in one batch (one round trip):
// the store's last marks travel with the COMMIT. scan reads the results of
// b's queries, in order (nil: each is read as an Exec); it must read them
// all, and return the first error. ended reports whether the transaction is
// over (committed, or rolled back by the server, or its connection gone): t
// is then done and its connection given back. A query of b that fails with
// a server error makes the server skip the rest, COMMIT included: err is
// that query's error and the transaction is still open (aborted; ended
// false), so that the caller may roll back to a savepoint and go on, or roll
// back. Any error that is not the server's (the connection lost) leaves the
// COMMIT's outcome unknown, whichever result was being read. A COMMIT that
// answers ROLLBACK returns pgx.ErrTxCommitRollback, as pgx.Tx.Commit does.
func (t *lazyTx) commitWith(ctx context.Context, b *pgx.Batch, scan func(pgx.BatchResults) error) (ended bool, err error) {
	if t.done {
		return true, pgx.ErrTxClosed
	}
	n := len(b.QueuedQueries)
	b.Queue("commit")
	br := t.SendBatch(ctx, b)
	if t.done { // BEGIN failed
		return true, br.Close()
	}
	if scan != nil {
		err = scan(br)
	} else {
		for i := 0; i < n && err == nil; i++ {
			_, err = br.Exec()
		}
	}
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if conn := t.c.Conn(); conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		t.release()
		ended = true
	}
	if err == nil && tag.String() == "ROLLBACK" {
		return ended, pgx.ErrTxCommitRollback
	}
	return ended, err
}

// Commit commits the transaction (see pgx.Tx) and gives the connection back.
// A transaction that never sent anything has nothing to commit.
func (t *lazyTx) Commit(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	defer t.release()
	if t.tx == nil {
		return nil
	}
	return t.tx.Commit(ctx)
}

// Rollback rolls the transaction back (see pgx.Tx) and gives the connection
// back; it is safe to call again (then it returns pgx.ErrTxClosed).
func (t *lazyTx) Rollback(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	defer t.release()
	if t.tx == nil {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// Begin starts a pseudo nested transaction (a savepoint), as pgx.Tx.Begin.
func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

// CopyFrom delegates to the begun transaction.
func (t *lazyTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

// LargeObjects returns the large objects of the transaction.
func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	// pgx.LargeObjects holds its transaction unexported: only a begun pgx
	// transaction can make one. Begin with a background context, as
	// pgx.Conn.BeginTx would have before returning the Tx; a transaction
	// that cannot begin (or has ended) has no large objects (the zero
	// value, which must not be used).
	if err := t.begin(context.Background()); err != nil {
		return pgx.LargeObjects{}
	}
	return t.tx.LargeObjects()
}

// Prepare delegates to the begun transaction.
func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// Exec delegates to the begun transaction.
func (t *lazyTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if err := t.begin(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.tx.Exec(ctx, sql, arguments...)
}

// Query delegates to the begun transaction.
func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Query(ctx, sql, args...)
}

// QueryRow delegates to the begun transaction.
func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.begin(ctx); err != nil {
		return errRow{err}
	}
	return t.tx.QueryRow(ctx, sql, args...)
}

// Conn is the acquired connection; nil once the transaction ended.
func (t *lazyTx) Conn() *pgx.Conn {
	if t.c == nil {
		return nil
	}
	return t.c.Conn()
}

// errRow is a pgx.Row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// batchRow runs one query as a batch of its own on tx and returns its row:
// on a lazyTx that has not begun, the BEGIN travels with it.
func batchRow(ctx context.Context, tx pgx.Tx, sql string, args ...any) pgx.Row {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 1)}
	b.Queue(sql, args...)
	return closingRow{tx.SendBatch(ctx, b)}
}

// closingRow is the only row of a one-query batch: Scan reads it and closes
// the batch.
type closingRow struct{ br pgx.BatchResults }

func (r closingRow) Scan(dest ...any) error {
	err := r.br.QueryRow().Scan(dest...)
	if cerr := r.br.Close(); err == nil || (errors.Is(err, pgx.ErrNoRows) && cerr != nil) {
		err = cerr
	}
	return err
}
