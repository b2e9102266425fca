package dedup

// Status is the state of a consumption record (column status).
type Status string

const (
	// StatusProcessing means a handler execution holds the record (lease mode;
	// atomic modes use it only inside the open transaction, never committed).
	StatusProcessing Status = "PROCESSING"
	// StatusSucceeded means the handler's effects committed; copies are
	// duplicates.
	StatusSucceeded Status = "SUCCEEDED"
	// StatusFailedRetryable means the last execution failed; a redelivery runs
	// the handler again.
	StatusFailedRetryable Status = "FAILED_RETRYABLE"
	// StatusFailedFinal means no more executions will run; a dead-letter row
	// exists. Copies are acknowledged without a handler call until an operator
	// re-drives it.
	StatusFailedFinal Status = "FAILED_FINAL"
)

// Outcome is what happened to one delivery. Its string is the value of the
// "outcome" label of idemq_deliveries_total.
type Outcome string

const (
	// OutcomeProcessed means the handler ran and its effects committed. Ack.
	OutcomeProcessed Outcome = "processed"
	// OutcomeDuplicate means a record with the same message ID or business key
	// (Result.MatchedBy) had already succeeded or finally failed; the handler
	// did not run. Ack.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeConflict means the same identity came with a different payload
	// fingerprint; not applied, dead-lettered with ReasonMessageIDCollision
	// or ReasonPayloadConflict (Result.Reason; Result.Err is a
	// *ConflictError). Ack.
	OutcomeConflict Outcome = "conflict"
	// OutcomeRetry means the handler failed with a retryable error and attempts
	// remain (record FAILED_RETRYABLE). Do not ack: retry (Kafka, in place with
	// backoff) or hand back to the broker (RocketMQ ConsumeRetryLater).
	OutcomeRetry Outcome = "retry"
	// OutcomeDeadLetter means the handler failed permanently or used its last
	// attempt, or the input was bad; record FAILED_FINAL plus a dead-letter row,
	// committed together. Ack.
	OutcomeDeadLetter Outcome = "dead_letter"

	// OutcomeFenced (lease mode only) means this owner's lease was taken over
	// (ErrFenced) and its completion or failure mark was refused. Do not ack:
	// the new owner's outcome decides.
	OutcomeFenced Outcome = "fenced"
)

// Acked reports whether the broker may be acknowledged for this outcome:
// everything but OutcomeRetry and OutcomeFenced.
func (o Outcome) Acked() bool { return o != OutcomeRetry && o != OutcomeFenced }

// Dead-letter reasons (column reason of the dead-letter table).
const (
	// ReasonMessageIDCollision: the delivery matched a record by message ID,
	// its business key differs from the record's and its payload too: two
	// different messages under one ID. Re-drivable with
	// pgstore.Store.RedriveAsNew (see ConflictReason).
	ReasonMessageIDCollision = "message_id_collision"
	// ReasonPayloadConflict: same business key (matched by business key, or
	// by message ID with the same or no business key), different payload.
	// The record stands; pgstore.Store.RedriveAsNew refuses it unless forced.
	ReasonPayloadConflict = "payload_conflict"
	// ReasonFingerprintConflict is the reason idemq v0.1.0 gave both kinds of
	// conflict. Dead letters written by v0.1.0 keep it.
	//
	// Deprecated: no longer written; conflicts are dead-lettered with
	// ReasonMessageIDCollision or ReasonPayloadConflict. It stays to
	// recognize dead letters written before the split, which
	// pgstore.Store.RedriveAsNew treats as payload conflicts (refused unless forced).
	ReasonFingerprintConflict = "fingerprint_conflict"
	// ReasonPermanentError: the handler returned a Permanent error.
	ReasonPermanentError = "permanent_error"
	// ReasonAttemptsExhausted: the handler failed the store's MaxAttempts times.
	ReasonAttemptsExhausted = "attempts_exhausted"
	// ReasonBadInput: the delivery could not be turned into an identity or
	// fingerprint (the business-key extractor or canonicalizer failed).
	ReasonBadInput = "bad_input"
)

// Result reports the outcome of one delivery: what a store's Process,
// ProcessBatch (per message) or ProcessLeased decided.
type Result struct {
	// Outcome is what happened.
	Outcome Outcome
	// MatchedBy says which key matched, for OutcomeDuplicate and
	// OutcomeConflict; empty otherwise.
	MatchedBy MatchedBy
	// Status is the record's status after this delivery (for a conflict: the
	// status of the record it collided with).
	Status Status
	// Attempts is the record's attempts count after this delivery.
	Attempts int
	// HandlerCalled reports whether the handler ran for this delivery.
	HandlerCalled bool
	// Err is the handler's error for OutcomeRetry and OutcomeDeadLetter, or
	// the reason for a conflict (a *ConflictError) or bad input.
	Err error
	// Reason is the dead-letter reason (a Reason* constant) for
	// OutcomeConflict and OutcomeDeadLetter, set whether this delivery wrote
	// a new dead-letter row or found an identical live one; "" otherwise.
	Reason string
	// DeadLetterID is the id of the dead-letter row written by this delivery
	// (0 when none was written, including when an identical one existed).
	DeadLetterID int64
}
