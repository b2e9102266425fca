// Package dedup is the core of idemq: it decides, inside the handler's own
// Postgres transaction, whether a delivery is new, a duplicate or a conflict,
// and it records every outcome in a consumption record.
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
// business key differs (two messages under one ID; [Store.RedriveAsNew]
// processes it under a derived ID and keeps both records), else
// [ReasonPayloadConflict] (one intent, two payloads; the record stands).
//
// # Atomic mode
//
// [Store.Process] runs one delivery in one transaction:
//
//  1. claim: INSERT … ON CONFLICT DO NOTHING RETURNING (one statement, caught
//     by the two unique indexes, never check-then-insert); on conflict the
//     existing record is read with SELECT … FOR UPDATE, so two copies of one
//     message serialize on the row;
//  2. the handler runs with the same pgx.Tx and writes its business rows
//     (and outbox rows) there;
//  3. the record is marked SUCCEEDED and everything commits together.
//
// When the handler fails, the transaction rolls back (its writes vanish) and a
// second short transaction marks the record FAILED_RETRYABLE, or FAILED_FINAL
// when the error is [Permanent] or the attempts reach Config.MaxAttempts; a
// FAILED_FINAL mark writes a dead-letter row in the same transaction. Records
// are never deleted while live; failures are marked, so redelivery is safe.
//
// [Store.ProcessBatch] runs up to N deliveries in one transaction, a
// savepoint per message. When the batch cannot commit because of one of them
// (a refused COMMIT, or serialization failures that outlive their retries),
// it is rerun one message per transaction with Process's semantics, so that
// the culprit alone is marked and dead-lettered after its attempts; a batch
// is never retried whole without end.
//
// # Failure classes
//
// What a failure means decides what happens, whatever step raised it
// ([Classify], [FailureClass]): a handler failure (its error or panic, a
// COMMIT the server refused) is counted and marked; a [Permanent] error is
// dead-lettered at once; a serialization failure or deadlock (40001, 40P01)
// retries the whole transaction at once without counting
// (Config.TransientRetry), and becomes a handler failure only when those
// retries are used up; a connection lost or terminated at COMMIT (SQLSTATE
// class 08, 57P01–57P03, io errors) or an ended context leaves the outcome
// unknown: nothing is counted or marked, the error wraps [ErrOutcomeUnknown],
// the delivery is not acked, and the next copy finds the truth.
// [Result].HandlerCalled is true whenever the handler ran. The handler's
// isolation level is Config.TxOptions (read committed by default).
//
// # Lease mode
//
// For side effects that cannot join the transaction (an HTTP call to a
// payment provider), [Store.ProcessLeased] commits the claim first with an
// owner token, a fence and a deadline in database time, extends it with a
// heartbeat while the [LeaseHandler] runs, and completes or fails the record
// only if the token and fence still match. A copy that finds a live lease is
// not acked ([ErrLeaseHeld]); one that finds an expired lease takes over and
// bumps the fence, and the stale owner's completion is refused with
// [ErrFenced] ([OutcomeFenced], not acked). Handlers pass
// [Lease.IdempotencyKey] (and the fence) downstream.
//
// pgx never resends a statement, so the store retries a lease-mode claim
// or mark in place itself when its outcome is unknown ([Classify]: the
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
//	operator re-drive: FAILED_FINAL ──▶ FAILED_RETRYABLE
//	operator re-drive as new (conflicts): the dead letter is published again
//	  under "<message ID>#redrive-<dead-letter ID>" and gets a record of its own
//
// # Schema
//
// Tables live in a configurable schema (default "idemq") under configurable
// names, always quoted with pgx.Identifier. [Store.Migrate] applies the
// embedded, numbered SQL migrations under a Postgres advisory lock, so many
// processes may call it at start.
package dedup
