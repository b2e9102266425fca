// Package redisstore keeps consumption records in Redis alone, for
// lease-mode handlers that have no database of their own (a handler whose
// only effect is an HTTP call with an idempotency key, an e-mail, a cache
// write). It implements consumer.Store, so consumer.Config{Store: rs,
// LeaseHandler: h} runs on Kafka or RocketMQ exactly as with Postgres; it does
// not run atomic-mode handlers (there is no transaction to join).
//
// # How it works
//
// Each identity has a record (a Redis hash: status, attempts, fence, owner
// token, payload fingerprint, last error), an optional business-key index
// (a string naming the record's message ID) and, while a handler runs, a
// lease key set with SET … PX TTL holding "<owner token>:<fence>". Claims,
// renewals and completions are Lua scripts, so each is one atomic
// compare-and-set on the server: the claim creates the record or decides on
// the existing one (duplicate, conflict, live lease, takeover); the watchdog
// renews the lease only while the owner token and fence are still the
// record's; the completion writes SUCCEEDED (or a failure) only under the
// same condition, so a stale owner is fenced. Dead letters go to a Redis
// stream per scope, written by the same script that makes a record
// FAILED_FINAL or detects a conflict. Record keys expire after
// SucceededRetention (SUCCEEDED) or FailedRetention (anything else); dead
// letters are trimmed after FailedRetention. Times are the Redis server's.
//
// Conflicts are dead-lettered with the reason of their kind
// (dedup.ConflictReason), and a conflict's dead letter can be re-driven as a
// new message (RedriveAsNew, audited in a hash "…:redrive:<dead-letter ID>").
//
// Every script is safe to run twice: go-redis sends a command again when
// the connection died before its reply came, and the first run may have
// happened. Each call carries an ID of its caller (the claim's owner token,
// the owner token and fence of a completion, a fresh token for a rejection, a
// re-drive or a re-drive as new); a script whose first run already did the
// work recognises the
// ID and returns the first run's reply, writing nothing. So a retried claim
// finds its own lease and runs the handler (not "lease held", which would
// end, with MaxAttempts 1, in a dead letter for a message that never ran),
// and a retried completion answers done, not fenced. The record keeps what
// that takes: its last owner token and fence (also after the lease ended),
// and the token and dead-letter ID of a claim or rejection that ended it; a
// conflict's marker keeps the claim's token, dead-letter ID and reason.
//
// Keys are "<Prefix>:{<scope digest>}:rec:<message ID>", "…:bk:<business
// key>", "…:lease:<message ID>", "…:dead_letters" and
// "…:redrive:<dead-letter ID>": all keys of one scope
// share a hash tag, hence one slot on Redis Cluster, which the scripts
// need; a very busy scope therefore lives on one shard. It needs Redis 6.2
// or later (XADD … MINID); the tests run on Redis 7.0 from Debian.
//
// # What it guarantees, and what it does not
//
// With a Redis that keeps its writes (a single primary with appendfsync
// always, or no failover), it gives lease mode's guarantees: one live owner
// per identity at a time, duplicates and conflicts recognized by message ID
// and business key, failures counted and bounded by MaxAttempts, a stale
// owner's completion refused (ErrFenced), nothing acked before its outcome is
// in Redis.
//
// It is weaker than the Postgres store, and the difference is plain:
//
//   - Redis replication is asynchronous. A failover can lose the last writes
//     of the old primary: a SUCCEEDED record the broker was already acked
//     for can vanish, and a redelivered copy then runs the handler again.
//     The window is what the primary acknowledged and had not yet sent its
//     replica: its replication lag. make drill-redis-failover measures it
//     on a Sentinel failover (docs/operations.md): no record lost with the
//     replica streaming on loopback, 472 of 2000 with the replica stopped
//     for at most 0.66s before the kill.
//     The store has no option to WAIT for replicas before a completion
//     returns.
//     The same holds for a restart with appendfsync everysec (up to a second
//     of writes) or without persistence (everything).
//   - The handler's effects and the record are not one transaction. A
//     process that dies after the side effect and before the completion
//     leaves PROCESSING; after the lease TTL another copy takes over and
//     runs the handler again. Pass Lease.IdempotencyKey (and the fence) to
//     the downstream system so it can refuse the repeat: this is what lease
//     mode is for.
//   - Records expire with their TTL; a copy delivered after that runs again
//     (ValidateRetention refuses a retention shorter than the broker's
//     redelivery horizon).
//   - Memory is the limit: every record lives in Redis until it expires.
//     Run Redis with maxmemory-policy noeviction: every key of the store has
//     a TTL, so a volatile-* policy would evict records and leases first and
//     silently let copies run again.
//
// When the handler writes to Postgres, use pgstore.Store instead: its atomic
// mode makes the record and the effects one transaction.
package redisstore
