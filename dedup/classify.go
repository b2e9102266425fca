package dedup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// FailureClass says what a failure means for a delivery, whatever step it
// happened in: whether it is counted as an attempt, marked, and acked. See
// Classify. Its string is stable (logs, metrics).
type FailureClass string

const (
	// FailureNone is the class of a nil error.
	FailureNone FailureClass = ""
	// FailureHandler is the handler's failure: an error or panic of the
	// handler, or a COMMIT the server refused (a deferred constraint, a
	// transaction the handler left aborted). It is counted as an attempt
	// and marked FAILED_RETRYABLE, or FAILED_FINAL with a dead letter once
	// Config.MaxAttempts is reached; the delivery is acked after the mark
	// commits only when final.
	FailureHandler FailureClass = "handler"
	// FailurePermanent is a Permanent error (or bad input): counted, marked
	// FAILED_FINAL with a dead letter at once, acked.
	FailurePermanent FailureClass = "permanent"
	// FailureTransient is a serialization failure (SQLSTATE 40001) or a
	// deadlock (40P01), wherever it is raised (a handler's statement, the
	// claim, the mark, the COMMIT): the whole transaction is retried at once
	// under Config.TransientRetry, without counting an attempt, marking or
	// acking. When those retries are used up it becomes a FailureHandler (in
	// batched mode: the batch is rerun one message per transaction).
	FailureTransient FailureClass = "transient"
	// FailureOutcomeUnknown means the database connection was lost or
	// terminated (SQLSTATE class 08, 57P01 admin shutdown, 57P02 crash
	// shutdown, 57P03 cannot connect now; an io or network error, a closed
	// connection) or the context ended. At COMMIT the transaction may or may
	// not have committed; before it, it rolled back. Either way it is not
	// the handler's failure: nothing is counted or marked and the delivery
	// is not acked; it is redelivered and the next copy finds the truth (a
	// SUCCEEDED record makes it a duplicate). Errors of this class returned
	// by the store wrap ErrOutcomeUnknown.
	FailureOutcomeUnknown FailureClass = "outcome_unknown"
)

// ErrOutcomeUnknown is wrapped by the error that Store.Process,
// Store.ProcessBatch and Store.ProcessLeased return when a delivery's
// outcome is not known to be durable for a reason that is not the handler's
// (FailureOutcomeUnknown): the connection was lost or terminated at COMMIT
// or while the handler ran, or the context ended. Nothing was counted or
// marked by this delivery; it must not be acked. The Result returned with it
// has HandlerCalled set when the handler ran. The cause stays reachable with
// errors.Is/As.
var ErrOutcomeUnknown = errors.New("idemq: outcome unknown")

// Classify says what err means, from the error alone (see FailureClass),
// first match wins:
//
//   - nil: FailureNone;
//   - an error wrapping ErrOutcomeUnknown: FailureOutcomeUnknown;
//   - a Permanent error: FailurePermanent (the caller's explicit word wins
//     over what it wraps);
//   - a *pgconn.PgError anywhere in the chain: SQLSTATE 40001 or 40P01 is
//     FailureTransient; class 08 (connection exception) and 57P01, 57P02,
//     57P03 are FailureOutcomeUnknown; every other SQLSTATE (constraint
//     violations, 57014 statement timeout, 25P02 aborted transaction, …) is
//     FailureHandler;
//   - a failed connection attempt (*pgconn.ConnectError), a closed
//     connection (pgconn.ErrConnClosed, net.ErrClosed), io.EOF,
//     io.ErrUnexpectedEOF, a net.Error, ECONNRESET, ECONNREFUSED,
//     ECONNABORTED, EPIPE, an error pgx raised before it sent anything
//     (pgconn.SafeToRetry), or context.Canceled / context.DeadlineExceeded:
//     FailureOutcomeUnknown;
//   - anything else: FailureHandler.
//
// The store applies Classify to the errors of its own database calls (the
// claim, the marks, the COMMIT), where any error that is not a server error
// leaves the outcome unknown. An error returned by a handler is judged with
// what the store knows beside it: it is FailureOutcomeUnknown only when the
// handler's transaction lost its connection or the caller's context ended,
// FailureTransient for 40001/40P01, FailurePermanent for Permanent, and
// otherwise the handler's failure, even when it is an io error (an HTTP call
// of the handler failing is the handler's failure).
func Classify(err error) FailureClass {
	if err == nil {
		return FailureNone
	}
	if errors.Is(err, ErrOutcomeUnknown) {
		return FailureOutcomeUnknown
	}
	if IsPermanent(err) {
		return FailurePermanent
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return classifySQLState(pgErr.Code)
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connErr), errors.As(err, &netErr),
		errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, net.ErrClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		pgconn.SafeToRetry(err),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return FailureOutcomeUnknown
	}
	return FailureHandler
}

// classifySQLState is Classify for a server error's SQLSTATE.
func classifySQLState(code string) FailureClass {
	switch {
	case code == "40001" || code == "40P01":
		return FailureTransient
	case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03":
		return FailureOutcomeUnknown
	}
	return FailureHandler
}

// IsTransient reports whether Classify(err) is FailureTransient: a
// serialization failure (40001) or a deadlock (40P01).
func IsTransient(err error) bool { return Classify(err) == FailureTransient }

// IsOutcomeUnknown reports whether Classify(err) is FailureOutcomeUnknown:
// a lost or terminated connection, or an ended context (and every error
// wrapping ErrOutcomeUnknown).
func IsOutcomeUnknown(err error) bool { return Classify(err) == FailureOutcomeUnknown }

// commitFailureClass is what a failed COMMIT means: a COMMIT the server
// answered with an error (or with ROLLBACK: the transaction was aborted) did
// not commit, and is the handler's failure unless it is transient or the
// server is terminating the connection; any other error (io, network,
// context) leaves the outcome unknown.
func commitFailureClass(err error) FailureClass {
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return FailureHandler
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return classifySQLState(pgErr.Code)
	}
	return FailureOutcomeUnknown
}

// handlerFailureClass is what a handler's error means given the transaction
// it ran in: the caller's context ended or the transaction's connection is
// gone (outcome unknown, not the handler's failure), a transient error, a
// permanent one, or else the handler's failure.
func handlerFailureClass(ctx context.Context, tx pgx.Tx, herr error) FailureClass {
	if ctx.Err() != nil || (tx != nil && tx.Conn() != nil && tx.Conn().IsClosed()) {
		return FailureOutcomeUnknown
	}
	switch c := Classify(herr); c {
	case FailureTransient, FailurePermanent:
		return c
	}
	return FailureHandler
}

// ownFailureClass is what an error of one of the store's own statements
// (begin, claim, mark) means: transient, outcome unknown (the connection is
// gone), or else a failure that the batch cannot get past, which a
// per-message rerun pins on one message or reports.
func ownFailureClass(err error) FailureClass {
	switch c := Classify(err); c {
	case FailureTransient, FailureOutcomeUnknown:
		return c
	}
	return FailureHandler
}

// wrapUnknown wraps err with ErrOutcomeUnknown when it is of that class and
// does not already.
func wrapUnknown(err error) error {
	if Classify(err) == FailureOutcomeUnknown && !errors.Is(err, ErrOutcomeUnknown) {
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	return err
}
