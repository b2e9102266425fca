// Package transition applies guarded state transitions to rows in Postgres:
// the state-machine and optimistic-lock pattern for updates that are not
// inserts (an order goes PENDING → PAID → SHIPPED, or PENDING → CANCELLED).
//
// A Machine declares the allowed transitions of one entity (one table) and
// applies one with a single statement, in the caller's transaction:
//
//	UPDATE <table> SET <status> = $to, <version> = <version> + 1
//	 WHERE <id> = $id AND <status> = ANY($from) [AND <version> = $v]
//	RETURNING <version>, <Returning columns…>
//
// where $from are the states the rules allow `to` from. Nothing is read
// first, so there is no check-then-write race: two callers applying the same
// transition at once serialize on the row lock, and under READ COMMITTED the
// second one re-evaluates the WHERE clause on the committed row, finds the
// status already moved and changes nothing. Only when the UPDATE changed
// nothing does a second statement read the row to say why:
//
//   - the status already is `to` (with IfVersion(v): and the version is
//     v+1): Result.AlreadyApplied, not an error. A provider callback
//     delivered three times, a redelivered message or a retried request
//     changes the row once and is told so the other times;
//   - the status is one the row reached after `to` (Machine.Passed, see
//     "Already passed" below), without IfVersion: Result.AlreadyApplied
//     too, with Result.Status naming the later status: a late callback
//     (CAPTURED for an order already SETTLED) is a repeat, not an error.
//     With IfVersion it is ErrStaleVersion: the caller's read is out of
//     date and its own transition is not known to have happened;
//   - the status is one `to` is allowed from, but the version is not the
//     one given with IfVersion: ErrStaleVersion (someone else changed the
//     row since the caller read it; read again and decide again);
//   - any other status: ErrIllegalTransition (an *IllegalTransitionError
//     carries the current status and version). When the rules can never
//     lead from the current status to `to` (CAPTURED for a VOIDED payment
//     on a branch that never reaches CAPTURED) the error is permanent
//     (IllegalTransitionError.Permanent): idemq's consumer dead-letters
//     the message at its first attempt instead of retrying it; when they
//     can, in more than one step (IllegalTransitionError.Reachable: SETTLED
//     asked of an AUTHORIZED payment, CAPTURED missing), it is an ordinary
//     failure, retried up to the store's MaxAttempts, so the missing step
//     may arrive first;
//   - no row: ErrNotFound.
//
// # Already passed
//
// A row in status S has passed status T when the declared rules lead from
// T to S in one or more transitions (T is an ancestor of S on a declared
// path: Machine.Reachable(T, S)) and do not lead back from S to T. On
// NEW → AUTHORIZED → CAPTURED → SETTLED with AUTHORIZED → VOIDED, SETTLED
// has passed NEW, AUTHORIZED and CAPTURED; VOIDED has passed NEW and
// AUTHORIZED, never CAPTURED. The closure is computed once by New.
//
// Cycles: when S and T reach each other (both on one cycle, such as
// ACTIVE → SUSPENDED → REVIEW → ACTIVE), the status alone cannot say
// whether T is a late repeat of this round or an early request of the
// next one, so T is not passed: Apply refuses it as illegal, not
// permanent, and the consumer retries it until MaxAttempts then keeps it
// as a dead letter, so nothing is dropped silently. Tell rounds apart with
// IfVersion, or with an event sequence in the entity. A status outside the
// rules (written by something else) has passed nothing and reaches
// nothing.
//
// Apply takes anything with QueryRow (a DB): a pgx.Tx (the handler's
// transaction under idemq's consumer, or the one the httpidem middleware
// hands an HTTP handler, so the transition commits with the record, the
// business rows and the outbox rows), a *pgxpool.Pool or a *pgx.Conn
// (each statement then commits alone). Under REPEATABLE READ or
// SERIALIZABLE a concurrent transition fails with SQLSTATE 40001 instead
// (the database's error, returned wrapped): run the transaction again (a
// handler under idemq's consumer is, as a transient failure); the next run
// reads the committed row and reports it already applied.
//
// Table and column names are pgx.Identifier values, validated by New and
// quoted, never spliced from strings. The status column may be text,
// varchar or an enum type (compared as text); the version column an
// integer type.
//
// # Metrics
//
// Machine.Collector exports idemq_transitions_total{entity, to, result},
// result among applied, already_applied, illegal, stale_version,
// not_found; result="illegal" counts illegal transitions. The entity label
// is Config.Entity, so several Machines register with one registry.
package transition
