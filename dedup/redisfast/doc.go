// Package redisfast is a Redis fast path for dedup: after a
// record commits as SUCCEEDED, its identity is remembered in Redis with a
// TTL; later copies are answered from Redis without touching Postgres.
//
// Redis is never the source of truth. A miss, a Redis error (the store counts
// it, see pgstore.Store.FastPathStats) or a value that is not a SUCCEEDED entry
// (a claim marker left by a worker that died before its commit) falls through
// to Postgres. A hit is trusted only when the remembered payload fingerprint
// matches, so conflicts still reach the dead-letter path. Losing Redis (a
// failover, FLUSHALL) costs only speed.
//
// Keys: "<prefix>:{<scope>}:m:<message ID>" and
// "<prefix>:{<scope>}:b:<business key>" (hash-tagged by scope so one
// pipeline serves a Redis Cluster slot); values "s1:<key ID>:<hex
// fingerprint>".
//
// FastPath is also a dedup.BatchFastPath: pgstore's ProcessBatch looks a
// whole batch up with LookupBatch (one pipeline, one MGET per scope) before
// it opens any transaction, and remembers the batch's succeeded messages
// with RememberBatch (one pipeline of SETs) after its commit. Each counts as
// one call for Timeout and the circuit breaker.
//
// # When Redis is down
//
// Redis is optional here, so an outage must cost next to nothing on the
// critical path. Three things see to it:
//
//   - Each call (one MGET for Lookup, one pipeline of SETs for Remember) is
//     bounded by Config.Timeout (default 50ms, at most MaxTimeout, 1s)
//     through its context.
//   - A circuit breaker (github.com/sony/gobreaker): after
//     Config.BreakerFailures consecutive failed calls (errors and timeouts,
//     default 5) it opens, and for Config.BreakerCooldown (default 5s) every
//     call returns ErrBreakerOpen at once, without touching Redis: Postgres
//     decides alone, and the store counts the call as a fast-path error
//     (idemq_fastpath_total{result="error"}). Then one call probes Redis
//     (half-open; the others keep skipping it): success closes the breaker,
//     failure opens it for another cool-down. It logs one warning when it
//     opens and one info line when it closes, never a line per message. A
//     call that fails because its caller's context ended (a shutdown) does
//     not count.
//   - A client that fails fast: ClientOptions or FailFast (FailFastCluster
//     for a cluster) set go-redis to one dial per call (DialerRetries 1), no
//     command retries (MaxRetries -1), socket deadlines from the call's
//     context (ContextTimeoutEnabled), and dial, read, write and pool
//     timeouts of at most MaxTimeout. With go-redis's defaults a call against
//     a Redis that refuses connections waits the whole Timeout in dial
//     retries 100ms apart (and go-redis logs "failed to dial after 5
//     attempts" each time), and a hung Redis holds a call for ReadTimeout
//     (5s) whatever Timeout says. New logs one warning naming these settings
//     when the client it is given (a *redis.Client or *redis.ClusterClient)
//     has them.
//
// The budget this gives, per outage: the calls that open the breaker wait at
// most BreakerFailures × Timeout in all (with FailFast and a Redis that
// refuses connections, well under a millisecond each; 250ms with the
// defaults against a hung Redis, spread over the lanes that made them);
// then each cool-down costs one probe of at most Timeout, and New refuses a
// BreakerCooldown under MinCooldownTimeouts (10) × Timeout, so probes take
// at most a tenth of one lane's time (1% with the defaults). Every other
// message pays no Redis call at all: the benchmark BenchmarkFastPathRedisDown
// (make bench) measures throughput with Redis down at 0.9 or more of the
// same store without a fast path.
//
// Observe the breaker with FastPath.BreakerStats, or register
// FastPath.Collector for idemq_fastpath_breaker_state (0 closed, 1
// half-open, 2 open), idemq_fastpath_breaker_transitions_total{from, to} and
// idemq_fastpath_breaker_skipped_total.
package redisfast
