// Package pgstore is the Postgres consumption-record store: it decides,
// inside the handler's own Postgres transaction (pgx/v5), whether a delivery
// is new, a duplicate or a conflict, and it records every outcome in a
// consumption record. It implements pgstore.Store (lease mode) and
// dedup.TxStore[pgx.Tx] (atomic and batched modes), and passes the
// conformance suite in dedup/storetest. The identity, fingerprint, outcome and
// error types it uses are package dedup's.
//
// # Identity
//
// A delivery is identified by three parts (see [dedup.Identity]): the scope (the
// consumer group, optionally a tenant), the message ID (stable across broker
// redelivery: a `message-id` header or property, else the broker position) and
// the business key (stable across producer re-sends, produced by an extractor
// the user supplies; empty by default). Dedup holds on both: a delivery whose
// message ID or non-empty business key already has a record in the same scope
// is a duplicate. Keys longer than [dedup.MaxKeyBytes] bytes, or not valid UTF-8, or
// holding NUL, are stored as "sha256:<hex>" of their raw bytes ([dedup.NormalizeKey]).
// A key of only white space is no key ([dedup.IsBlank]): a blank message ID falls
// back to the broker position, a blank business key is none.
//
// # Fingerprint and conflicts
//
// Every record stores an HMAC-SHA256 fingerprint of the payload, keyed by a
// secret with a key ID so that secrets rotate ([dedup.Fingerprinter]). A delivery
// with a known identity and a different fingerprint is a conflict: it is never
// applied and never silently skipped; it goes to the dead-letter table and is
// then acknowledged. Its reason says which kind ([dedup.ConflictReason]):
// [dedup.ReasonMessageIDCollision] when it matched the record by message ID and its
// business key differs (two messages under one ID; [Store.RedriveAsNew]
// processes it under a derived ID and keeps both records), else
// [dedup.ReasonPayloadConflict] (one intent, two payloads; the record stands).
//
// # Atomic mode
//
// [Store.Process] runs one delivery in one transaction:
//
//  1. claim: one statement reads the record holding either key and, when
//     there is none, inserts it with INSERT … ON CONFLICT DO NOTHING
//     RETURNING (caught by the two unique indexes, so a concurrent claim is
//     never missed). A terminal record (SUCCEEDED, FAILED_FINAL) is answered
//     from that read: a duplicate takes no row lock and its transaction
//     writes nothing (no WAL flush at COMMIT). A PROCESSING or
//     FAILED_RETRYABLE record is locked with SELECT … FOR UPDATE in the same
//     round trip, so two copies that may run the handler serialize on the
//     row. Lease mode and failure marks claim the same way; batched mode
//     claims a whole batch at once (below);
//  2. the handler runs with the same pgx.Tx and writes its business rows
//     (and outbox rows) there;
//  3. the record is marked SUCCEEDED and everything commits together.
//
// Round trips: the transaction's BEGIN is queued in front of the claim, in
// the same round trip (pgx's Batch.BeginTx, on a connection acquired from
// the pool for the transaction), and a reclaimed record's SUCCEEDED mark
// travels with the COMMIT (a mark that finds nothing to mark fails, so the
// server skips the COMMIT behind it). A new message costs 2 round trips plus
// the handler's own, a duplicate 2 (a read, then a COMMIT that writes
// nothing), a retry of a FAILED_RETRYABLE record 3 plus the handler's, a
// handler failure 2 plus the handler's (the rollback to the handler's
// savepoint, the mark and a final failure's dead letter travel with the
// COMMIT). The handler sees an ordinary pgx.Tx. Lease-mode claims and failure marks,
// failure marks after a rollback and start markers send their BEGIN the
// same way. A connection lost during the BEGIN and claim is an unknown
// outcome like any loss before COMMIT (nothing can have committed; nothing
// is counted), and the connection goes back to the pool on every path.
//
// When the handler fails, the transaction rolls back (its writes vanish) and a
// second short transaction marks the record FAILED_RETRYABLE, or FAILED_FINAL
// when the error is [dedup.Permanent] or the attempts reach Config.MaxAttempts; a
// FAILED_FINAL mark writes a dead-letter row in the same transaction. Records
// are never deleted while live; failures are marked, so redelivery is safe.
//
// [Store.ProcessBatch] runs up to N deliveries in one transaction, claimed
// in one round trip: one statement reads every record the batch matches and
// inserts the new ones at once, SUCCEEDED with their expiry (the COMMIT
// decides; a record is written once), and a second, pipelined with it,
// locks the matched PROCESSING and FAILED_RETRYABLE records in id order.
// Duplicates of terminal records are answered from the read. Each new
// message's handler runs after a savepoint, released and set again for the
// next one in the round trip of that handler's first statement (no round
// trip of its own; sent alone before a COPY or a nested Begin), so that they
// never nest; a failing handler rolls back to it and is marked in the same
// transaction (a handler that sent nothing has nothing to roll back).
// [Store.ProcessBatchSet] claims the same way and calls one [BatchHandler]
// once with the new messages (no savepoints), so that it can write them with
// one statement; if it fails, the batch is rerun one message per
// transaction.
// With a Config.FastPath, the whole batch is looked up first, before any
// transaction (one call when it is a [dedup.BatchFastPath], as
// redisfast's is): the hits are answered as duplicates, only the misses are
// claimed, and a batch of hits only opens no transaction. When the batch cannot commit because of one of them
// (a refused COMMIT, or serialization failures that outlive their retries),
// it is rerun one message per transaction with Process's semantics, so that
// the culprit alone is marked and dead-lettered after its attempts; a batch
// is never retried whole without end.
//
// # Failure classes
//
// What a failure means decides what happens, whatever step raised it
// ([dedup.Classify], [dedup.FailureClass]): a handler failure (its error or panic, a
// COMMIT the server refused) is counted and marked; a [dedup.Permanent] error is
// dead-lettered at once; a serialization failure or deadlock (40001, 40P01),
// or a statement cache made stale by a schema change (0A000 "cached plan
// must not change result type", 26000), retries the whole transaction at once without counting
// (Config.TransientRetry), and becomes a handler failure only when those
// retries are used up; a connection lost or terminated at COMMIT (SQLSTATE
// class 08, 57P01–57P03, io errors) or an ended context leaves the outcome
// unknown: nothing is counted or marked, the error wraps [dedup.ErrOutcomeUnknown],
// the delivery is not acked, and the next copy finds the truth.
// [dedup.Result].HandlerCalled is true whenever the handler ran. The handler's
// isolation level is Config.TxOptions (read committed by default).
//
// # Lease mode
//
// For side effects that cannot join the transaction (an HTTP call to a
// payment provider), [Store.ProcessLeased] commits the claim first with an
// owner token, a fence and a deadline in database time, extends it with a
// heartbeat while the [dedup.LeaseHandler] runs, and completes or fails the record
// only if the token and fence still match. A copy that finds a live lease is
// not acked ([dedup.ErrLeaseHeld]); one that finds an expired lease takes over and
// bumps the fence, and the stale owner's completion is refused with
// [dedup.ErrFenced] ([dedup.OutcomeFenced], not acked). Handlers pass
// [dedup.Lease.IdempotencyKey] (and the fence) downstream. A copy that finds the
// lease of the last allowed attempt expired does not take over: the owners
// died (or stalled) MaxAttempts times, so the record becomes FAILED_FINAL
// with a dead letter (ReasonAttemptsExhausted, [dedup.ErrExecutionLost]) and the
// copy is acked.
//
// # Crash loops
//
// A handler that kills its process (out of memory, a fatal runtime error, a
// SIGKILL) leaves nothing behind in atomic and batched modes: Postgres rolls
// the claim back with the transaction, the broker redelivers the message to
// the next process, which dies the same way, forever. Counting every start in
// a transaction of its own would bound that, at the price of one more commit
// per message. Instead a start is marked only when the delivery may replay a
// crash, which the runtime (consumer, Config.CrashLoop) knows from a lane
// watermark:
//
//   - Lane watermarks. Before a lane (a Kafka partition, a RocketMQ queue)
//     runs a handler at an offset its watermark does not cover, the runtime
//     raises the watermark to that offset plus Window (default 1000), in one
//     autocommitted upsert of one row of <RecordsTable>_lane_watermarks
//     ([Store.AdvanceLaneWatermark]). Every offset whose handler may have
//     started is thus at or below the watermark, and a first delivery costs
//     one upsert per Window+1 offsets of its lane, nothing else.
//   - Replay candidates. The first time a process runs a lane (after a start,
//     a rebalance), it learns the watermark W its predecessors left. A
//     delivery at or below W may replay a crash. Those whose record is
//     already final are answered by [Store.CheckReplay], one read and no
//     transaction (cheaper than the claim of a duplicate). Of the others only
//     the first InFlight of the lane can have been running when the process
//     died (a Kafka lane runs one delivery, or one batch, at a time; a
//     RocketMQ queue at most ConsumeGoroutines × BatchMaxSize): they are the
//     suspects. Later ones never started, and run as first deliveries.
//   - Start markers. A suspect runs after [Store.MarkStart], one short
//     transaction that locks its record (creating it FAILED_RETRYABLE with 0
//     attempts when there is none) and sets the record's start_mark to its
//     attempts. The run's own claim counts the attempt in the handler's
//     transaction: a run that reaches an outcome moves attempts past
//     start_mark; a run that dies with its process leaves attempts equal to
//     it, and the next marker counts that death as an attempt (error class
//     "process_died"). Suspects run one at a time process-wide, and a batch's
//     suspects one by one before the batch, so a death is charged to the one
//     marked run it interrupted, never to its neighbours.
//   - Dead letter. When a marker has just counted a death and the attempts,
//     plus one for the unmarked first start (which came before the first
//     marker and may have died the same way), reach MaxAttempts, the record
//     becomes FAILED_FINAL with a dead letter (ReasonAttemptsExhausted, class
//     "attempts_exhausted", [dedup.ErrExecutionLost]); the handler does not run and
//     the delivery is acked, so the lane moves on. A message that kills its
//     process at every start therefore starts exactly MaxAttempts times; one
//     that was not running at the first death, MaxAttempts−1 times (at least
//     once). The unmarked first start alone never dead-letters: a delivery
//     that never ran is never dead-lettered by a marker (so with MaxAttempts
//     1 a message that kills its process starts twice).
//   - Nothing to clean. start_mark is one integer of the record, meaningless
//     once attempts passed it, and goes with the record. A marked run that
//     returns without an outcome (shutdown, database unreachable) withdraws
//     its marker ([Store.ClearStart]): only a death leaves it. Watermarks are
//     one row per lane, never purged.
//
// Measured by make bench (BenchmarkCrashLoopOverhead, Postgres 15 on a
// shared 2-core machine; markers off and on alternate message by message,
// per message, in a quiet run where a plain transaction took 0.34 ms):
//
//	                          markers off   markers on
//	first delivery            759 µs        749 µs    the difference is noise: 1 upsert per 1001 offsets
//	replay of a final record  1132 µs       253 µs    one read instead of a claim transaction
//	replay, not final         746 µs (new)  1904 µs   +1.16 ms: the marker's transaction (a commit) and
//	                                                  3 more round trips in the run's claim
//	MarkStart alone                         531 µs    3 round trips and a commit, new identity
//
// These were measured before BEGIN travelled with the first batch: MarkStart
// of a new identity is now 2 round trips, its COMMIT included, and the
// marker's update travels with its COMMIT.
//
// Under the load of parallel test runs (commits of 1 to 3 ms) the same pairs
// gave a first delivery −159 to +124 µs (noise), a replay of a final record
// 0.27 ms instead of 1.9–2.8 ms, and a replay that is not final +3.6 to
// +4.0 ms.
//
// Only a lane's suspects after a restart pay "replay, not final": at most
// one per Kafka lane in atomic mode, BatchSize in batched mode, InFlight per
// RocketMQ queue. A first delivery runs none of the crash-loop statements but
// the watermark upsert (the integration tests count them statement by
// statement). consumer.Config.CrashLoop.Off turns it all off.
//
// pgx never resends a statement, so the store retries a lease-mode claim
// or mark in place itself when its outcome is unknown ([dedup.Classify]: the
// connection failed before its answer came), as Config.OutcomeUnknownRetry
// says (3 retries, 100 ms doubling to 1 s by default), and each one is safe
// to run twice: a claim looks for its own owner token before claiming again
// (a claim that committed is this caller's lease), and a mark that finds the
// record already in the status it writes, under its own owner token and
// fence, answers done, not fenced (the token and fence stay on the row
// after the lease ends). Without this a lost answer would leave a lease that
// blocks the next copy until it expires, and the takeover would count a
// second attempt (with MaxAttempts 1, a dead letter for a message whose
// handler never ran).
//
// # States
//
//	(none) ──claim──▶ PROCESSING ──handler ok──▶ SUCCEEDED
//	                      │ └──retryable err──▶ FAILED_RETRYABLE ──claim again──▶ PROCESSING
//	                      └──permanent err / attempts exhausted──▶ FAILED_FINAL (+ dead letter)
//	start marker: (none) ──▶ FAILED_RETRYABLE (0 attempts); FAILED_RETRYABLE ──deaths used up the attempts──▶ FAILED_FINAL
//	operator re-drive: FAILED_FINAL ──▶ FAILED_RETRYABLE
//	operator re-drive as new (conflicts): the dead letter is published again
//	  under "<message ID>#redrive-<dead-letter ID>" and gets a record of its own
//
// # Schema
//
// Tables live in a configurable schema (default "idemq") under configurable
// names, always quoted with pgx.Identifier. [Store.Migrate] applies the
// embedded, numbered SQL migrations under a Postgres advisory lock, so many
// processes may call it at start. The statements the store runs are named
// queries in embedded files (sql/*.sql, one "-- name:" block each), filled
// with the store's quoted table names once, by [New].
package pgstore
