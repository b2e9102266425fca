package pgstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Every update of a record is HOT (heap-only: the new version on the same
// page, no index entry written) once migration 005 has dropped the index on
// expires_at: the lease-mode success mark after PROCESSING, the batched
// mark, an atomic retry's reclaim and success, a final failure and its
// re-drive. With the index of migrations 001 to 004, every update that
// writes expires_at (each of those but the reclaim and the retryable mark)
// wrote a new entry into every index, and this test fails.
//
// The counts are the table's own (a schema of the test's own), read from
// pg_stat_user_tables once the pool that did the work has closed: a backend
// hands its pending statistics over when it exits, on PostgreSQL 13 through
// the statistics collector, so the test waits for them.
func TestRecordUpdatesAreHOT(t *testing.T) {
	e := newOwnSchemaEnv(t, nil)
	work := e.newPool(func(*pgxpool.Config) {})
	st := e.newStore(work, nil)
	ctx := e.ctx
	ok := func(context.Context, pgx.Tx, *dedup.Message) error { return nil }
	want := 0 // updates at least

	// Lease mode: the claim commits PROCESSING, the completion marks
	// SUCCEEDED (status, expires_at).
	const leased = 40
	for i := range leased {
		res, err := st.ProcessLeased(ctx, e.msg(fmt.Sprintf("lease-%d", i), "", "x"), func(context.Context, *dedup.Message) error { return nil },
			dedup.LeaseOptions{TTL: time.Minute, DisableHeartbeat: true})
		if err != nil || res.Outcome != dedup.OutcomeProcessed {
			t.Fatalf("lease %d: %+v %v", i, res, err)
		}
	}
	want += leased

	// Batched mode (its marks, where the claim inserts PROCESSING).
	batch := make([]*dedup.Message, 20)
	for i := range batch {
		batch[i] = e.msg(fmt.Sprintf("batch-%d", i), "", "x")
	}
	if res, err := st.ProcessBatch(ctx, batch, ok); err != nil || res[0].Outcome != dedup.OutcomeProcessed {
		t.Fatalf("batch: %+v %v", res, err)
	}

	// Atomic mode, a retry: marked FAILED_RETRYABLE, then reclaimed and
	// marked SUCCEEDED (expires_at set) in the second run.
	flaky := e.msg("retry-1", "", "x")
	if res, err := st.Process(ctx, flaky, func(context.Context, pgx.Tx, *dedup.Message) error { return errors.New("not yet") }); err != nil || res.Outcome != dedup.OutcomeRetry {
		t.Fatalf("first run: %+v %v", res, err)
	}
	if res, err := st.Process(ctx, flaky, ok); err != nil || res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("second run: %+v %v", res, err)
	}
	want += 2

	// A final failure (expires_at set) of a record that exists, then its
	// re-drive (expires_at cleared).
	poison := e.msg("final-1", "", "x")
	if res, err := st.Process(ctx, poison, func(context.Context, pgx.Tx, *dedup.Message) error { return errors.New("not yet") }); err != nil || res.Outcome != dedup.OutcomeRetry {
		t.Fatalf("poison first run: %+v %v", res, err)
	}
	if res, err := st.Process(ctx, poison, func(context.Context, pgx.Tx, *dedup.Message) error { return dedup.Permanent(errors.New("bad")) }); err != nil || res.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("poison second run: %+v %v", res, err)
	}
	if err := st.Redrive(ctx, e.scope, "final-1"); err != nil {
		t.Fatal(err)
	}
	want += 2

	work.Close() // the backends exit and hand over their statistics
	var upd, hot int64
	deadline := time.Now().Add(time.Minute)
	for {
		if err := e.pool.QueryRow(ctx, `select n_tup_upd, n_tup_hot_upd from pg_stat_user_tables where relid = $1::regclass`, e.records()).Scan(&upd, &hot); err != nil {
			t.Fatal(err)
		}
		if upd >= int64(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if upd < int64(want) {
		t.Fatalf("%d updates counted after a minute, want at least %d", upd, want)
	}
	t.Logf("%d updates, %d HOT", upd, hot)
	if hot != upd {
		t.Fatalf("%d of %d record updates were HOT, want all", hot, upd)
	}
}
