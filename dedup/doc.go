// Package dedup is the driver-free core of idemq: message identity (message
// ID, business key, scope), payload fingerprints and conflicts, outcomes and
// record states, failure classes and errors, leases, and the [Store]
// interfaces that the runtime drives. It decides nothing by itself: a store
// (dedup/pgstore, dedup/redisstore, dedup/memstore) inserts consumption
// records under unique indexes and records every outcome.
//
// # Identity
//
// A delivery is identified by three parts (see [Identity]): the scope (the
// consumer group, optionally a tenant), the message ID (stable across broker
// redelivery: a `message-id` header or property, else the broker position) and
// the business key (stable across producer re-sends, produced by an extractor
// the user supplies; empty by default). Dedup holds on both: a delivery whose
// message ID or non-empty business key already has a record in the same scope
// is a duplicate. Keys longer than [MaxKeyBytes] bytes, or not valid UTF-8, or
// holding NUL, are stored as "sha256:<hex>" of their raw bytes ([NormalizeKey]).
// A key of only white space is no key ([IsBlank]): a blank message ID falls
// back to the broker position, a blank business key is none.
//
// # Fingerprint and conflicts
//
// Every record stores an HMAC-SHA256 fingerprint of the payload, keyed by a
// secret with a key ID so that secrets rotate ([Fingerprinter]). A delivery
// with a known identity and a different fingerprint is a conflict: it is never
// applied and never silently skipped; it goes to the dead-letter table and is
// then acknowledged. Its reason says which kind ([ConflictReason]):
// [ReasonMessageIDCollision] when it matched the record by message ID and its
// business key differs (two messages under one ID; pgstore.Store.RedriveAsNew
// processes it under a derived ID and keeps both records), else
// [ReasonPayloadConflict] (one intent, two payloads; the record stands).
//
// # Stores
//
// A store keeps the consumption records and runs handlers. The runtime
// (package consumer) needs [Store] from every store (lease mode, bad input,
// retention checks) and, for atomic and batched modes, [TxStore] with the
// store's transaction type. Stores in this module:
//
//   - dedup/pgstore: Postgres (pgx/v5). Atomic mode (the handler's writes
//     commit in the same transaction as the record), batched mode, lease mode,
//     crash-loop markers, dead letters, re-drive, purge, migrations. The
//     store to use in production.
//   - dedup/redisstore: Redis only (go-redis/v9), lease mode, for handlers
//     whose effects live outside Postgres.
//   - dedup/memstore: in memory, for unit tests of handlers.
//
// dedup/redisfast is an optional Redis fast path in front of pgstore. Every
// store passes the conformance suite dedup/storetest; a store written outside
// this module should too. This package imports no database or Redis client.
//
// # Failure classes
//
// What a failure means decides what happens, whatever step raised it
// ([Classify], [FailureClass]): a handler failure (its error or panic, a
// COMMIT the server refused) is counted and marked; a [Permanent] error is
// dead-lettered at once; a serialization failure or deadlock (40001, 40P01)
// retries the whole transaction at once without counting
// (pgstore.Config.TransientRetry), and becomes a handler failure only when those
// retries are used up; a connection lost or terminated at COMMIT (SQLSTATE
// class 08, 57P01–57P03, io errors) or an ended context leaves the outcome
// unknown: nothing is counted or marked, the error wraps [ErrOutcomeUnknown],
// the delivery is not acked, and the next copy finds the truth.
// [Result].HandlerCalled is true whenever the handler ran. The handler's
// isolation level is pgstore.Config.TxOptions (read committed by default).
//
// # Lease mode
//
// For side effects that cannot join the transaction (an HTTP call to a
// payment provider), Store.ProcessLeased commits the claim first with an
// owner token, a fence and a deadline in database time, extends it with a
// heartbeat while the [LeaseHandler] runs, and completes or fails the record
// only if the token and fence still match. A copy that finds a live lease is
// not acked ([ErrLeaseHeld]); one that finds an expired lease takes over and
// bumps the fence, and the stale owner's completion is refused with
// [ErrFenced] ([OutcomeFenced], not acked). Handlers pass
// [Lease.IdempotencyKey] (and the fence) downstream. A copy that finds the
// lease of the last allowed attempt expired does not take over: the owners
// died (or stalled) MaxAttempts times, so the record becomes FAILED_FINAL
// with a dead letter (ReasonAttemptsExhausted, [ErrExecutionLost]) and the
// copy is acked.
//
// # Crash loops
//
// A handler that kills its process would be redelivered to the next process
// and kill it too, forever. Stores bound that: an execution that never reports
// an outcome is counted as an attempt, and when the attempts reach the
// store's MaxAttempts the record becomes FAILED_FINAL with a dead letter
// ([ErrExecutionLost]). How each store detects such a death is its own
// (dedup/pgstore: start markers and lane watermarks; lease mode: lease
// expiry).
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
package dedup
