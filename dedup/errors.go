package dedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrFingerprintConflict is wrapped by Result.Err of every OutcomeConflict
// (a *ConflictError): the delivery's message ID or business key has a record
// whose payload fingerprint differs (or was made with a key no longer
// configured). ErrMessageIDCollision or ErrPayloadConflict says which kind.
var ErrFingerprintConflict = errors.New("idemq: fingerprint conflict")

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps a handler error to say that retrying cannot help (a
// malformed payload, a business rule that rejects the message). The record
// goes straight to FAILED_FINAL with a dead-letter row, whatever attempts
// remain. Permanent(nil) returns nil. The wrapped error stays reachable with
// errors.Is/As.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was made by
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// ErrorClass classifies a handler error for the last_error_class column and
// metrics. Results:
//
//   - "permanent" for Permanent errors (their cause is classified after a
//     colon, e.g. "permanent:error");
//   - "pg:<SQLSTATE>" or "pg:<SQLSTATE>:<constraint>" for a *pgconn.PgError
//     anywhere in the chain, so a unique violation raised by the handler's own
//     table reads "pg:23505:orders_order_no_key" even when wrapped with %w;
//   - for a conflict (ErrFingerprintConflict), its reason:
//     "message_id_collision" or "payload_conflict" ("fingerprint_conflict"
//     when the error names neither);
//   - "timeout" for context.DeadlineExceeded, "canceled" for context.Canceled;
//   - "panic" for a recovered handler panic;
//   - "error" otherwise.
func ErrorClass(err error) string {
	if err == nil {
		return ""
	}
	var p *permanentError
	if errors.As(err, &p) {
		return "permanent:" + ErrorClass(p.err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.ConstraintName != "" {
			return "pg:" + pgErr.Code + ":" + pgErr.ConstraintName
		}
		return "pg:" + pgErr.Code
	}
	var pe *PanicError
	switch {
	case errors.Is(err, ErrFingerprintConflict):
		return conflictClass(err)
	case errors.As(err, &pe):
		return "panic"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "error"
}

// IsUniqueViolation reports whether err holds a Postgres unique violation
// (SQLSTATE 23505); constraint, when not empty, must also match.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && (constraint == "" || pgErr.ConstraintName == constraint)
}

// PanicError is the handler error recorded when a handler panics. The panic is
// recovered, the transaction rolled back, and the attempt marked failed like
// any other error, so a poison message cannot crash the consumer.
type PanicError struct {
	// Value is what the handler passed to panic.
	Value any
}

// Error returns "handler panic: <value>".
func (e *PanicError) Error() string { return fmt.Sprintf("handler panic: %v", e.Value) }
