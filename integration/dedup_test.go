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

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// msg builds a delivery with a normalized identity.
func msg(t testing.TB, scope, messageID, businessKey, payload string) *dedup.Message {
	t.Helper()
	id, err := dedup.NewIdentity(scope, messageID, "", businessKey)
	if err != nil {
		t.Fatal(err)
	}
	return &dedup.Message{Identity: id, Payload: []byte(payload), Topic: "payments", Source: "test:" + messageID, Headers: map[string]string{"message-id": messageID}}
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

func TestConcurrentCopiesApplyOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	s := &spy{table: e.paymentsTable()}
	var wg sync.WaitGroup
	results := make([]dedup.Result, 20)
	errs := make([]error, 20)
	start := make(chan struct{})
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = e.store.Process(e.ctx, msg(t, "payments", "m-1", "pay-1", `{"amount":10}`), s.handle)
		}()
	}
	close(start)
	wg.Wait()
	outcomes := map[dedup.Outcome]int{}
	for i := range 20 {
		if errs[i] != nil {
			t.Fatalf("copy %d: %v", i, errs[i])
		}
		outcomes[results[i].Outcome]++
	}
	if outcomes[dedup.OutcomeProcessed] != 1 || outcomes[dedup.OutcomeDuplicate] != 19 {
		t.Fatalf("outcomes = %v, want 1 processed and 19 duplicates", outcomes)
	}
	if got := s.calls.Load(); got != 1 {
		t.Fatalf("handler calls = %d, want 1", got)
	}
	if n := e.count(`select count(*) from ` + s.table); n != 1 {
		t.Fatalf("payments = %d, want 1", n)
	}
	r := e.record("payments", "m-1")
	if r.Status != dedup.StatusSucceeded || r.Attempts != 1 {
		t.Fatalf("record = %s attempts %d, want SUCCEEDED 1", r.Status, r.Attempts)
	}
	if n := e.count(`select count(*) from ` + e.table("consumption_records")); n != 1 {
		t.Fatalf("records = %d, want 1", n)
	}
}

func TestRetryTwiceThenSucceed(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	s := &spy{table: e.paymentsTable(), fail: func(n int64, _ *dedup.Message) error {
		if n <= 2 {
			return fmt.Errorf("provider timeout %d", n)
		}
		return nil
	}}
	var last dedup.Result
	for i := 1; i <= 3; i++ {
		res, err := e.store.Process(e.ctx, msg(t, "payments", "m-2", "", "x"), s.handle)
		if err != nil {
			t.Fatal(err)
		}
		want := dedup.OutcomeRetry
		if i == 3 {
			want = dedup.OutcomeProcessed
		}
		if res.Outcome != want || res.Attempts != i {
			t.Fatalf("try %d: outcome %s attempts %d, want %s %d", i, res.Outcome, res.Attempts, want, i)
		}
		last = res
	}
	r := e.record("payments", "m-2")
	if r.Status != dedup.StatusSucceeded || r.Attempts != 3 || last.Status != dedup.StatusSucceeded {
		t.Fatalf("record %s attempts %d, want SUCCEEDED 3", r.Status, r.Attempts)
	}
	if n := e.count(`select count(*) from ` + s.table); n != 1 {
		t.Fatalf("payments = %d, want 1", n)
	}
	if len(e.deadLetters("payments")) != 0 {
		t.Fatal("unexpected dead letter")
	}
}

func TestPermanentErrorDeadLettersOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	s := &spy{table: e.paymentsTable(), fail: func(int64, *dedup.Message) error {
		return dedup.Permanent(errors.New("address invalid"))
	}}
	res, err := e.store.Process(e.ctx, msg(t, "payments", "m-3", "", "x"), s.handle)
	if err != nil || res.Outcome != dedup.OutcomeDeadLetter || res.Status != dedup.StatusFailedFinal || res.DeadLetterID == 0 {
		t.Fatalf("res = %+v, err %v", res, err)
	}
	// Redelivery: acked as a duplicate of a final record, handler not called.
	res, err = e.store.Process(e.ctx, msg(t, "payments", "m-3", "", "x"), s.handle)
	if err != nil || res.Outcome != dedup.OutcomeDuplicate || res.Status != dedup.StatusFailedFinal || res.HandlerCalled {
		t.Fatalf("redelivery res = %+v, err %v", res, err)
	}
	if s.calls.Load() != 1 {
		t.Fatalf("handler calls = %d, want 1", s.calls.Load())
	}
	dl := e.deadLetters("payments")
	if len(dl) != 1 || dl[0].Reason != dedup.ReasonPermanentError || !strings.Contains(dl[0].Error, "address invalid") || string(dl[0].Payload) != "x" {
		t.Fatalf("dead letters = %+v", dl)
	}
	r := e.record("payments", "m-3")
	if r.Status != dedup.StatusFailedFinal || r.Attempts != 1 || !strings.Contains(r.LastError, "address invalid") {
		t.Fatalf("record = %+v", r)
	}
}

// S10: unique violations inside the transaction.
func TestS10UniqueViolations(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	tbl := e.paymentsTable()
	calls := atomic.Int64{}
	ok := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		calls.Add(1)
		_, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount, order_no) values ($1, 1, $2)`, m.Identity.MessageID, string(m.Payload))
		return err
	}
	if res, err := e.store.Process(e.ctx, msg(t, "orders", "m-10", "", "ord-1"), ok); err != nil || res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("first: %+v %v", res, err)
	}
	// (a) redelivery of a SUCCEEDED message: no 25P02, handler not called,
	// and the pooled connection works afterwards.
	for range 5 {
		res, err := e.store.Process(e.ctx, msg(t, "orders", "m-10", "", "ord-1"), ok)
		if err != nil || res.Outcome != dedup.OutcomeDuplicate || res.MatchedBy != dedup.ByMessageID {
			t.Fatalf("(a) redelivery: %+v %v", res, err)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("(a) handler calls = %d", calls.Load())
	}
	if n := e.count(`select count(*) from ` + tbl); n != 1 {
		t.Fatalf("(a) rows = %d", n)
	}
	constraint := "payments_order_no_key"
	// (b) a new message whose handler violates the business table's unique
	// constraint: a handler failure, FAILED_RETRYABLE naming the constraint.
	res, err := e.store.Process(e.ctx, msg(t, "orders", "m-11", "", "ord-1"), ok)
	if err != nil || res.Outcome != dedup.OutcomeRetry || !dedup.IsUniqueViolation(res.Err, constraint) {
		t.Fatalf("(b): %+v %v", res, err)
	}
	r := e.record("orders", "m-11")
	if r.Status != dedup.StatusFailedRetryable || r.LastErrorClass != "pg:23505:"+constraint || !strings.Contains(r.LastError, constraint) {
		t.Fatalf("(b) record = %+v", r)
	}
	// (c) the same error wrapped with %w classifies the same.
	wrapped := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if err := ok(ctx, tx, m); err != nil {
			return fmt.Errorf("create order: %w", err)
		}
		return nil
	}
	res, err = e.store.Process(e.ctx, msg(t, "orders", "m-12", "", "ord-1"), wrapped)
	if err != nil || res.Outcome != dedup.OutcomeRetry || res.Outcome == dedup.OutcomeDuplicate {
		t.Fatalf("(c): %+v %v", res, err)
	}
	if r := e.record("orders", "m-12"); r.Status != dedup.StatusFailedRetryable || r.LastErrorClass != "pg:23505:"+constraint {
		t.Fatalf("(c) record = %+v", r)
	}
	var one int
	if err := e.pool.QueryRow(e.ctx, "select 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("pool unusable after violations: %v", err)
	}
}

// S04: a zombie copy arrives while the first handler still holds its
// transaction; it waits on the record and ends as a duplicate, never a failure.
func TestS04ZombieConsumer(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	tbl := e.paymentsTable()
	calls := atomic.Int64{}
	slow := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
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
