package pgstore

import (
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// Config configures a Store. The zero value of every field but Fingerprinter
// means "use the default" given in the field's comment.
type Config struct {
	// Schema holds the tables. Default "idemq". Created by Migrate if absent.
	// A lowercase SQL identifier: [a-z_][a-z0-9_]{0,39}.
	Schema string
	// RecordsTable is the consumption record table. Default
	// "consumption_records". Same identifier rule as Schema.
	RecordsTable string
	// DeadLettersTable is the dead-letter table. Default "dead_letters".
	// Same identifier rule as Schema.
	DeadLettersTable string
	// Fingerprinter fingerprints payloads. Required.
	Fingerprinter *dedup.Fingerprinter
	// MaxAttempts is how many handler executions a record may start before a
	// retryable failure becomes FAILED_FINAL. Default 5; must be 1 to 1000.
	MaxAttempts int
	// TransactionPooler says the pool reaches Postgres through a connection
	// pooler in transaction mode (PgBouncer pool_mode = transaction, RDS
	// Proxy, Supavisor), which keeps a client on one server session only
	// for a transaction. idemq cannot detect one (it answers as Postgres
	// does), so set it yourself. Default false. When set, New refuses a
	// pool whose DefaultQueryExecMode is QueryExecModeCacheStatement (the
	// pgx default) or QueryExecModeDescribeExec: use QueryExecModeExec or
	// QueryExecModeSimpleProtocol. Migrate and RunMaintenance, which hold
	// session advisory locks, then return an error wrapping
	// ErrNeedsSession: run them on a Store built on a direct pool (same
	// Config, TransactionPooler false). Everything else works through it.
	TransactionPooler bool
	// MaxErrorBytes bounds last_error and dead-letter error text, in bytes.
	// Default 2048; at least 64.
	MaxErrorBytes int
	// StatementTimeout bounds each of idemq's own steps on Postgres (the
	// claim with its BEGIN, a mark, the COMMIT, a rollback, a failure mark
	// in its own transaction, a lease's take, heartbeat and final mark), on
	// the caller's context when it has none sooner, and on a context
	// detached from it for the writes that must land during a shutdown. A
	// connection that stops answering (a black hole, a frozen server) is
	// detected within it: pgx closes the connection and the step fails
	// (outcome unknown, redelivered). The handler's own statements are not
	// bounded by it (see consumer.Config.MaxHandlerDuration). Default 30s;
	// 100ms to 1h.
	StatementTimeout time.Duration
	// SucceededRetention is how long a SUCCEEDED record is kept (expires_at =
	// database now() + this). Default 7 days. It must be at least the broker's
	// redelivery horizon; see ValidateRetention.
	SucceededRetention time.Duration
	// FailedFinalRetention is how long a FAILED_FINAL record is kept.
	// Default 30 days; at least SucceededRetention.
	FailedFinalRetention time.Duration
	// Logger receives debug lines for claims and marks. Default slog.Default().
	Logger *slog.Logger
	// FastPath, when set, answers duplicates of SUCCEEDED records without
	// Postgres (e.g. redisfast.New). Default nil: Postgres only. A FastPath
	// with a TTL() method must not remember longer than SucceededRetention.
	FastPath dedup.FastPath
	// TxOptions are the options of every transaction that runs a handler
	// (Process, ProcessBatch, and the per-message reruns of a refused
	// batch). Default: read committed, read write. IsoLevel may be
	// pgx.ReadCommitted, pgx.RepeatableRead or pgx.Serializable; under the
	// last two, serialization failures (40001) are retried as
	// TransientRetry says. AccessMode may only be pgx.ReadWrite (the claim
	// writes), DeferrableMode only pgx.NotDeferrable, and BeginQuery and
	// CommitQuery must be empty; anything else is refused by New. One
	// Store serves one isolation level: give consumers that need another
	// their own Store on the same pool and tables.
	TxOptions pgx.TxOptions
	// TransientRetry is the in-place retry of a transaction that failed
	// with a serialization failure (SQLSTATE 40001), a deadlock (40P01) or
	// a stale statement cache (0A000 "cached plan must not change result
	// type" after a schema change, 26000; see dedup.FailureTransient),
	// wherever it was raised (a handler statement, the claim, a mark, the
	// COMMIT; in lease mode the claim and the completion, failure and
	// release marks). The whole
	// transaction is retried at once, with jittered exponential backoff;
	// the retries count no attempt and mark nothing. When they are used up
	// the failure is the handler's (counted, marked); a batch is then rerun
	// one message per transaction. Default: 3 retries, 10ms doubling to at
	// most 100ms, ±50% jitter (see RetryPolicy).
	TransientRetry RetryPolicy
	// OutcomeUnknownRetry is the in-place retry of a lease-mode call on
	// Postgres (the claim; the completion, failure or release mark) whose
	// outcome is unknown (the connection was lost or terminated before its
	// answer came, see Classify): the call is repeated on a new connection
	// with the same owner token and fence, and recognises its own earlier
	// run (a claim finds its committed claim by owner token and runs under
	// it; a mark finds the record already in its status under its token and
	// fence, and a final failure the dead letter it wrote). When the retries
	// are used up ProcessLeased returns an error wrapping ErrOutcomeUnknown
	// (not acked), and a claim or lease that committed unseen expires after
	// its TTL. Atomic and batched modes do not retry an unknown COMMIT in the
	// store (the handler's transaction is gone): they return
	// ErrOutcomeUnknown and the runtime redelivers. Default: 3 retries,
	// 100ms doubling to at most 1s, ±50% jitter.
	OutcomeUnknownRetry RetryPolicy
}

var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = "idemq"
	}
	if c.RecordsTable == "" {
		c.RecordsTable = "consumption_records"
	}
	if c.DeadLettersTable == "" {
		c.DeadLettersTable = "dead_letters"
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.MaxErrorBytes == 0 {
		c.MaxErrorBytes = 2048
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = DefaultStatementTimeout
	}
	if c.SucceededRetention == 0 {
		c.SucceededRetention = 7 * 24 * time.Hour
	}
	if c.FailedFinalRetention == 0 {
		c.FailedFinalRetention = 30 * 24 * time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TxOptions.IsoLevel == "" {
		c.TxOptions.IsoLevel = pgx.ReadCommitted
	}
	c.TransientRetry = c.TransientRetry.withDefaults(defaultTransientRetry)
	c.OutcomeUnknownRetry = c.OutcomeUnknownRetry.withDefaults(defaultOutcomeUnknownRetry)
	return c
}

func (c Config) validate() error {
	for name, v := range map[string]string{"Schema": c.Schema, "RecordsTable": c.RecordsTable, "DeadLettersTable": c.DeadLettersTable} {
		if !identRe.MatchString(v) {
			return fmt.Errorf("%w: %s %q must match %s", dedup.ErrInvalidConfig, name, v, identRe)
		}
	}
	switch {
	case c.RecordsTable == c.DeadLettersTable:
		return fmt.Errorf("%w: RecordsTable and DeadLettersTable are both %q", dedup.ErrInvalidConfig, c.RecordsTable)
	case c.Fingerprinter == nil:
		return fmt.Errorf("%w: Fingerprinter is required (see NewFingerprinter)", dedup.ErrInvalidConfig)
	case c.MaxAttempts < 1 || c.MaxAttempts > 1000:
		return fmt.Errorf("%w: MaxAttempts %d must be 1 to 1000", dedup.ErrInvalidConfig, c.MaxAttempts)
	case c.MaxErrorBytes < 64:
		return fmt.Errorf("%w: MaxErrorBytes %d must be at least 64", dedup.ErrInvalidConfig, c.MaxErrorBytes)
	case c.StatementTimeout < 100*time.Millisecond || c.StatementTimeout > time.Hour:
		return fmt.Errorf("%w: StatementTimeout %s must be 100ms to 1h", dedup.ErrInvalidConfig, c.StatementTimeout)
	case c.SucceededRetention < time.Minute:
		return fmt.Errorf("%w: SucceededRetention %s must be at least 1m", dedup.ErrInvalidConfig, c.SucceededRetention)
	case c.FailedFinalRetention < c.SucceededRetention:
		return fmt.Errorf("%w: FailedFinalRetention %s is shorter than SucceededRetention %s", dedup.ErrInvalidConfig, c.FailedFinalRetention, c.SucceededRetention)
	}
	if err := validateTxOptions(c.TxOptions); err != nil {
		return err
	}
	if err := c.TransientRetry.validate("TransientRetry"); err != nil {
		return err
	}
	if err := c.OutcomeUnknownRetry.validate("OutcomeUnknownRetry"); err != nil {
		return err
	}
	if t, ok := c.FastPath.(interface{ TTL() time.Duration }); ok && t.TTL() > c.SucceededRetention {
		return fmt.Errorf("%w: FastPath TTL %s is longer than SucceededRetention %s: a purged record would still be answered from the fast path", dedup.ErrInvalidConfig, t.TTL(), c.SucceededRetention)
	}
	return nil
}

// ValidateRetention refuses a SucceededRetention shorter than the broker's
// redelivery horizon: a record purged before the broker stops
// redelivering would let a late copy run again. Kafka's horizon is the topic's
// retention.ms; RocketMQ's is the sum of the delay levels up to the max
// reconsume times. The error names both numbers.
func (s *Store) ValidateRetention(horizon time.Duration) error {
	if s.cfg.SucceededRetention < horizon {
		return fmt.Errorf("%w: SucceededRetention %s < broker redelivery horizon %s", dedup.ErrRetentionTooShort, s.cfg.SucceededRetention, horizon)
	}
	return nil
}
