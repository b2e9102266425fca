package pgstore

// Waiting on conditions instead of sleeping: the store-level tests wait on
// durable state in Postgres (a lease's lease_until against the database's
// now(), a backend waiting on a lock), polled with a generous deadline.

import "time"

// waitDeadline bounds every wait of these tests: far beyond what any wait
// takes on a loaded machine, so that only a broken guarantee reaches it.
const waitDeadline = 60 * time.Second

// eventually polls cond every 20ms until it holds, failing the test after
// waitDeadline with what it waited for.
func (e *storeEnv) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(waitDeadline)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %s waiting for %s", waitDeadline, what)
		}
		<-tick.C
	}
}

// leaseLeft is how long the lease of the test's record messageID has left
// in database time (lease_until - now(), seconds; negative once it expired),
// read through e.pool.
func (e *storeEnv) leaseLeft(messageID string) float64 {
	e.t.Helper()
	var left float64
	if err := e.pool.QueryRow(e.ctx, `select extract(epoch from lease_until - now()) from `+e.records()+`
where scope = $1 and message_id = $2`, e.scope, messageID).Scan(&left); err != nil {
		e.t.Fatalf("lease of %s: %v", messageID, err)
	}
	return left
}

// waitLeaseExpired waits until the lease of the test's record messageID has
// run out by the database's clock (lease_until <= now()): the moment a copy
// may take over.
func (e *storeEnv) waitLeaseExpired(messageID string) {
	e.t.Helper()
	e.eventually("the lease of "+messageID+" to expire in database time", func() bool { return e.leaseLeft(messageID) <= 0 })
}

// lockWaiters counts the backends whose application_name is app and that
// wait on a lock (a row lock of another transaction, say).
func (e *storeEnv) lockWaiters(app string) int {
	e.t.Helper()
	return e.count(`select count(*) from pg_stat_activity
where datname = current_database() and application_name = $1 and wait_event_type = 'Lock'`, app)
}
