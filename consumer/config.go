package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// BusinessKeyFunc extracts the business key (one business intent, stable
// across producer re-sends) from a message, e.g. a payment ID from the
// payload. msg.Identity already holds the scope and message ID (its
// BusinessKey is empty); the result is normalized with dedup.NormalizeKey. Return "" for "no business key". An error makes the delivery bad
// input: it is dead-lettered with reason dedup.ReasonBadInput and acked.
type BusinessKeyFunc func(msg *dedup.Message) (string, error)

// Store is the consumption-record store a Consumer drives. *pgstore.Store
// (Postgres) implements it and TxStore; redisstore.Store (Redis only) implements
// Store alone, for lease-mode handlers.
type Store interface {
	// ProcessLeased runs h for msg in lease mode (pgstore.Store.ProcessLeased).
	ProcessLeased(ctx context.Context, msg *dedup.Message, h dedup.LeaseHandler, opt dedup.LeaseOptions) (dedup.Result, error)
	// Reject records msg as bad input: FAILED_FINAL plus a dead letter with
	// reason, never running a handler (pgstore.Store.Reject).
	Reject(ctx context.Context, msg *dedup.Message, reason string, cause error) (dedup.Result, error)
	// ValidateRetention refuses a record retention shorter than the broker's
	// redelivery horizon (an error wrapping dedup.ErrRetentionTooShort).
	ValidateRetention(horizon time.Duration) error
	// MaxAttempts is how many handler executions a record gets.
	MaxAttempts() int
	// SucceededRetention is how long a SUCCEEDED record is kept.
	SucceededRetention() time.Duration
}

// TxStore is a Store that also runs handlers inside its Postgres
// transaction: atomic mode (Process) and batched atomic mode (ProcessBatch).
// *pgstore.Store implements it. New detects it once (a type assertion on
// Config.Store); Config.Handler requires it.
type TxStore = dedup.TxStore[pgx.Tx]

func isTxStore(s Store) bool {
	_, ok := s.(TxStore)
	return ok
}

// Config configures a Consumer. Fields marked required must be set; every
// other zero value means the default given in the field's comment.
type Config struct {
	// Scope is who consumes: usually the consumer group name. Required; 1 to
	// 255 bytes of UTF-8.
	Scope string
	// Store holds consumption records and dead letters. Required. A
	// *pgstore.Store (Postgres) runs every mode; a store that only implements
	// Store, not TxStore (redisstore.Store: Redis only, weaker), runs
	// LeaseHandler only.
	Store Store
	// Handler is the business logic, run inside the record's transaction
	// (atomic mode). Exactly one of Handler, LeaseHandler and BatchHandler
	// is required.
	Handler dedup.TxHandler[pgx.Tx]
	// BatchHandler is set-based business logic for batched atomic mode: called
	// once per batch transaction with the batch's messages to run (never its
	// duplicates), in order, so that it can write them with one statement
	// (pgstore.Store.ProcessBatchSet; it is pgstore.BatchHandler). A failing
	// call makes the batch rerun one message per transaction, calling it with
	// one-message slices, to find the message at fault; a delivery run alone
	// (a crash-loop replay, Handle) gets a one-message slice too.
	// MaxHandlerDuration bounds each call. Exactly one of Handler,
	// LeaseHandler and BatchHandler is required; BatchHandler needs
	// BatchSize > 1 (pull mode, Run) and a Store with ProcessBatchSet
	// (*pgstore.Store). Default nil.
	BatchHandler dedup.TxBatchHandler[pgx.Tx]
	// LeaseHandler is business logic with side effects outside the database,
	// run in lease mode (owner token, fence, heartbeat; see dedup.Lease).
	LeaseHandler dedup.LeaseHandler
	// Lease configures lease mode (TTL default 30s, heartbeat TTL/3). Used
	// only with LeaseHandler.
	Lease dedup.LeaseOptions
	// BusinessKey extracts the business key. Default nil: no business key,
	// dedup by message ID only. idemq never uses the broker record key as a
	// business key by default (it is a partitioning key).
	BusinessKey BusinessKeyFunc
	// RetryInitial is the first in-place retry delay (pull mode). Default
	// 100ms.
	RetryInitial time.Duration
	// RetryMax caps the in-place retry delay. Default 5s; at least
	// RetryInitial.
	RetryMax time.Duration
	// CommitEvery flushes offset commits after this many completed
	// deliveries. Default 100.
	CommitEvery int
	// CommitInterval flushes offset commits at least this often. Default 1s.
	// A crash replays at most this much (plus CommitEvery) work, which dedup
	// absorbs.
	CommitInterval time.Duration
	// BatchSize is how many deliveries of one lane run in one transaction
	// (batched atomic mode, pgstore.Store.ProcessBatch) in pull mode. Default
	// 1: one transaction per delivery. Not used with LeaseHandler.
	BatchSize int
	// BatchWait is how long a lane waits to fill a batch once it has one
	// delivery. Default 50ms. Only with BatchSize > 1.
	BatchWait time.Duration
	// LaneBuffer is how many fetched deliveries may wait per lane before the
	// fetcher blocks (backpressure). Default 64.
	LaneBuffer int
	// ShutdownGrace is how long in-flight handlers may run after Run's
	// context ends. Default 10s.
	ShutdownGrace time.Duration
	// SkipSchemaCheck turns off the schema check that Run (and, for a push
	// listener, the adapter's Start through Consumer.CheckSchema) does by
	// default: before it fetches anything, Run calls the store's read-only
	// CheckSchema (SchemaChecker; *pgstore.Store has it: one SELECT, no lock,
	// no DDL, so it works for a role without DDL rights) and returns its error
	// (wrapping pgstore.ErrSchemaMissing or pgstore.ErrSchemaOutdated, naming
	// the versions and the command to run) instead of failing every delivery
	// on a schema that is missing or older than the binary. Default false:
	// the check runs. Set it only for tables managed without idemq's version
	// table (a schema tool that does not run our migrations' version
	// bookkeeping). Stores without CheckSchema (redisstore.Store) are never
	// checked.
	SkipSchemaCheck bool
	// CrashLoop bounds a message whose handler kills the process (atomic
	// and batched modes): lane watermarks and start markers, on by default
	// (Window 1000). See CrashLoopConfig and the package doc, "Crash loops".
	CrashLoop CrashLoopConfig
	// Metrics receives one call per delivery outcome. Default: none.
	Metrics Metrics
	// TracerProvider makes one OpenTelemetry span per delivery ("process
	// <topic>", kind consumer), child of the trace context found in
	// the message's W3C "traceparent" header, covering claim, handler and
	// mark; the handler's ctx carries it. The span follows the messaging
	// semantic conventions (semconv v1.43.0): messaging.system (kafka or
	// rocketmq, from Message.Source), messaging.operation.type and .name
	// "process", messaging.destination.name, .partition.id,
	// messaging.kafka.offset (Kafka) or messaging.rocketmq.message.keys,
	// messaging.consumer.group.name (Scope), messaging.message.id, plus
	// idemq.source, idemq.outcome, idemq.matched_by, idemq.attempts and
	// idemq.business_key when there is one. The tracer's instrumentation
	// scope is "github.com/idemq/idemq/consumer" with the module version. Default: the global provider
	// (otel.GetTracerProvider(), a no-op unless the application sets one).
	// While the provider cannot record (noop.TracerProvider, or the global
	// one before otel.SetTracerProvider) no span is built, which saves 5 to
	// 8 allocations per delivery; the handler's ctx then carries the
	// header's trace context alone, so the outbox still propagates it.
	// idemq creates no exporter and never flushes, but ends each span on the
	// delivery's goroutine before the ack: give it a provider whose
	// span processor batches (sdktrace.WithBatcher, which queues and drops
	// spans when its queue is full), never sdktrace.WithSyncer or
	// WithBlocking in production: they export inside span.End(), so a slow
	// or unreachable collector would hold every delivery.
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context and baggage of a delivery from
	// its headers into the handler's ctx (and the span's parent). Default
	// nil: the global propagator (otel.GetTextMapPropagator()) once the
	// application has set one, W3C Trace Context plus W3C Baggage until
	// then (OpenTelemetry's global propagator is a no-op until set).
	Propagator propagation.TextMapPropagator
	// Logger receives a warning per retry, conflict or dead letter and a
	// debug line per processed or duplicate delivery. Default slog.Default().
	Logger *slog.Logger
	// MaxHandlerDuration bounds one handler execution, in both drive modes
	// and every broker: the handler's ctx gets this deadline (the claim and
	// the mark do not), and a handler that returns an error after it passed
	// is a failed attempt of class "timeout" (errors.Is
	// context.DeadlineExceeded), retried and dead-lettered like any other
	// retryable failure. A handler that ignores its ctx is not stopped.
	// A handler cut off inside a Postgres statement is counted too: with
	// pgx's default context handling the deadline closes the connection,
	// and dedup/pgstore then marks the failed attempt in a new transaction;
	// a pool built with pgconn.CancelRequestContextWatcherHandler
	// (pgconn.Config.BuildContextWatcherHandler) cancels the statement
	// instead and keeps the connection (error class pg:57014).
	// Default 0: no bound. It must not be negative. A push adapter checks it
	// against its broker's timers (PushConfig.CallTimeout: MaxHandlerDuration
	// × DeliveriesPerCall must be below it). Applied by the timeout
	// middleware (see Middleware).
	MaxHandlerDuration time.Duration
	// Middleware wraps the processing of every delivery, in both drive
	// modes, between the built-in metrics middleware (outside) and the
	// timeout middleware (inside); the first element is the outermost. See
	// the package documentation, "Middleware". Default none. Not applied to
	// the batch transactions of batched atomic mode (BatchSize > 1): New
	// refuses both together.
	Middleware []Middleware
	// AcceptUnboundedRedelivery states that the operator accepts the risk of
	// a broker that may redeliver a message after its record has expired
	// (a Kafka topic with retention.ms = -1: a group whose offsets are reset
	// replays messages of any age, and one older than SucceededRetention is
	// processed again). Default false: Run refuses to start (an error
	// wrapping ErrInvalidConfig and ErrUnboundedRedelivery that names this
	// field) when the source reports an unbounded horizon
	// (HorizonReporter returning 0). Set it true to start anyway, with a
	// warning logged.
	AcceptUnboundedRedelivery bool
	// Maintenance, when set, runs beside Run (pull mode) for as long as Run
	// does: Run calls it in a goroutine with a context that ends when Run
	// shuts down, and waits for it to return before Run returns. It is
	// meant for the store's retention loop, e.g.
	// func(ctx context.Context) error { return st.RunMaintenance(ctx, pgstore.MaintenanceConfig{}) }
	// (pgstore.Store.RunMaintenance: every instance runs it, one leads).
	// An error it returns before Run's context ends is logged (error
	// level); Run goes on. Default nil: opt-in, nothing runs. Not used by
	// Push.
	Maintenance func(ctx context.Context) error
}

// ErrUnboundedRedelivery is wrapped by Run's error when the source's
// redelivery horizon is unbounded and Config.AcceptUnboundedRedelivery is
// false.
var ErrUnboundedRedelivery = errors.New("idemq/consumer: broker redelivery horizon is unbounded")

// ErrInvalidConfig is wrapped by every Config error.
var ErrInvalidConfig = errors.New("idemq/consumer: invalid config")

func (c Config) withDefaults() Config {
	if c.RetryInitial == 0 {
		c.RetryInitial = 100 * time.Millisecond
	}
	if c.RetryMax == 0 {
		c.RetryMax = 5 * time.Second
	}
	if c.CommitEvery == 0 {
		c.CommitEvery = 100
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = time.Second
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1
	}
	if c.BatchWait == 0 {
		c.BatchWait = 50 * time.Millisecond
	}
	if c.LaneBuffer == 0 {
		c.LaneBuffer = 64
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	c.CrashLoop = c.CrashLoop.withDefaults()
	if c.Metrics == nil {
		c.Metrics = nopMetrics{}
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// isNilPointer reports whether v holds a nil pointer: an interface that is
// not nil but whose value is, as a failed constructor's result gives.
func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

func (c Config) validate() error {
	if err := dedup.ValidateScope(c.Scope); err != nil {
		return fmt.Errorf("%w: Scope: %v", ErrInvalidConfig, err)
	}
	switch {
	case c.Store == nil:
		return fmt.Errorf("%w: Store is required", ErrInvalidConfig)
	case isNilPointer(c.Store):
		return fmt.Errorf("%w: Store is a nil %T (did the store's constructor fail? check its error)", ErrInvalidConfig, c.Store)
	case countSet(c.Handler != nil, c.LeaseHandler != nil, c.BatchHandler != nil) != 1:
		return fmt.Errorf("%w: exactly one of Handler, LeaseHandler and BatchHandler is required", ErrInvalidConfig)
	case c.Handler != nil && !isTxStore(c.Store):
		return fmt.Errorf("%w: Store %T has no Postgres transaction for Handler (atomic mode); use LeaseHandler or a *pgstore.Store", ErrInvalidConfig, c.Store)
	case c.RetryInitial < 0 || c.RetryMax < c.RetryInitial:
		return fmt.Errorf("%w: RetryInitial %s and RetryMax %s must satisfy 0 <= RetryInitial <= RetryMax", ErrInvalidConfig, c.RetryInitial, c.RetryMax)
	case c.CommitEvery < 1:
		return fmt.Errorf("%w: CommitEvery %d must be at least 1", ErrInvalidConfig, c.CommitEvery)
	case c.CommitInterval < time.Millisecond:
		return fmt.Errorf("%w: CommitInterval %s must be at least 1ms", ErrInvalidConfig, c.CommitInterval)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return fmt.Errorf("%w: BatchSize %d must be 1 to 10000", ErrInvalidConfig, c.BatchSize)
	case c.BatchSize > 1 && c.LeaseHandler != nil:
		return fmt.Errorf("%w: BatchSize %d cannot be used with LeaseHandler (lease mode is per message)", ErrInvalidConfig, c.BatchSize)
	case c.BatchWait < 0:
		return fmt.Errorf("%w: BatchWait %s must not be negative", ErrInvalidConfig, c.BatchWait)
	case c.LaneBuffer < 1:
		return fmt.Errorf("%w: LaneBuffer %d must be at least 1", ErrInvalidConfig, c.LaneBuffer)
	case c.LeaseHandler != nil && c.Lease.ValidateUnder(0) != nil:
		return fmt.Errorf("%w: Lease: %v", ErrInvalidConfig, c.Lease.ValidateUnder(0))
	case c.MaxHandlerDuration < 0:
		return fmt.Errorf("%w: MaxHandlerDuration %s must not be negative", ErrInvalidConfig, c.MaxHandlerDuration)
	case len(c.Middleware) > 0 && c.BatchSize > 1:
		return fmt.Errorf("%w: Middleware cannot be used with BatchSize %d (a batch runs in one transaction, not one delivery at a time)", ErrInvalidConfig, c.BatchSize)
	case c.ShutdownGrace < 0:
		return fmt.Errorf("%w: ShutdownGrace %s must not be negative", ErrInvalidConfig, c.ShutdownGrace)
	}
	for i, m := range c.Middleware {
		if m == nil {
			return fmt.Errorf("%w: Middleware[%d] is nil", ErrInvalidConfig, i)
		}
	}
	if err := c.validateBatchHandler(); err != nil {
		return err
	}
	return c.CrashLoop.validate()
}
