package dedup

import (
	"context"
	"errors"
	"fmt"
	"reflect"
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
// Permanent, or has a method Permanent() bool that returns true: the way
// a package that imports nothing of idemq says that retrying cannot help
// (transition.IllegalTransitionError does, for a move the entity can never
// make). Every store and mode reads permanence through IsPermanent.
func IsPermanent(err error) bool {
	var p *permanentError
	if errors.As(err, &p) {
		return true
	}
	return hasPermanentMethod(err)
}

// hasPermanentMethod reports whether an error in err's chain has a
// Permanent() bool method that returns true.
func hasPermanentMethod(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

// ErrorClass classifies a handler error for the last_error_class column and
// metrics. Results:
//
//   - "permanent" for Permanent errors and errors whose Permanent() bool
//     method returns true (see IsPermanent; their cause is classified
//     after a colon, e.g. "permanent:error");
//   - "pg:<SQLSTATE>" or "pg:<SQLSTATE>:<constraint>" for a SQL server error
//     anywhere in the chain (an error with a SQLState() string method, such as
//     *pgconn.PgError; the constraint comes from a ConstraintName field or
//     method when the error has one), so a unique violation raised by the
//     handler's own table reads "pg:23505:orders_order_no_key" even when
//     wrapped with %w;
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
	if IsPermanent(err) {
		return "permanent:" + errorClass(err)
	}
	return errorClass(err)
}

// errorClass is ErrorClass without the "permanent" prefix.
func errorClass(err error) string {
	var state sqlStater
	if errors.As(err, &state) {
		if c := constraintName(state); c != "" {
			return "pg:" + state.SQLState() + ":" + c
		}
		return "pg:" + state.SQLState()
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

// PanicError is the handler error recorded when a handler panics. The panic is
// recovered, the transaction rolled back, and the attempt marked failed like
// any other error, so a poison message cannot crash the consumer.
type PanicError struct {
	// Value is what the handler passed to panic.
	Value any
}

// Error returns "handler panic: <value>".
func (e *PanicError) Error() string { return fmt.Sprintf("handler panic: %v", e.Value) }

// constraintName is the constraint a SQL server error names: its
// ConstraintName() method, or else its exported ConstraintName string field
// (*pgconn.PgError has the field), or "".
func constraintName(e sqlStater) string {
	if c, ok := e.(interface{ ConstraintName() string }); ok {
		return c.ConstraintName()
	}
	return stringField(e, "ConstraintName")
}

// serverMessage is a SQL server error's primary message: its Message()
// method, or else its exported Message string field (*pgconn.PgError has
// the field), or "".
func serverMessage(e sqlStater) string {
	if m, ok := e.(interface{ Message() string }); ok {
		return m.Message()
	}
	return stringField(e, "Message")
}

// stringField is e's exported string field name (e a struct or a pointer
// to one), or "".
func stringField(e any, name string) string {
	v := reflect.ValueOf(e)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		if f := v.FieldByName(name); f.IsValid() && f.Kind() == reflect.String {
			return f.String()
		}
	}
	return ""
}
