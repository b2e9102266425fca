package dedup

import (
	"errors"
	"fmt"
)

// A conflict is a delivery whose message ID or business key already has a
// record made from a different payload (HMAC-SHA256 fingerprint). It is never
// applied and never silently skipped: it is dead-lettered, then acked. There
// are two kinds, told apart by the business keys (ConflictReason), because
// they need different operator actions:
//
//   - ReasonMessageIDCollision: the delivery matched the record by message ID
//     and the business keys differ. Two different messages got one ID (a
//     client-side ID generator collision). The dead-lettered message was
//     never processed; pgstore.Store.RedriveAsNew processes it under a derived
//     identity and keeps both records.
//   - ReasonPayloadConflict: the business key is the same (matched by
//     business key, or by message ID with the same or no business key) and
//     the payload differs: one intent sent with two payloads. The record
//     stands; re-driving the other payload as new is refused unless forced.

// ErrMessageIDCollision is wrapped by Result.Err of an OutcomeConflict with
// ReasonMessageIDCollision (see ConflictError).
var ErrMessageIDCollision = errors.New("idemq: message ID collision")

// ErrPayloadConflict is wrapped by Result.Err of an OutcomeConflict with
// ReasonPayloadConflict (see ConflictError), and by the error of
// pgstore.Store.RedriveAsNew refusing a payload conflict without
// RedriveAsNewOptions.Force.
var ErrPayloadConflict = errors.New("idemq: payload conflict")

// ConflictReason is the dead-letter reason of a conflict: ReasonMessageIDCollision
// when the delivery matched the record by message ID (by) and the delivery's
// business key differs from the record's (recordKey), else
// ReasonPayloadConflict. Both keys are in stored form ("" for none). Both
// stores apply this rule (dedup/redisstore in its claim script).
func ConflictReason(by MatchedBy, deliveryKey, recordKey string) string {
	if by == ByMessageID && deliveryKey != recordKey {
		return ReasonMessageIDCollision
	}
	return ReasonPayloadConflict
}

// ConflictError is Result.Err of an OutcomeConflict. errors.Is finds
// ErrFingerprintConflict in every ConflictError, plus ErrMessageIDCollision
// or ErrPayloadConflict by Reason, plus Cause when set.
type ConflictError struct {
	// Reason is ReasonMessageIDCollision or ReasonPayloadConflict, the
	// reason of the dead letter written for the delivery.
	Reason string
	// Identity is the delivery's identity.
	Identity Identity
	// Record is the identity of the record the delivery collided with.
	Record Identity
	// MatchedBy says which key matched the record.
	MatchedBy MatchedBy
	// Cause is set when the payloads could not be compared (the record's
	// fingerprint key is no longer configured: ErrUnknownFingerprintKey);
	// nil when the fingerprints differ.
	Cause error
}

// Error describes the conflict, e.g. "idemq: message ID collision:
// payments/m-1/order-2 matches record payments/m-1/order-1 by message_id
// with a different payload".
func (e *ConflictError) Error() string {
	kind := "payload conflict"
	if e.Reason == ReasonMessageIDCollision {
		kind = "message ID collision"
	}
	s := fmt.Sprintf("idemq: %s: %s matches record %s by %s", kind, e.Identity, e.Record, e.MatchedBy)
	if e.Cause != nil {
		return s + "; the payloads cannot be compared: " + e.Cause.Error()
	}
	return s + " with a different payload"
}

// Unwrap returns the sentinels of the conflict's kind, ErrFingerprintConflict
// and Cause (when set).
func (e *ConflictError) Unwrap() []error {
	errs := []error{ErrPayloadConflict, ErrFingerprintConflict}
	if e.Reason == ReasonMessageIDCollision {
		errs[0] = ErrMessageIDCollision
	}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	return errs
}

// conflictClass is ErrorClass of an error wrapping ErrFingerprintConflict.
func conflictClass(err error) string {
	switch {
	case errors.Is(err, ErrMessageIDCollision):
		return ReasonMessageIDCollision
	case errors.Is(err, ErrPayloadConflict):
		return ReasonPayloadConflict
	}
	return "fingerprint_conflict"
}
