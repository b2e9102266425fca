package dedup

import (
	"context"
	"time"
)

// TxHandler is an atomic-mode handler: it runs inside the store's
// transaction, of type Tx (pgx.Tx for dedup/pgstore), and its writes commit
// together with the consumption record or not at all. It returns nil when
// the message is done; a Permanent error when retrying cannot help (FAILED_FINAL
// and a dead letter at once); any other error for a retry (FAILED_RETRYABLE,
// or FAILED_FINAL with a dead letter once the store's MaxAttempts is
// reached). A panic is recovered and recorded as a *PanicError. pgstore.Handler
// and consumer.Handler are this type for pgx.Tx.
type TxHandler[Tx any] func(ctx context.Context, tx Tx, msg *Message) error

// Store is what the runtime (package consumer) needs from every
// consumption-record store: lease mode, bad-input rejection and the numbers
// it validates its config against. dedup/pgstore (Postgres) and
// dedup/redisstore (Redis only) implement it; dedup/storetest is the
// conformance suite a store must pass.
//
// Stable: new methods are added only in a minor release that says so, and
// only to optional interfaces (such as TxStore) that the runtime detects.
type Store interface {
	// ProcessLeased runs h for msg in lease mode (see Lease): a claim with
	// an owner token and fence, heartbeats while h runs, and a completion
	// or failure mark conditional on both. The Result says what to do with
	// the delivery (Outcome.Acked); a non-nil error means the outcome is not
	// known to be durable: do not ack.
	ProcessLeased(ctx context.Context, msg *Message, h LeaseHandler, opt LeaseOptions) (Result, error)
	// Reject records msg as bad input without running a handler:
	// FAILED_FINAL plus a dead letter with reason (e.g. ReasonBadInput) and
	// cause. A duplicate of a decided record answers that record's outcome.
	Reject(ctx context.Context, msg *Message, reason string, cause error) (Result, error)
	// ValidateRetention refuses (an error wrapping ErrRetentionTooShort) a
	// record retention shorter than horizon, the broker's redelivery
	// horizon: a copy redelivered after its record was purged would run
	// again.
	ValidateRetention(horizon time.Duration) error
	// MaxAttempts is how many handler executions a record gets (≥ 1).
	MaxAttempts() int
	// SucceededRetention is how long a SUCCEEDED record is kept.
	SucceededRetention() time.Duration
}

// TxStore is a Store that also runs handlers inside its own transaction, of
// type Tx: atomic mode (Process) and batched atomic mode (ProcessBatch).
// *pgstore.Store implements TxStore[pgx.Tx].
type TxStore[Tx any] interface {
	Store
	// Process runs h for msg in one transaction with the consumption
	// record: claim, handler, mark, COMMIT.
	Process(ctx context.Context, msg *Message, h TxHandler[Tx]) (Result, error)
	// ProcessBatch runs h for each of msgs in one transaction, one Result
	// per message in order.
	ProcessBatch(ctx context.Context, msgs []*Message, h TxHandler[Tx]) ([]Result, error)
}
