// Package redisfast is a Redis fast path for dedup: after a
// record commits as SUCCEEDED, its identity is remembered in Redis with a
// TTL; later copies are answered from Redis without touching Postgres.
//
// Redis is never the source of truth. A miss, a Redis error (the store counts
// it, see dedup.Store.FastPathStats) or a value that is not a SUCCEEDED entry
// (a claim marker left by a worker that died before its commit) falls through
// to Postgres. A hit is trusted only when the remembered payload fingerprint
// matches, so conflicts still reach the dead-letter path. Losing Redis (a
// failover, FLUSHALL) costs only speed.
//
// Keys: "<prefix>:{<scope>}:m:<message ID>" and
// "<prefix>:{<scope>}:b:<business key>" (hash-tagged by scope so one
// pipeline serves a Redis Cluster slot); values "s1:<key ID>:<hex
// fingerprint>".
package redisfast
