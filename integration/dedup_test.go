package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
)

// msg builds a delivery with a normalized identity.
func msg(t testing.TB, scope, messageID, businessKey, payload string) *dedup.Message {
	t.Helper()
	id, err := dedup.NewIdentity(scope, messageID, "", businessKey)
	if err != nil {
		t.Fatal(err)
	}
	return &dedup.Message{Identity: id, Payload: []byte(payload), Topic: "payments", Source: "test:" + messageID, Headers: map[string]string{wire.MessageIDHeader: messageID}}
}

// paymentsTable creates the business table the spy handlers write.
func (e *env) paymentsTable() string {
	tbl := e.table("payments")
	e.exec(`create table ` + tbl + ` (payment_id text primary key, amount bigint not null, order_no text unique)`)
	return tbl
}

// spy counts handler calls and inserts one payment per call.
type spy struct {
	calls atomic.Int64
	table string
	fail  func(call int64, m *dedup.Message) error
}

func (s *spy) handle(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
	n := s.calls.Add(1)
	if s.fail != nil {
		if err := s.fail(n, m); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `insert into `+s.table+` (payment_id, amount) values ($1, $2)`, m.Identity.MessageID, len(m.Payload))
	return err
}

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
	t.Parallel()
	e := setup(t, nil)
	tbl := e.table("orders")
	e.exec(`create table ` + tbl + ` (message_id text primary key, order_no text not null)`)
	e.exec(`alter table ` + tbl + ` add constraint orders_order_no_key unique (order_no)`)
	tracer := &pgErrors{}
	cfg, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.Tracer = tracer
	one, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(one.Close)
	st, err := pgstore.New(one, pgstore.Config{Schema: e.schema, Fingerprinter: testFingerprinter(t)})
	if err != nil {
		t.Fatal(err)
	}
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
	if res, err := st.Process(e.ctx, msg(t, "orders", "m-10", "", "ord-1"), ok); err != nil || res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("first: %+v %v", res, err)
	}
	// (a) redelivery of a SUCCEEDED message: no statement fails at all (so
	// no 25P02), the handler is not called, and the same pooled connection
	// answers the next query.
	for range 5 {
		res, err := st.Process(e.ctx, msg(t, "orders", "m-10", "", "ord-1"), ok)
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
	check := func(part, id string, h pgstore.Handler) {
		t.Helper()
		res, err := st.Process(e.ctx, msg(t, "orders", id, "", "ord-1"), h)
		if err != nil || res.Outcome != dedup.OutcomeRetry || res.Outcome.Acked() || !pgstore.IsUniqueViolation(res.Err, constraint) {
			t.Fatalf("(%s): %+v %v", part, res, err)
		}
		r, err := st.Lookup(e.ctx, "orders", id)
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
func TestS04ZombieConsumer(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	tbl := e.paymentsTable()
	calls := atomic.Int64{}
	slow := func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
		calls.Add(1)
		if _, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ('p-500', 1)`); err != nil {
			return err
		}
		time.Sleep(6 * time.Second)
		return nil
	}
	type outcome struct {
		res dedup.Result
		err error
	}
	first := make(chan outcome, 1)
	go func() {
		res, err := e.store.Process(e.ctx, msg(t, "payments", "m-500", "", "x"), slow)
		first <- outcome{res, err}
	}()
	time.Sleep(4 * time.Second)
	res, err := e.store.Process(e.ctx, msg(t, "payments", "m-500", "", "x"), slow)
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
	r := e.record("payments", "m-500")
	if r.Status != dedup.StatusSucceeded || r.Attempts != 1 || r.LastError != "" || r.LastErrorClass != "" {
		t.Fatalf("record = %+v, want SUCCEEDED attempts 1 with no failure ever written", r)
	}
}

// A handler that swallows a statement error (leaving the transaction
// aborted) or whose writes break a deferred constraint at commit has failed:
// the commit is refused, nothing is applied, and the failure is marked; it
// is never retried forever as an infrastructure error nor acked.
func TestCommitRefusedIsAHandlerFailure(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
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
		h  pgstore.Handler
	}{{"m-swallow", swallow}, {"m-deferred", deferred}} {
		res, err := e.store.Process(e.ctx, msg(t, "ledger", c.id, "", "x"), c.h)
		if err != nil || res.Outcome != dedup.OutcomeRetry || !res.HandlerCalled || res.Attempts != 1 {
			t.Fatalf("%s: %+v %v, want a retryable handler failure on attempt 1", c.id, res, err)
		}
		r := e.record("ledger", c.id)
		if r.Status != dedup.StatusFailedRetryable || r.Attempts != 1 || !strings.Contains(r.LastError, "commit refused") {
			t.Fatalf("%s record = %+v", c.id, r)
		}
	}
	if r := e.record("ledger", "m-deferred"); r.LastErrorClass != "pg:23505:ledger_ref_key" {
		t.Fatalf("deferred violation class = %q, want pg:23505:ledger_ref_key", r.LastErrorClass)
	}
	if n := e.count(`select count(*) from ` + tbl); n != 1 {
		t.Fatalf("ledger rows = %d, want only the seed", n)
	}
}
