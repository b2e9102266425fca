package dedup

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
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
	// the store's MaxAttempts is reached; the delivery is acked after the mark
	// commits only when final.
	FailureHandler FailureClass = "handler"
	// FailurePermanent is a Permanent error (IsPermanent: also an error
	// whose Permanent() bool method returns true, such as an illegal
	// transition the entity can never make), or bad input: counted, marked
	// FAILED_FINAL with a dead letter at once, acked.
	FailurePermanent FailureClass = "permanent"
	// FailureTransient is a serialization failure (SQLSTATE 40001), a
	// deadlock (40P01), or a statement cache made stale by a schema change
	// or a lost session (0A000 "cached plan must not change result type",
	// 26000 "prepared statement does not exist": the driver prepares the
	// statement again on the next try), wherever it is raised (a handler's
	// statement, the claim, the mark, the COMMIT): the whole transaction is retried at once
	// under the store's TransientRetry, without counting an attempt, marking or
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

// ErrOutcomeUnknown is wrapped by the error that a store's Process,
// ProcessBatch and ProcessLeased (pgstore.Store, redisstore.Store) return when a delivery's
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
//   - a Permanent error, or one whose Permanent() bool method returns true
//     (IsPermanent): FailurePermanent (the caller's explicit word wins over
//     what it wraps);
//   - an error with a SQLState() string method anywhere in the chain (a
//     *pgconn.PgError, or any SQL driver's server error that has one):
//     FailureTransient for 0A000 whose message (a Message() method or
//     exported Message string field, as *pgconn.PgError has) is "cached
//     plan must not change result type", else ClassifySQLState of its code;
//   - an error with a SafeToRetry() bool method that returns true (pgx's
//     errors raised before anything was sent), io.EOF, io.ErrUnexpectedEOF,
//     net.ErrClosed, a net.Error, ECONNRESET, ECONNREFUSED, ECONNABORTED,
//     EPIPE, or context.Canceled / context.DeadlineExceeded:
//     FailureOutcomeUnknown;
//   - anything else: FailureHandler.
//
// Classify knows no database driver. A store adds what its driver knows (the
// Postgres store, dedup/pgstore, also treats pgx's closed-connection and
// failed-connect errors as FailureOutcomeUnknown) and wraps such errors with
// ErrOutcomeUnknown before returning them, so that Classify of what a store
// returns is exact.
//
// A store applies Classify to the errors of its own database calls (the
// claim, the marks, the COMMIT), where any error that is not a server error
// leaves the outcome unknown. An error returned by a handler is judged with
// what the store knows beside it: it is FailureOutcomeUnknown only when the
// handler's transaction lost its connection or the caller's context ended,
// FailureTransient for 40001/40P01 and a stale statement cache (0A000 cached
// plan, 26000), FailurePermanent for Permanent, and
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
	var state sqlStater
	if errors.As(err, &state) {
		code := state.SQLState()
		if code == sqlStateFeatureNotSupported && serverMessage(state) == msgCachedPlanChangedType {
			return FailureTransient
		}
		return ClassifySQLState(code)
	}
	var safe interface{ SafeToRetry() bool }
	var netErr net.Error
	switch {
	case errors.As(err, &safe) && safe.SafeToRetry(), errors.As(err, &netErr),
		errors.Is(err, net.ErrClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return FailureOutcomeUnknown
	}
	return FailureHandler
}

// sqlStater is a SQL server error: *pgconn.PgError has this method.
type sqlStater interface{ SQLState() string }

// Postgres's answers to a statement cached before a schema change or lost
// with its session: a re-prepare fixes them.
const (
	// sqlStateFeatureNotSupported is 0A000, generic: only its
	// msgCachedPlanChangedType case is transient.
	sqlStateFeatureNotSupported = "0A000"
	// msgCachedPlanChangedType is the message of 0A000 for a prepared
	// statement whose result columns changed (ALTER TABLE … ADD COLUMN
	// under `select *`, a column's type changed).
	msgCachedPlanChangedType = "cached plan must not change result type"
	// sqlStateInvalidSQLStatementName is 26000: the prepared statement
	// does not exist (a pooler switched the session, DISCARD ALL).
	sqlStateInvalidSQLStatementName = "26000"
)

// ClassifySQLState is Classify for a SQL server error's SQLSTATE code:
// 40001 (serialization failure), 40P01 (deadlock) and 26000 (prepared
// statement does not exist) are FailureTransient (0A000 is, only with its
// "cached plan must not change result type" message: see Classify);
// class 08 (connection exception), 57P01 (admin shutdown), 57P02 (crash
// shutdown) and 57P03 (cannot connect now) are FailureOutcomeUnknown; every
// other code (constraint violations, 57014 statement timeout, 25P02 aborted
// transaction, …) is FailureHandler.
func ClassifySQLState(code string) FailureClass {
	switch {
	case code == "40001" || code == "40P01" || code == sqlStateInvalidSQLStatementName:
		return FailureTransient
	case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03":
		return FailureOutcomeUnknown
	}
	return FailureHandler
}

// IsTransient reports whether Classify(err) is FailureTransient: a
// serialization failure (40001), a deadlock (40P01), or a stale statement
// cache (0A000 "cached plan must not change result type", 26000).
func IsTransient(err error) bool { return Classify(err) == FailureTransient }

// IsOutcomeUnknown reports whether Classify(err) is FailureOutcomeUnknown:
// a lost or terminated connection, or an ended context (and every error
// wrapping ErrOutcomeUnknown).
func IsOutcomeUnknown(err error) bool { return Classify(err) == FailureOutcomeUnknown }
