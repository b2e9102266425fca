// Package outbox is idemq's transactional outbox: messages written in the
// same Postgres transaction as the business writes (and, under idemq, as the
// consumption record), then published by a relay with a stable message ID
// that the next consumer dedups on.
//
// # Writing
//
// Inside a pgstore.Handler, write rows through the transaction you are given:
//
//	func confirm(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
//		if _, err := tx.Exec(ctx, `insert into orders ...`); err != nil {
//			return err
//		}
//		_, err := ob.Add(ctx, tx, outbox.Message{
//			Topic: "order.confirmed", Key: m.Key, Payload: body,
//			CausationID: outbox.Causation(m),
//		})
//		return err
//	}
//
// Add (one row) and AddBatch (many rows, one round trip) insert rows that
// commit or roll back with the transaction: a handler that fails leaves no
// row, and a redelivered duplicate, whose handler idemq does not run, adds
// none. Each row gets a UUIDv7 message ID, returned by Add. The package-level
// Add and AddBatch use the default table "idemq"."outbox".
//
// # The table
//
// One row per message: seq (database-assigned order), id (UUIDv7), topic,
// key, headers, payload, causation_id (the dedup identity of the message
// being handled, for tracing), created_at, available_at, attempts,
// last_error, last_attempt_at, parked_at, published_at, published_by. Schema
// and table names are configurable (Config) and always quoted with
// pgx.Identifier. Outbox.Migrate applies the embedded, numbered migrations
// with tern under the advisory lock that pgstore.Store.Migrate uses, recording
// the version in <table>_schema_version.
//
// # Relaying
//
// A Relay claims rows in a transaction with SELECT … FOR UPDATE SKIP LOCKED,
// publishes them through a Publisher while it holds the row locks, marks them
// published and commits. A batch costs two round trips to Postgres when the
// oldest rows fill it: BEGIN travels with the claim (one statement that
// locks the heads and reads the rows behind them), and the marks travel
// with COMMIT (a mark that fails aborts the transaction, and the COMMIT
// behind it never runs). The locks are the lease: two relays never publish a
// row at the same time, and a relay that dies (crash, lost connection)
// releases its rows when Postgres ends its transaction. A crash between the
// publish and the commit publishes the rows again later with the same message
// ID, key, headers and bytes; the consumer's dedup (which reads the
// message-id header or property) absorbs the copy with no user code.
//
// Publishers: outbox/kafkapub (kafka-go produce requests with acks=all, one
// atomic record batch per partition, message ID in the message-id header,
// wire.MessageIDHeader) and outbox/rocketmqpub (SendSync one message at a
// time, message ID as the message-id user property, Keys = the row key).
// The header names are the wire package's, which idemq's broker adapters
// read.
//
// # Order
//
// Rows with the same topic and key are published in seq order (insertion
// order), and a row is never published while an earlier row of its key is
// unpublished. A relay claims only the earliest unpublished row of a key (its
// head) plus the rows behind it (up to RelayConfig.MaxKeys keys and
// RelayConfig.BatchSize rows per transaction), so a key whose head another
// relay holds is skipped whole: two relays never interleave one key. Heads
// are found among the oldest unpublished rows (2 × MaxKeys of them, and the
// oldest keyless rows); when those do not fill the batch (they are blocked:
// parked or delayed heads, heads waiting out a retry delay, keys other
// relays hold) a second statement walks the keys round robin, stepping over
// the keys whose head is not due (by the database's clock) without counting
// them, so neither a blocked key with a deep backlog nor a few keys whose
// heads the broker keeps refusing starve the others: the batch right after
// such a refusal publishes the other keys (one walk statement steps over up
// to a thousand blocked keys; a claim runs at most two). Of the due heads a
// batch takes the MaxKeys due the longest (available_at: a new row is due
// from its commit or Delay, a refused one from its retry time), and when the
// oldest rows' heads failed before it also walks for as many heads behind
// them, so a refused head costs only its own retries: each takes one place
// in one batch, queued behind the rows that were due before its retry time.
//
// Within a batch, a ChainPublisher (both provided publishers are) gets each
// key's rows as one chain and never stores a later row of a chain unless the
// earlier ones are stored; any other Publisher gets rounds of at most one row
// per key, a key's next row only after the previous one was acknowledged,
// and before each round after the first the relay checks (one statement on
// the claim transaction) that its claim still stands: a claim lost while a
// round was out (the backend terminated, a restart or a failover) ends the
// batch there, as a lost batch, so the relay does not go on publishing rows
// another relay may have claimed by then.
// With republishes, consumers see the first copy of every row in order. Rows
// without a key have no order. Two transactions writing rows of one key are
// serialized: Add takes a transaction-level advisory lock per (topic, key),
// held until commit or rollback, so the second writer inserts (and gets its
// seq) only after the first has finished, and seq order is commit order. A
// transaction that adds rows of several keys in separate Add calls, in an
// order another transaction reverses, can deadlock; Postgres then aborts one
// of them (a retryable handler failure). Add many keys in one AddBatch, which
// locks them in sorted order.
//
// # Failures
//
// A failed publish is recorded on the row (attempts, last_error) and retried
// after an exponential delay (RelayConfig.RetryInitial doubling up to
// RetryMax, ±20% jitter); the later rows of its key wait behind it. After
// RelayConfig.MaxAttempts failures the row is parked: kept with its error,
// no longer tried, still holding back its key, until Outbox.Unpark. Rows are
// never dropped. Database errors abort the batch (its rows are published
// again) and are retried with backoff.
//
// Only row errors count: a publish that fails because the broker is
// unavailable (IsUnavailable: connection refused, timeouts, no leader, not
// enough replicas; publishers mark such errors with Unavailable) records
// nothing on the row and pauses all publishing of the relay (a circuit
// breaker): one probe batch after RelayConfig.OutageBackoffInitial, doubling
// up to OutageBackoffMax while probes fail, so an outage of any length parks
// nothing and the rows drain in per-key order once the broker is back
// (RelayStats.BreakerOpen, Outages, Unavailable). Errors no publisher
// classified are row errors.
//
// # Wake-ups and retention
//
// Add sends pg_notify in its insert statement; the relay LISTENs and wakes at
// commit, and polls every RelayConfig.PollInterval as a fallback (lost
// notifications, retry times coming due). LISTEN is optional: when its
// connection is lost the workers are woken at once and poll every
// RelayConfig.FallbackPollInterval (1s by default, however long
// PollInterval is) while the relay reconnects in the background; the loss is
// one warning in the log and RelayStats.ListenLost.
// Published rows are deleted after RelayConfig.Retention, in batches of
// RelayConfig.PurgeBatch, unless RelayConfig.DisablePurge is set.
//
// # Shutdown
//
// When Run's context ends, the relay claims nothing new, lets in-flight
// batches publish and mark for up to RelayConfig.ShutdownGrace, closes its
// LISTEN connection and returns.
//
// # Scheduling it yourself
//
// Relay.RunOnce claims, publishes and marks one batch and returns: what each
// worker of Run does in a loop. Call it to drain the outbox from a cron job or
// a serverless function (`idemq relay --once` does so until a batch claims
// nothing), or from a benchmark. It may run beside Run and other relays.
//
// # Crashes between publish and mark
//
// The window that matters is after a publish and before the mark: the
// integration tests (scenario S16) terminate the claim transaction's backend
// right after a publish, found in pg_stat_activity by the relay's
// application_name, and the order-pipeline demo kills its relay process
// there by wrapping its Publisher. Neither needs a hook in the relay. The
// package's own tests hold the LISTEN connection down through unexported
// test signals (River's testSignals pattern).
package outbox
