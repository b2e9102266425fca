package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// commitFailureClass is what a failed COMMIT means: a COMMIT the server
// answered with an error (or with ROLLBACK: the transaction was aborted) did
// not commit, and is the handler's failure unless it is transient or the
// server is terminating the connection; any other error (io, network,
// context) leaves the outcome unknown.
func commitFailureClass(err error) dedup.FailureClass {
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return dedup.FailureHandler
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return dedup.Classify(pgErr)
	}
	return dedup.FailureOutcomeUnknown
}

// handlerFailureClass is what a handler's error means given the transaction
// it ran in: the caller's context ended or the transaction's connection is
// gone (outcome unknown, not the handler's failure), a transient error, a
// permanent one, or else the handler's failure.
//
// A connection closed by the handler's own deadline is the handler's failure:
// pgx interrupts a statement whose context ends by closing the connection
// (unless the pool uses pgconn.CancelRequestContextWatcherHandler), so a
// handler cut off by consumer.Config.MaxHandlerDuration, or by a deadline it
// set itself, inside a statement leaves a closed connection and an error
// wrapping context.DeadlineExceeded while the caller's ctx is alive. It is
// counted and marked in a new transaction; otherwise such a message would be
// redelivered, and cut off, forever.
func handlerFailureClass(ctx context.Context, tx pgx.Tx, herr error) dedup.FailureClass {
	if ctx.Err() != nil {
		return dedup.FailureOutcomeUnknown
	}
	if tx != nil && tx.Conn() != nil && tx.Conn().IsClosed() && !errors.Is(herr, context.DeadlineExceeded) {
		return dedup.FailureOutcomeUnknown
	}
	switch c := classify(herr); c {
	case dedup.FailureTransient, dedup.FailurePermanent:
		return c
	}
	return dedup.FailureHandler
}

// ownFailureClass is what an error of one of the store's own statements
// (begin, claim, mark) means: transient, outcome unknown (the connection is
// gone), or else a failure that the batch cannot get past, which a
// per-message rerun pins on one message or reports.
func ownFailureClass(err error) dedup.FailureClass {
	switch c := classify(err); c {
	case dedup.FailureTransient, dedup.FailureOutcomeUnknown:
		return c
	}
	return dedup.FailureHandler
}

// classify is dedup.Classify plus what pgx alone knows: a closed connection
// (pgconn.ErrConnClosed) and a failed connection attempt
// (*pgconn.ConnectError) leave the outcome unknown.
func classify(err error) dedup.FailureClass {
	var connErr *pgconn.ConnectError
	if err != nil && !dedup.IsPermanent(err) && (errors.Is(err, pgconn.ErrConnClosed) || errors.As(err, &connErr)) {
		return dedup.FailureOutcomeUnknown
	}
	return dedup.Classify(err)
}

// wrapUnknown wraps err with dedup.ErrOutcomeUnknown when it is of that
// class and does not already, so that dedup.Classify of what the store
// returns is exact.
func wrapUnknown(err error) error {
	if classify(err) == dedup.FailureOutcomeUnknown && !errors.Is(err, dedup.ErrOutcomeUnknown) {
		return fmt.Errorf("%w: %w", dedup.ErrOutcomeUnknown, err)
	}
	return err
}
