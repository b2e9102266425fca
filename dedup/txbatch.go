package dedup

import "context"

// TxBatchHandler is a set-based atomic-mode handler: it runs once per
// batch, inside the store's transaction of type Tx (pgx.Tx for
// dedup/pgstore), with the batch's messages that must run — the new ones,
// and records being retried — in batch order; duplicates and conflicts are
// answered by the store and never passed. msgs is never empty, each
// message's Attempt is set, and the slice must not be kept after the call.
// Its writes (business rows, outbox rows; COPY or one multi-row statement
// for all of msgs is the point) commit together with the consumption
// records, or not at all.
//
// It returns nil when every message is done. Any error (a Permanent one, a
// panic recovered as a *PanicError, or the transaction left unusable) says
// only that the batch failed, not which message: the store then rolls the
// batch back and runs its messages again one per transaction, calling the
// handler with one-message slices, so that the message at fault is marked
// (FAILED_RETRYABLE, or FAILED_FINAL with a dead letter) like a TxHandler's
// failure and the others commit; a message of a failing call is thus run
// twice for one counted attempt, except when the call had that message
// only (it is then marked with the error at once). Serialization failures
// and deadlocks retry the whole batch first. pgstore.BatchHandler and
// consumer.Config.BatchHandler are this type for pgx.Tx.
type TxBatchHandler[Tx any] func(ctx context.Context, tx Tx, msgs []*Message) error
