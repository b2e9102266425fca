// Package memstore is an in-memory consumption-record store for unit tests
// of handlers: it implements dedup.Store (lease mode) and
// dedup.TxStore[*memstore.Tx] (atomic and batched modes) with the same
// outcomes as the Postgres store, so a handler's test can deliver a message
// twice, fail it, exhaust its attempts or send a conflicting copy and check
// what the runtime would do, without a database.
//
// It is not for production: records live in the process's memory and die
// with it, so a restarted consumer would apply every redelivered message
// again. Use dedup/pgstore or dedup/redisstore there.
//
// # Atomic mode
//
// Process runs the handler with a *Tx: a small key-value transaction whose
// writes (Tx.Set) are applied to the store, read with Store.Get, only when
// the handler returns nil, together with the SUCCEEDED record; a failed run
// leaves nothing. Tx.OnCommit runs a function after the commit, for effects
// a test observes. ProcessBatch handles a batch in order, each message as
// Process does.
//
// # Lease mode
//
// ProcessLeased runs the handler outside any transaction under a lease with
// an owner token and a fence, on the idemq lease engine (heartbeats,
// fencing of a stale owner), the lease timed by the process's clock.
//
// # Conformance
//
// The store passes the dedup/storetest suite in its three modes (see the
// package's tests); it has no crash-loop start markers (StartMarker), which
// bound handlers that kill their process: a unit test's process does not
// die. Purge removes records past their retention when called; nothing
// runs it on a schedule.
package memstore
