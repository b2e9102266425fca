package pgstore

import (
	"testing"
)

// Purge walks past the records kept behind the expiry frontier, however
// many steps they fill: final failures within their retention, a retryable
// record, and SUCCEEDED records still within their retention though created
// long ago (completed late: after retries, a re-drive, a long lease). Then it
// deletes every expired record, and stops at the young ones, in steps of at
// most batch records. A walk that took a step without deletions holding a
// live SUCCEEDED record for the frontier would stop in the kept records and
// delete nothing.
func TestPurgeWalksPastKeptRecords(t *testing.T) {
	e := newOwnSchemaEnv(t, nil) // it purges; SucceededRetention 7 days
	insert := func(prefix string, n int, status, created, expires string) {
		t.Helper()
		e.exec(`insert into `+e.records()+` (scope, message_id, fingerprint, fingerprint_key_id, status, created_at, expires_at)
			select $1, $2 || g, '\x00', 'k1', $3, now() - $4::interval, now() + $5::interval
			from generate_series(1, $6::int) g`, e.scope, prefix, status, created, expires, n)
	}
	insert("final-", 25, "FAILED_FINAL", "10 days", "20 days")
	insert("late-", 25, "SUCCEEDED", "10 days", "1 hour")
	e.exec(`insert into `+e.records()+` (scope, message_id, fingerprint, fingerprint_key_id, status, created_at)
		values ($1, 'open-1', '\x00', 'k1', 'FAILED_RETRYABLE', now() - interval '9 days')`, e.scope)
	insert("expired-", 30, "SUCCEEDED", "8 days", "-1 day")
	insert("young-", 20, "SUCCEEDED", "1 hour", "7 days")

	n, err := e.store.Purge(e.ctx, 10)
	if err != nil || n != 30 {
		t.Fatalf("purge: %d, %v; want 30", n, err)
	}
	if left := e.count(`select count(*) from ` + e.records() + ` where expires_at < now()`); left != 0 {
		t.Fatalf("%d expired records left", left)
	}
	if left := e.count(`select count(*) from ` + e.records()); left != 71 {
		t.Fatalf("%d records left, want the 71 kept", left)
	}
	if n, err := e.store.Purge(e.ctx, 10); err != nil || n != 0 {
		t.Fatalf("second purge: %d, %v; want 0", n, err)
	}
}
