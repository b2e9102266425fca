package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// Batched atomic mode: one transaction, a savepoint per message; a failing
// message rolls back alone; processing stops at the first retry so order
// holds.
func TestProcessBatchSavepointsAndOrder(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
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
		msg(t, "orders", "m-A", "", "ord-A"),
		msg(t, "orders", "m-B", "", "ord-B"),
		msg(t, "orders", "m-A", "", "ord-A"),     // same message again in the batch
		msg(t, "orders", "m-C", "", "ord-taken"), // unique violation on the business table: retryable
		msg(t, "orders", "m-D", "", "ord-D"),     // after the retry: not attempted
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
	if r := e.record("orders", "m-C"); r.Status != dedup.StatusFailedRetryable || r.Attempts != 1 || r.LastErrorClass != "pg:23505:orders_order_no_key" {
		t.Fatalf("m-C record = %+v", r)
	}
	if r := e.record("orders", "m-B"); r.Status != dedup.StatusFailedFinal || len(e.deadLetters("orders")) != 1 {
		t.Fatalf("m-B record = %+v", r)
	}
	if _, err := e.store.Lookup(e.ctx, "orders", "m-D"); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("m-D has a record although it was not attempted: %v", err)
	}
}

// A batched Kafka consumer: duplicates, a transient failure retried ahead of
// newer messages, every message applied once, offsets committed to the end.
func TestKafkaBatchedConsumer(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	a := newApplier(e.appliesTable())
	failed := false
	a.fail = func(m *dedup.Message) error {
		if m.Identity.MessageID == "m-042" && !failed {
			failed = true
			return errors.New("transient")
		}
		return nil
	}
	topic, group := newTopic(t, 3), randomName("g-")
	var msgs []kmsg
	for i := range 150 {
		msgs = append(msgs, kmsg{id: fmt.Sprintf("m-%03d", i), payload: fmt.Sprint(i)})
		if i%5 == 0 {
			msgs = append(msgs, kmsg{id: fmt.Sprintf("m-%03d", i), payload: fmt.Sprint(i)})
		}
	}
	produce(t, topic, msgs...)
	var counters consumer.Counters
	r := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: a.handler(), Metrics: &counters,
		BatchSize: 20, BatchWait: 20 * time.Millisecond, CommitEvery: 50}, newSpySource(t, group, topic))
	waitCaughtUp(t, group, topic)
	r.stop(t)
	if n := e.count(`select count(distinct message_id) from ` + a.table); n != 150 {
		t.Fatalf("distinct applied = %d, want 150", n)
	}
	if n := e.count(`select count(*) from ` + a.table); n != 150 {
		t.Fatalf("rows = %d, want 150 (each once)", n)
	}
	if counters.Get("processed") != 150 || counters.Get("duplicate") != 30 || counters.Get("retry") != 1 {
		t.Fatalf("counters = %v", counters.Snapshot())
	}
	if rec := e.record(group, "m-042"); rec.Attempts != 2 || rec.Status != dedup.StatusSucceeded {
		t.Fatalf("m-042 = %+v, want SUCCEEDED after 2 attempts", rec)
	}
}
