// Package consumer is idemq's runtime: it ties a broker adapter to the dedup
// store and the user's handler.
//
// A Consumer turns each Delivery into a dedup identity (scope from Config,
// message ID from the adapter, business key from Config.BusinessKey), passes
// it through the middleware chain to the store (claim, handler, mark:
// pgstore.Store.Process in atomic mode) and reports the outcome to Metrics,
// the log and the trace. The package imports no store: New detects the
// store's capabilities (TxStore, StartMarker) once. It never acknowledges a delivery whose outcome is not durable,
// nor one whose outcome is unknown (dedup.ErrOutcomeUnknown: the connection
// was lost at COMMIT): that one is retried like a failure (Kafka: in place;
// RocketMQ: ConsumeRetryLater) without counting an attempt, and the next
// copy finds whether it committed.
//
// # Two ways to drive it
//
//   - Pull (Kafka): Run reads a Source. Deliveries of one lane (a Kafka
//     partition) are handled one at a time in offset order; lanes run in
//     parallel. A retryable failure is retried in place with exponential
//     backoff (Kafka has no per-message redelivery); when the attempts are
//     used up the record is FAILED_FINAL with a dead letter and the offset
//     moves on. Completed offsets are committed per lane in batches
//     ([Config.CommitEvery], [Config.CommitInterval]), only as a contiguous
//     completed prefix, never backwards, and flushed on shutdown. A source
//     whose lanes can be taken away (a Kafka rebalance) implements
//     [Revocable]: a revoked lane's waiting deliveries are dropped, its
//     in-place retries stop, and what was completed is committed at once.
//   - Push (RocketMQ): the broker client calls a listener, which binds the
//     Consumer to its broker once with Consumer.Push (PushConfig: the call
//     timeout, deliveries per call, concurrent calls, max redeliveries and
//     the redelivery horizon, each checked against Config), then hands every
//     message of a call to Pusher.Handle and maps its Verdict (Ack,
//     RetryLater) to the broker's answer (ConsumeSuccess, ConsumeRetryLater).
//     Each copy gets one attempt, and a retry is the broker's redelivery;
//     the broker's last copy (Message.ReconsumeTimes >= MaxRedeliveries) is
//     retried in place instead, so it never leaves the store's view before
//     its outcome is durable. Copies of one message ID run one at a time in
//     the process.
//
// Both modes run every delivery through the same code: identity, then the
// middleware chain, then the core. Consumer.Handle and HandleInPlace are the
// same path for callers that drive the Consumer themselves.
//
// # Middleware
//
// A Middleware is a plain function, func(next ProcessFunc) ProcessFunc, in
// the style of Watermill's router. The chain, outermost first:
//
//  1. tracing: one span per delivery attempt ("process <topic>", with the
//     OpenTelemetry messaging attributes), child of the message's trace
//     context headers (Config.TracerProvider); what
//     runs below, the handler included, gets its ctx;
//  2. recover: a panic below (a user middleware, a Metrics implementation,
//     the store) becomes an error wrapping *dedup.PanicError, logged with
//     its stack; the delivery is not acknowledged and not counted. A panic in
//     the handler itself never gets here: the store records it as a failed
//     attempt (*dedup.PanicError);
//  3. logging: one line per recorded outcome, or a warning when the outcome
//     was not recorded, with the delivery's ctx (Config.Logger);
//  4. metrics: Config.Metrics, its DurationObserver and ReasonObserver,
//     for recorded outcomes only, before the acknowledgement;
//  5. Config.Middleware, the first element outermost: it sees the delivery
//     with its identity, and the result on the way back;
//  6. timeout: Config.MaxHandlerDuration (default 0: none) becomes the
//     deadline of each handler execution, not of the claim or the mark; a
//     handler that fails after it is a failed attempt of class "timeout".
//     A push listener's broker timers are checked in Push (MaxHandlerDuration
//     × DeliveriesPerCall and the lease TTL under CallTimeout);
//  7. the core: dedup claim, handler, mark (or, for bad input, Reject), with
//     the crash-loop guard of the lane.
//
// The chain is built once in New. Batched atomic mode (BatchSize > 1) runs a
// batch in one transaction, outside the per-delivery chain: its span is
// "process <topic>" linked to each message's trace context, metrics and logs are reported per delivery, the
// timeout applies to each handler execution, and Config.Middleware is
// refused with it.
//
// # Modes
//
// Config.Handler runs in atomic mode, one transaction per delivery; with
// Config.BatchSize > 1 a pull lane runs up to BatchSize deliveries per
// transaction (pgstore.Store.ProcessBatch), commits the acked prefix and
// retries the rest ahead of newer deliveries; Config.BatchHandler runs such
// batches with one set-based handler call each
// (pgstore.Store.ProcessBatchSet). Config.LeaseHandler runs in
// lease mode (pgstore.Store.ProcessLeased) for side effects outside the
// database; a fenced owner's delivery is not acked.
//
// Config.Store is the Store interface: *pgstore.Store (Postgres) runs every
// mode; redisstore.Store keeps records in Redis alone and runs
// Config.LeaseHandler only (atomic modes need a TxStore: a Postgres
// transaction to join).
//
// # Crash loops
//
// A handler that kills the process leaves no trace in atomic and batched
// modes, so without help its message would be redelivered to every restart.
// Config.CrashLoop bounds it to pgstore.Config.MaxAttempts starts (the design
// and its measured cost are in the dedup package documentation, "Crash
// loops"); it is on by default with a *pgstore.Store (any StartMarker) and
// costs a first delivery one watermark upsert per Window+1 offsets of its
// lane. The runtime's part:
//
//   - Before a lane runs a handler at an offset its stored watermark does not
//     cover, it raises the watermark to that offset plus CrashLoop.Window.
//   - A lane session (a pull lane in Run from its first delivery, after the
//     broker hands the lane back from an older offset, or, with a Revocable
//     source, after the lane was revoked and assigned again; a push lane for
//     the Consumer's life) starts by learning the watermark W earlier
//     processes left. Its deliveries at or below W may replay a crash: one
//     read (pgstore.Store.CheckReplay) answers those already final, as
//     duplicates; the first InFlight ones that are not (BatchSize in Run,
//     CrashLoop.InFlight in Handle) each run after a start marker
//     (pgstore.Store.MarkStart), one at a time across the Consumer, and in
//     batched mode alone before the batch. A Pusher's lanes use
//     PushConfig.ConcurrentCalls × DeliveriesPerCall when CrashLoop.InFlight
//     is not set. A marker that finds the attempts
//     used up by runs that died returns a dead letter without running the
//     handler (OutcomeDeadLetter, acked), and the lane moves on.
//   - A watermark found above what the session wrote means that another
//     process ran the lane meanwhile: the deliveries below it are suspects
//     again.
//   - A revoked lane's deliveries are dropped before any watermark, check or
//     marker work (Revocable), also those waiting behind a marked run in
//     batched mode.
//
// Deliveries without a Lane (Handle called directly without one) are not
// guarded. Lease mode needs none of this: its claim counts every start, and
// a takeover at the last attempt dead-letters.
//
// # Shutdown
//
// When Run's context ends, fetching stops, in-flight handlers get up to
// Config.ShutdownGrace to finish (their context is canceled after it, which
// rolls their transaction back and leaves the message for redelivery), pending
// commits are flushed, and the source is closed.
package consumer
