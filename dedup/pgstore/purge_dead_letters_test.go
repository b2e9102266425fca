package pgstore

import (
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// PurgeDeadLetters deletes the dead letters older than the retention,
// re-driven or not, with their published re-drive audit rows, in steps of
// at most Batch, and keeps the young ones (live or re-driven) and an old one
// whose re-drive as new is not yet published. Progress sees the running
// total.
func TestPurgeDeadLetters(t *testing.T) {
	e := newOwnSchemaEnv(t, nil) // it purges its own table
	dl := pgx.Identifier{e.schema, "dead_letters"}.Sanitize()
	rd := pgx.Identifier{e.schema, "dead_letters_redrives"}.Sanitize()
	insert := func(prefix string, n int, created string, redriven bool) {
		t.Helper()
		e.exec(`insert into `+dl+` (scope, message_id, reason, created_at, redriven_at)
			select $1, $2 || g, 'failed', now() - $3::interval, case when $4 then now() end
			from generate_series(1, $5::int) g`, e.scope, prefix, created, redriven, n)
	}
	insert("old-", 23, "40 days", false)
	insert("old-redriven-", 7, "35 days", true)
	insert("pending-", 1, "35 days", true) // re-drive as new requested, unpublished
	insert("published-", 1, "35 days", true)
	e.exec(`insert into ` + rd + ` (dead_letter_id, scope, message_id, new_message_id, reason)
		select id, scope, message_id, message_id || '#redrive-' || id, 'failed' from ` + dl + ` where starts_with(message_id, 'pending-')`)
	e.exec(`insert into ` + rd + ` (dead_letter_id, scope, message_id, new_message_id, reason, published_at)
		select id, scope, message_id, message_id || '#redrive-' || id, 'failed', now() from ` + dl + ` where starts_with(message_id, 'published-')`)
	insert("young-", 12, "1 day", false)
	insert("young-redriven-", 3, "2 days", true)

	var seen []int64
	n, err := e.store.PurgeDeadLetters(e.ctx, PurgeOptions{Batch: 5, OlderThan: 30 * 24 * time.Hour, Progress: func(d int64) { seen = append(seen, d) }})
	if err != nil || n != 31 {
		t.Fatalf("purge: %d, %v; want 31", n, err)
	}
	if len(seen) < 31/5 || seen[len(seen)-1] != 31 {
		t.Fatalf("progress %v: want steps of at most 5 ending at 31", seen)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i]-seen[i-1] > 5 {
			t.Fatalf("progress %v: a step deleted more than Batch", seen)
		}
	}
	if left := e.count(`select count(*) from ` + dl + ` where created_at < now() - interval '30 days'`); left != 1 {
		t.Fatalf("%d old dead letters left, want the 1 pending re-drive", left)
	}
	if left := e.count(`select count(*) from ` + dl + ` where starts_with(message_id, 'pending-')`); left != 1 {
		t.Fatal("the dead letter of an unpublished re-drive was deleted")
	}
	if left := e.count(`select count(*) from ` + dl + ` where starts_with(message_id, 'young')`); left != 15 {
		t.Fatalf("%d young dead letters left, want 15", left)
	}
	if left := e.count(`select count(*) from ` + rd); left != 1 {
		t.Fatalf("%d audit rows left, want the unpublished one", left)
	}
	if n, err := e.store.PurgeDeadLetters(e.ctx, PurgeOptions{OlderThan: 30 * 24 * time.Hour}); err != nil || n != 0 {
		t.Fatalf("second purge: %d, %v; want 0", n, err)
	}
	for _, o := range []PurgeOptions{{}, {OlderThan: time.Second}, {OlderThan: time.Hour, Batch: -1}, {OlderThan: time.Hour, Batch: 100001}} {
		if _, err := e.store.PurgeDeadLetters(e.ctx, o); !errors.Is(err, dedup.ErrInvalidConfig) {
			t.Errorf("PurgeDeadLetters(%+v) = %v, want ErrInvalidConfig", o, err)
		}
	}
}
