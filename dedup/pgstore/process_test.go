package pgstore

// Store-level tests of the atomic and batched modes on Postgres (moved here
// from the integration module: they need Postgres only). The harness is in
// env_test.go.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgErrors is a pgx QueryTracer that records the SQLSTATE of every failed
// statement on its connections.
type pgErrors struct {
	mu    sync.Mutex
	codes []string
}

func (p *pgErrors) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (p *pgErrors) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	var pgErr *pgconn.PgError
	if errors.As(d.Err, &pgErr) {
		p.mu.Lock()
		p.codes = append(p.codes, pgErr.Code)
		p.mu.Unlock()
	}
}

func (p *pgErrors) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.codes...)
}

// S10: unique violations inside the transaction. The store runs on a pool of
// one connection whose every failed statement is recorded, so "no 25P02
// anywhere" and "the pooled connection works for the next query" are
// checked on the very connection that saw the duplicates.
func TestS10UniqueViolations(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("orders")
	e.exec(`create table ` + tbl + ` (message_id text primary key, order_no text not null)`)
	e.exec(`alter table ` + tbl + ` add constraint orders_order_no_key unique (order_no)`)
	tracer := &pgErrors{}
	one := e.newPool(func(c *pgxpool.Config) { c.MaxConns, c.ConnConfig.Tracer = 1, tracer })
	st := e.newStore(one, nil)
	var connPID uint32
	if err := one.AcquireFunc(e.ctx, func(c *pgxpool.Conn) error { connPID = c.Conn().PgConn().PID(); return nil }); err != nil {
		t.Fatal(err)
	}

	calls := atomic.Int64{}
	ok := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		calls.Add(1)
		_, err := tx.Exec(ctx, `insert into `+tbl+` (message_id, order_no) values ($1, $2)`, m.Identity.MessageID, string(m.Payload))
		return err
	}
	if res, err := st.Process(e.ctx, e.msg("m-10", "", "ord-1"), ok); err != nil || res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("first: %+v %v", res, err)
	}
	// (a) redelivery of a SUCCEEDED message: no statement fails at all (so
	// no 25P02), the handler is not called, and the same pooled connection
	// answers the next query.
	for range 5 {
		res, err := st.Process(e.ctx, e.msg("m-10", "", "ord-1"), ok)
		if err != nil || res.Outcome != dedup.OutcomeDuplicate || res.MatchedBy != dedup.ByMessageID {
			t.Fatalf("(a) redelivery: %+v %v", res, err)
		}
	}
	if codes := tracer.seen(); len(codes) != 0 {
		t.Fatalf("(a) failed statements during redelivery: SQLSTATEs %v", codes)
	}
	var pid uint32
	var n int
	if err := one.AcquireFunc(e.ctx, func(c *pgxpool.Conn) error {
		pid = c.Conn().PgConn().PID()
		return c.QueryRow(e.ctx, `select count(*) from `+tbl).Scan(&n)
	}); err != nil || pid != connPID || n != 1 {
		t.Fatalf("(a) next query on the pooled connection: pid %d (was %d), rows %d, err %v", pid, connPID, n, err)
	}
	if calls.Load() != 1 {
		t.Fatalf("(a) handler calls = %d", calls.Load())
	}
	const constraint = "orders_order_no_key"
	// (b) a new message whose handler violates the business table's unique
	// constraint: a handler failure, FAILED_RETRYABLE naming the constraint,
	// never acked as a duplicate.
	check := func(part, id string, h Handler) {
		t.Helper()
		res, err := st.Process(e.ctx, e.msg(id, "", "ord-1"), h)
		if err != nil || res.Outcome != dedup.OutcomeRetry || res.Outcome.Acked() || !IsUniqueViolation(res.Err, constraint) {
			t.Fatalf("(%s): %+v %v", part, res, err)
		}
		r, err := st.Lookup(e.ctx, e.scope, id)
		if err != nil || r.Status != dedup.StatusFailedRetryable || r.LastErrorClass != "pg:23505:"+constraint || !strings.Contains(r.LastError, constraint) {
			t.Fatalf("(%s) record = %+v %v", part, r, err)
		}
	}
	check("b", "m-11", ok)
	// (c) the same error wrapped with %w classifies the same.
	check("c", "m-12", func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if err := ok(ctx, tx, m); err != nil {
			return fmt.Errorf("create order: %w", err)
		}
		return nil
	})
	for _, c := range tracer.seen() {
		if c == "25P02" {
			t.Fatalf("a statement ran in an aborted transaction (25P02): %v", tracer.seen())
		}
	}
	if err := one.QueryRow(e.ctx, "select count(*) from "+tbl).Scan(&n); err != nil || n != 1 {
		t.Fatalf("pool after violations: rows %d, %v", n, err)
	}
}

// S04: a zombie copy arrives while the first handler still holds its
// transaction; it waits on the record and ends as a duplicate, never a failure.
// The first handler holds its transaction until the zombie's backend is seen
// waiting on a lock (pg_stat_activity), or the zombie has returned.
func TestS04ZombieConsumer(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("payments")
	e.exec(`create table ` + tbl + ` (payment_id text primary key, amount bigint not null)`)
	calls := atomic.Int64{}
	holding := make(chan struct{}, 2)
	release := make(chan struct{})
	releaseFirst := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseFirst)
	slow := func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
		calls.Add(1)
		if _, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ('p-500', 1)`); err != nil {
			return err
		}
		holding <- struct{}{}
		<-release
		return nil
	}
	type outcome struct {
		res dedup.Result
		err error
	}
	first := make(chan outcome, 1)
	go func() {
		res, err := e.store.Process(e.ctx, e.msg("m-500", "", "x"), slow)
		first <- outcome{res, err}
	}()
	<-holding // the first copy's transaction holds the record and the payment
	// The zombie runs on a pool of its own, named so that its backend can be
	// told from other tests' in pg_stat_activity.
	app := "s04_zombie_" + randomHex(4)
	zombieStore := e.newStore(e.newPool(func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app }), nil)
	second := make(chan outcome, 1)
	go func() {
		res, err := zombieStore.Process(e.ctx, e.msg("m-500", "", "x"), slow)
		second <- outcome{res, err}
	}()
	var z outcome
	zombieDone := false
	e.eventually("the zombie copy to wait on the first copy's lock (or to return)", func() bool {
		select {
		case z = <-second:
			zombieDone = true
			return true
		default:
		}
		return e.lockWaiters(app) > 0
	})
	releaseFirst()
	if !zombieDone {
		z = <-second
	}
	res, err := z.res, z.err
	f := <-first
	if f.err != nil || f.res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("first copy: %+v %v", f.res, f.err)
	}
	if err != nil || res.Outcome != dedup.OutcomeDuplicate || res.HandlerCalled {
		t.Fatalf("zombie copy: %+v %v, want a duplicate without handler call", res, err)
	}
	if calls.Load() != 1 || e.count(`select count(*) from `+tbl) != 1 {
		t.Fatalf("calls %d rows %d, want 1 and 1", calls.Load(), e.count(`select count(*) from `+tbl))
	}
	r := e.record("m-500")
	if r.Status != dedup.StatusSucceeded || r.Attempts != 1 || r.LastError != "" || r.LastErrorClass != "" {
		t.Fatalf("record = %+v, want SUCCEEDED attempts 1 with no failure ever written", r)
	}
}

// A handler that swallows a statement error (leaving the transaction
// aborted) or whose writes break a deferred constraint at commit has failed:
// the commit is refused, nothing is applied, and the failure is marked; it
// is never retried forever as an infrastructure error nor acked.
func TestCommitRefusedIsAHandlerFailure(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("ledger")
	e.exec(`create table ` + tbl + ` (id text primary key, ref text, constraint ledger_ref_key unique (ref) deferrable initially deferred)`)
	e.exec(`insert into ` + tbl + ` values ('seed', 'taken')`)
	swallow := func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
		_, _ = tx.Exec(ctx, `insert into `+tbl+` values ('seed', 'x')`) // duplicate key, error ignored
		return nil
	}
	deferred := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		_, err := tx.Exec(ctx, `insert into `+tbl+` values ($1, 'taken')`, m.Identity.MessageID) // fails only at commit
		return err
	}
	for _, c := range []struct {
		id string
		h  Handler
	}{{"m-swallow", swallow}, {"m-deferred", deferred}} {
		res, err := e.store.Process(e.ctx, e.msg(c.id, "", "x"), c.h)
		if err != nil || res.Outcome != dedup.OutcomeRetry || !res.HandlerCalled || res.Attempts != 1 {
			t.Fatalf("%s: %+v %v, want a retryable handler failure on attempt 1", c.id, res, err)
		}
		r := e.record(c.id)
		if r.Status != dedup.StatusFailedRetryable || r.Attempts != 1 {
			t.Fatalf("%s record = %+v", c.id, r)
		}
	}
	// The swallowed statement is recorded as the cause (S32).
	if r := e.record("m-swallow"); r.LastErrorClass != "pg:23505:ledger_pkey" || !strings.Contains(r.LastError, "left the transaction aborted") || !strings.Contains(r.LastError, "duplicate key value") {
		t.Fatalf("swallowed violation: class %q error %q, want pg:23505:ledger_pkey with the handler's failed statement", r.LastErrorClass, r.LastError)
	}
	if r := e.record("m-deferred"); !strings.Contains(r.LastError, "commit refused") {
		t.Fatalf("deferred violation error = %q, want the refused commit", r.LastError)
	}
	if r := e.record("m-deferred"); r.LastErrorClass != "pg:23505:ledger_ref_key" {
		t.Fatalf("deferred violation class = %q, want pg:23505:ledger_ref_key", r.LastErrorClass)
	}
	if n := e.count(`select count(*) from ` + tbl); n != 1 {
		t.Fatalf("ledger rows = %d, want only the seed", n)
	}
}

// Batched atomic mode: one transaction, a savepoint per message; a failing
// message rolls back alone; processing stops at the first retry so order
// holds.
func TestProcessBatchSavepointsAndOrder(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("orders")
	e.exec(`create table ` + tbl + ` (message_id text primary key, order_no text unique)`)
	e.exec(`insert into ` + tbl + ` values ('seed', 'ord-taken')`)
	calls := map[string]int{}
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		calls[m.Identity.MessageID]++
		if m.Identity.MessageID == "m-B" {
			if _, err := tx.Exec(ctx, `insert into `+tbl+` values ('m-B', 'ord-B')`); err != nil {
				return err
			}
			return dedup.Permanent(errors.New("rejected after a write"))
		}
		_, err := tx.Exec(ctx, `insert into `+tbl+` values ($1, $2)`, m.Identity.MessageID, string(m.Payload))
		return err
	}
	batch := []*dedup.Message{
		e.msg("m-A", "", "ord-A"),
		e.msg("m-B", "", "ord-B"),
		e.msg("m-A", "", "ord-A"),     // same message again in the batch
		e.msg("m-C", "", "ord-taken"), // unique violation on the business table: retryable
		e.msg("m-D", "", "ord-D"),     // after the retry: not attempted
	}
	res, err := e.store.ProcessBatch(e.ctx, batch, h)
	if err != nil {
		t.Fatal(err)
	}
	want := []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeDeadLetter, dedup.OutcomeDuplicate, dedup.OutcomeRetry, ""}
	for i, w := range want {
		if res[i].Outcome != w {
			t.Fatalf("result %d = %+v, want %q", i, res[i], w)
		}
	}
	if calls["m-A"] != 1 || calls["m-B"] != 1 || calls["m-C"] != 1 || calls["m-D"] != 0 {
		t.Fatalf("handler calls = %v", calls)
	}
	if n := e.count(`select count(*) from ` + tbl + ` where message_id in ('m-A','m-B','m-C','m-D')`); n != 1 {
		t.Fatalf("business rows = %d, want 1 (only m-A; m-B rolled back to its savepoint)", n)
	}
	if r := e.record("m-C"); r.Status != dedup.StatusFailedRetryable || r.Attempts != 1 || r.LastErrorClass != "pg:23505:orders_order_no_key" {
		t.Fatalf("m-C record = %+v", r)
	}
	if r := e.record("m-B"); r.Status != dedup.StatusFailedFinal || len(e.deadLetters()) != 1 {
		t.Fatalf("m-B record = %+v", r)
	}
	if _, err := e.store.Lookup(e.ctx, e.scope, "m-D"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("m-D has a record although it was not attempted: %v", err)
	}
}

// Store.MarkStart against Postgres, with deaths simulated by a marker that
// is never followed by the run's transaction (as when the process dies
// inside the handler: Postgres rolls the claim back). MaxAttempts 3.
func TestStartMarkerCountsRunsThatDied(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxAttempts = 3 })
	ctx := e.ctx
	mark := func(id, bk, payload string) dedup.StartMark {
		t.Helper()
		m, err := e.store.MarkStart(ctx, e.msg(id, bk, payload))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	ok := func(context.Context, pgx.Tx, *dedup.Message) error { return nil }
	fail := func(context.Context, pgx.Tx, *dedup.Message) error { return errors.New("transient") }

	// A new identity: a FAILED_RETRYABLE record with no attempt, marked.
	if m := mark("big-1", "", "p"); !m.Run {
		t.Fatalf("first marker: %+v", m)
	}
	if r := e.record("big-1"); r.Status != dedup.StatusFailedRetryable || r.Attempts != 0 {
		t.Fatalf("after the first marker: %+v", r)
	}
	// The run died: the next marker counts it (attempt 1), class process_died.
	if m := mark("big-1", "", "p"); !m.Run {
		t.Fatalf("second marker: %+v", m)
	}
	if r := e.record("big-1"); r.Attempts != 1 || r.LastErrorClass != "process_died" {
		t.Fatalf("after one death: %+v", r)
	}
	// It died again: attempt 2, plus the unmarked first run = 3 = MaxAttempts.
	m := mark("big-1", "", "p")
	if m.Run || m.Result.Outcome != dedup.OutcomeDeadLetter || m.Result.Attempts != 3 || m.Result.Status != dedup.StatusFailedFinal ||
		!errors.Is(m.Result.Err, dedup.ErrExecutionLost) || m.Result.DeadLetterID == 0 {
		t.Fatalf("third marker: %+v; want a dead letter after 3 starts, no run", m)
	}
	if r := e.record("big-1"); r.Status != dedup.StatusFailedFinal || r.Attempts != 3 || r.LastErrorClass != "attempts_exhausted" {
		t.Fatalf("record after exhaustion: %+v", r)
	}
	// A final record is left alone; a re-drive allows one more run.
	if m := mark("big-1", "", "p"); !m.Run {
		t.Fatalf("marker on a final record: %+v; want Run (Process reports the duplicate)", m)
	}
	if err := e.store.Redrive(ctx, e.scope, "big-1"); err != nil {
		t.Fatal(err)
	}
	if m := mark("big-1", "", "p"); !m.Run {
		t.Fatalf("marker after a re-drive: %+v; want Run", m)
	}
	if res, err := e.store.Process(ctx, e.msg("big-1", "", "p"), ok); err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 4 {
		t.Fatalf("run after a re-drive: %+v %v", res, err)
	}

	// Runs that reach an outcome are not deaths; a withdrawn marker is not
	// either.
	mark("big-2", "", "p")
	if res, err := e.store.Process(ctx, e.msg("big-2", "", "p"), fail); err != nil || res.Outcome != dedup.OutcomeRetry || res.Attempts != 1 {
		t.Fatalf("failed run: %+v %v", res, err)
	}
	m = mark("big-2", "", "p")
	if err := e.store.ClearStart(ctx, m); err != nil {
		t.Fatal(err)
	}
	mark("big-2", "", "p")
	if r := e.record("big-2"); r.Status != dedup.StatusFailedRetryable || r.Attempts != 1 || r.LastErrorClass == "process_died" {
		t.Fatalf("after a failed run and a withdrawn marker: %+v; want attempts 1, no death counted", r)
	}

	// With MaxAttempts 1 the unmarked first run alone never dead-letters: a
	// delivery that may never have run gets its run.
	one := e.newStore(e.pool, func(c *Config) { c.MaxAttempts = 1 })
	if m, err := one.MarkStart(ctx, e.msg("big-3", "", "p")); err != nil || !m.Run {
		t.Fatalf("MaxAttempts 1, first marker: %+v %v", m, err)
	}

	// A business-key match marks the record it matches; a different payload
	// is left to Process (a conflict).
	if res, err := e.store.Process(ctx, e.msg("big-4", "order-4", "p"), fail); err != nil || res.Outcome != dedup.OutcomeRetry {
		t.Fatalf("%+v %v", res, err)
	}
	if m := mark("big-4-resend", "order-4", "p"); !m.Run {
		t.Fatalf("%+v", m)
	}
	if m := mark("big-4", "", "other payload"); !m.Run {
		t.Fatalf("%+v", m)
	}
	// The marked run died: attempt 2, plus the unmarked run that may have
	// died after attempt 1's failure = 3: the record it matched is final.
	if m := mark("big-4-resend", "order-4", "p"); m.Run || m.Result.MatchedBy != dedup.ByBusinessKey {
		t.Fatalf("%+v; want a dead letter matched by business key", m)
	}
	if r := e.record("big-4"); r.Status != dedup.StatusFailedFinal || r.Attempts != 3 {
		t.Fatalf("record matched by business key: %+v; want the death counted on it", r)
	}
	if n := e.count(`select count(*) from `+e.records()+` where scope = $1 and message_id = 'big-4-resend'`, e.scope); n != 0 {
		t.Fatalf("a marker created a second record for a business key")
	}
	if dls := e.deadLetters(); len(dls) != 2 || dls[0].MessageID != "big-1" || dls[1].MessageID != "big-4-resend" {
		t.Fatalf("dead letters = %+v, want big-1's and big-4-resend's", dls)
	}
}

// On a consumption-record table of 200,000 rows, with Postgres forced to use
// generic plans for prepared statements (what pgx's statement cache gets
// after a few executions), no store operation scans the table: claims,
// duplicates by message ID and by business key, lease claims and lookups all
// go through the unique indexes. A scan would make every duplicate cost a
// pass over the whole table.
func TestNoTableScanOnLargeRecordTable(t *testing.T) {
	e := newOwnSchemaEnv(t, nil) // its own table statistics
	rec := e.records()
	e.exec(`insert into `+rec+` (scope, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts, expires_at)
select $1, 'old-' || g, case when g % 2 = 0 then 'bk-' || g else '' end, '\x00'::bytea, 'k1', 'SUCCEEDED', 1, now() + interval '1 day'
from generate_series(1, 200000) g`, e.scope)
	e.exec(`analyze ` + rec)

	one := e.newPool(func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	})
	st := e.newStore(one, nil)
	seqScans := func() int64 {
		// Flush this backend's counters, then read them (shared stats).
		if _, err := one.Exec(e.ctx, `select pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := one.QueryRow(e.ctx, `select seq_scan from pg_stat_user_tables where schemaname = $1 and relname = 'consumption_records'`, e.schema).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := seqScans()
	noop := func(context.Context, pgx.Tx, *dedup.Message) error { return nil }
	for i := range 8 {
		id, bk := fmt.Sprintf("new-%d", i), fmt.Sprintf("nbk-%d", i)
		for _, m := range []*dedup.Message{
			e.msg(id, bk, "x"),                           // new
			e.msg(id, bk, "x"),                           // duplicate by message ID
			e.msg(id+"-resend", bk, "x"),                 // duplicate by business key
			e.msg(fmt.Sprintf("old-%d", 2*i+1), "", "y"), // conflict with a preloaded record
		} {
			if _, err := st.Process(e.ctx, m, noop); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := st.ProcessLeased(e.ctx, e.msg("lease-"+id, "lbk-"+id, "x"), func(context.Context, *dedup.Message) error { return nil }, dedup.LeaseOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Lookup(e.ctx, e.scope, id); err != nil {
			t.Fatal(err)
		}
		if _, err := st.LookupBusinessKey(e.ctx, e.scope, bk); err != nil {
			t.Fatal(err)
		}
	}
	if after := seqScans(); after != before {
		t.Fatalf("the store scanned the 200,000-row record table %d times (generic plans)", after-before)
	}
}
