package pgstore

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
)

// The dead-letter tooling at a realistic volume, run by hand (not in the
// default suite):
//
//	IDEMQ_DEADLETTER_VOLUME=200000 go test -run TestDeadLetterVolume -v ./dedup/pgstore/
//
// It writes that many dead letters with 1 KiB payloads over 20 scopes (90%
// attempts exhausted with a FAILED_FINAL record, 10% payload conflicts),
// then times a full ScanDeadLetters walk (and its peak heap), a scope's
// walk, counts, a RedriveDeadLetters of every re-drivable one and a second,
// idempotent run, and checks that a scope's page is an index scan of
// (scope, id).
func TestDeadLetterVolume(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("IDEMQ_DEADLETTER_VOLUME"))
	if n <= 0 {
		t.Skip("set IDEMQ_DEADLETTER_VOLUME (e.g. 200000) to measure the dead-letter tooling at volume")
	}
	e := newOwnSchemaEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	e.ctx = ctx
	start := time.Now()
	e.exec(`insert into `+e.records()+` (scope, message_id, fingerprint, fingerprint_key_id, status, attempts, expires_at)
		select 's' || (g % 20), 'm-' || g, '\x01'::bytea, 'k1', 'FAILED_FINAL', 5, now() + interval '30 days'
		from generate_series(1, $1::int) g where g % 10 <> 0`, n)
	e.exec(`insert into `+e.dl()+` (scope, message_id, reason, error, error_class, attempts, topic, message_key, payload, headers, source, created_at)
		select 's' || (g % 20), 'm-' || g, case when g % 10 = 0 then 'payload_conflict' else 'attempts_exhausted' end,
		  'handler: boom', 'error', 5, 'orders', convert_to('key-' || g, 'UTF8'),
		  convert_to(rpad(g::text, 1024, 'x'), 'UTF8'), jsonb_build_object('message-id', 'm-' || g), 'kafka:orders/0/' || g,
		  now() - make_interval(secs => ($1::int - g) * 0.5)
		from generate_series(1, $1::int) g`, n)
	e.exec(`vacuum analyze ` + e.dl())
	e.exec(`vacuum analyze ` + e.records())
	t.Logf("seeded %d dead letters (1 KiB payloads) and %d records in %s; table %s", n, n-n/10, time.Since(start).Round(time.Millisecond),
		e.str(`select pg_size_pretty(pg_total_relation_size('`+e.dl()+`'))`))

	// A scope's page walks the (scope, id) index.
	args := []any{int64(1000), 1000}
	where := deadLetterWhere(dedup.DeadLetterFilter{Scope: "s3"}, &args)
	plan := e.plan(`select d.id from `+e.dl()+` d where d.id > $1 and `+where+` order by d.id limit $2`, args...)
	if !strings.Contains(plan, "dead_letters_scope_id_idx") {
		t.Fatalf("a scope's page does not use the (scope, id) index:\n%s", plan)
	}

	walk := func(f dedup.DeadLetterFilter) (int, time.Duration, uint64) {
		t.Helper()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		base, peak := ms.HeapAlloc, ms.HeapAlloc
		got := 0
		t0 := time.Now()
		for {
			page, err := e.store.ScanDeadLetters(e.ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
			if len(page) == 0 {
				break
			}
			got += len(page)
			f.AfterID = page[len(page)-1].ID
		}
		return got, time.Since(t0), peak - base
	}
	got, d, peak := walk(dedup.DeadLetterFilter{Limit: 1000})
	if got != n {
		t.Fatalf("full walk read %d, want %d", got, n)
	}
	t.Logf("ScanDeadLetters full walk, pages of 1000: %d dead letters in %s (%.0f/s), peak heap above baseline %.1f MiB",
		got, d.Round(time.Millisecond), float64(got)/d.Seconds(), float64(peak)/(1<<20))
	got, d, peak = walk(dedup.DeadLetterFilter{Scope: "s7", Limit: 1000})
	t.Logf("ScanDeadLetters one scope (1/20), pages of 1000: %d in %s, peak heap %.1f MiB", got, d.Round(time.Millisecond), float64(peak)/(1<<20))
	got, d, _ = walk(dedup.DeadLetterFilter{Reason: dedup.ReasonPayloadConflict, Limit: 1000})
	t.Logf("ScanDeadLetters by reason (10%%, primary-key walk): %d in %s", got, d.Round(time.Millisecond))

	t0 := time.Now()
	c, err := e.store.CountDeadLetters(e.ctx, dedup.DeadLetterFilter{})
	if err != nil || c != int64(n) {
		t.Fatalf("count: %d, %v", c, err)
	}
	t.Logf("CountDeadLetters all: %d in %s", c, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	if c, err = e.store.CountDeadLetters(e.ctx, dedup.DeadLetterFilter{Scope: "s7"}); err != nil {
		t.Fatal(err)
	}
	t.Logf("CountDeadLetters one scope: %d in %s", c, time.Since(t0).Round(time.Millisecond))

	t0 = time.Now()
	dry, err := e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{}, dedup.RedriveOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RedriveDeadLetters dry run: %+v in %s", dry, time.Since(t0).Round(time.Millisecond))
	steps := 0
	t0 = time.Now()
	sum, err := e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{}, dedup.RedriveOptions{Progress: func(int64, int64) { steps++ }})
	if err != nil || sum.Redriven != int64(n-n/10) || sum.Matched != int64(n) {
		t.Fatalf("re-drive: %+v, %v", sum, err)
	}
	d = time.Since(t0)
	t.Logf("RedriveDeadLetters (batch 500): %+v in %s, %d steps, %.0f records/s", sum, d.Round(time.Millisecond), steps, float64(sum.Redriven)/d.Seconds())
	t0 = time.Now()
	again, err := e.store.RedriveDeadLetters(e.ctx, dedup.DeadLetterFilter{}, dedup.RedriveOptions{})
	if err != nil || again.Redriven != 0 {
		t.Fatalf("second re-drive: %+v, %v", again, err)
	}
	t.Logf("RedriveDeadLetters again (idempotent): %+v in %s", again, time.Since(t0).Round(time.Millisecond))
}

func (e *storeEnv) str(sql string, args ...any) string {
	e.t.Helper()
	var s string
	if err := e.pool.QueryRow(e.ctx, sql, args...).Scan(&s); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// plan is the EXPLAIN of sql with args, as text.
func (e *storeEnv) plan(sql string, args ...any) string {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx, "explain "+sql, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			e.t.Fatal(err)
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
