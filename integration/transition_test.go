package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/transition"
	"github.com/jackc/pgx/v5"
)

// orderRules are the order life cycle of the transition tests:
// PENDING → PAID → SHIPPED, PENDING → CANCELLED.
var orderRules = append(transition.Path("PENDING", "PAID", "SHIPPED"), transition.Rule{From: "PENDING", To: "CANCELLED"})

// ordersTable creates the test's orders table (status text, or an enum
// type when enum) with an order_events table for the effects that must
// happen once per transition, and returns a Machine on it reading amount
// back.
func ordersTable(t *testing.T, e *env, enum bool) *transition.Machine {
	t.Helper()
	statusType := "text"
	if enum {
		e.exec(`create type ` + e.table("order_status") + ` as enum ('PENDING', 'PAID', 'SHIPPED', 'CANCELLED')`)
		statusType = e.table("order_status")
	}
	e.exec(`create table ` + e.table("orders") + ` (id text primary key, status ` + statusType +
		` not null default 'PENDING', version bigint not null default 0, amount numeric(12,2) not null)`)
	e.exec(`create table ` + e.table("order_events") + ` (id bigint generated always as identity primary key, order_id text not null, event text not null)`)
	m, err := transition.New(transition.Config{Table: pgx.Identifier{e.schema, "orders"}, Returning: []string{"amount"}, Rules: orderRules})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (e *env) newOrder(id, amount string) {
	e.t.Helper()
	e.exec(`insert into `+e.table("orders")+` (id, amount) values ($1, $2)`, id, amount)
}

func (e *env) order(id string) (status string, version int64) {
	e.t.Helper()
	if err := e.pool.QueryRow(e.ctx, `select status::text, version from `+e.table("orders")+` where id = $1`, id).Scan(&status, &version); err != nil {
		e.t.Fatalf("order %s: %v", id, err)
	}
	return status, version
}

// Legal transitions change the row once; a retry of an applied one is
// reported as already applied (no error, nothing written); illegal ones and
// stale versions are refused with their typed errors and change nothing; on
// a text and on an enum status column.
func TestTransitionRules(t *testing.T) {
	t.Parallel()
	for _, enum := range []bool{false, true} {
		t.Run(map[bool]string{false: "text", true: "enum"}[enum], func(t *testing.T) {
			t.Parallel()
			e := setup(t, nil)
			m := ordersTable(t, e, enum)
			ctx := e.ctx
			for _, id := range []string{"o-1", "o-2", "o-3", "o-4"} {
				e.newOrder(id, "30.00")
			}
			apply := func(id, to string, opts ...transition.Option) (transition.Result, error) {
				var amount string
				res, err := m.Apply(ctx, e.pool, id, to, append(opts, transition.Into(&amount))...)
				if err == nil && amount != "30.00" {
					t.Errorf("%s → %s: amount read back %q, want 30.00", id, to, amount)
				}
				return res, err
			}
			want := func(id, status string, version int64) {
				t.Helper()
				if s, v := e.order(id); s != status || v != version {
					t.Fatalf("order %s is %s at version %d, want %s at %d", id, s, v, status, version)
				}
			}

			// Legal, then its replay, then the next step.
			if res, err := apply("o-1", "PAID"); err != nil || !res.Changed || res.AlreadyApplied || res.Version != 1 || res.To != "PAID" {
				t.Fatalf("PENDING → PAID: %+v, %v", res, err)
			}
			for range 2 {
				if res, err := apply("o-1", "PAID"); err != nil || res.Changed || !res.AlreadyApplied || res.Version != 1 {
					t.Fatalf("PAID again: %+v, %v; want already applied at version 1", res, err)
				}
			}
			want("o-1", "PAID", 1)
			if res, err := apply("o-1", "SHIPPED"); err != nil || !res.Changed || res.Version != 2 {
				t.Fatalf("PAID → SHIPPED: %+v, %v", res, err)
			}

			// Illegal: SHIPPED → CANCELLED, and CANCELLED → PAID.
			_, err := apply("o-1", "CANCELLED")
			var illegal *transition.IllegalTransitionError
			if !errors.As(err, &illegal) || !errors.Is(err, transition.ErrIllegalTransition) || illegal.Status != "SHIPPED" || illegal.Version != 2 || illegal.To != "CANCELLED" {
				t.Fatalf("SHIPPED → CANCELLED: %v, want an IllegalTransitionError from SHIPPED at version 2", err)
			}
			want("o-1", "SHIPPED", 2)
			if _, err := apply("o-2", "CANCELLED"); err != nil {
				t.Fatal(err)
			}
			if _, err := apply("o-2", "PAID"); !errors.Is(err, transition.ErrIllegalTransition) {
				t.Fatalf("CANCELLED → PAID: %v, want ErrIllegalTransition", err)
			}
			want("o-2", "CANCELLED", 1)

			// Optimistic lock: a stale version is refused; the right one
			// applies; the same call again is already applied; a version
			// that is neither is stale even though the status matches.
			_, err = apply("o-3", "PAID", transition.IfVersion(5))
			var stale *transition.StaleVersionError
			if !errors.As(err, &stale) || !errors.Is(err, transition.ErrStaleVersion) || stale.Version != 0 || stale.Want != 5 {
				t.Fatalf("PAID if version 5 (it is 0): %v, want a StaleVersionError", err)
			}
			want("o-3", "PENDING", 0)
			if res, err := apply("o-3", "PAID", transition.IfVersion(0)); err != nil || !res.Changed || res.Version != 1 {
				t.Fatalf("PAID if version 0: %+v, %v", res, err)
			}
			if res, err := apply("o-3", "PAID", transition.IfVersion(0)); err != nil || !res.AlreadyApplied || res.Version != 1 {
				t.Fatalf("PAID if version 0, again: %+v, %v; want already applied", res, err)
			}
			if _, err := apply("o-3", "PAID", transition.IfVersion(3)); !errors.Is(err, transition.ErrStaleVersion) {
				t.Fatalf("PAID if version 3 (PAID at 1): %v, want ErrStaleVersion", err)
			}
			if _, err := apply("o-3", "CANCELLED", transition.IfVersion(1)); !errors.Is(err, transition.ErrIllegalTransition) {
				t.Fatalf("PAID → CANCELLED at the right version: %v, want ErrIllegalTransition", err)
			}
			want("o-3", "PAID", 1)

			// No such row.
			if _, err := apply("o-missing", "PAID"); !errors.Is(err, transition.ErrNotFound) {
				t.Fatalf("no such order: %v, want ErrNotFound", err)
			}

			// In the caller's transaction: rolled back, nothing happened.
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if res, err := m.Apply(ctx, tx, "o-4", "CANCELLED", transition.Into(new(string))); err != nil || !res.Changed {
				t.Fatalf("in a transaction: %+v, %v", res, err)
			}
			_ = tx.Rollback(ctx)
			want("o-4", "PENDING", 0)

			st := m.Stats()
			if c := st["PAID"]; c.Applied != 2 || c.AlreadyApplied != 3 || c.Illegal != 1 || c.StaleVersion != 2 || c.NotFound != 1 {
				t.Errorf("PAID counts = %+v", c)
			}
			if c := st["CANCELLED"]; c.Applied != 2 || c.Illegal != 2 {
				t.Errorf("CANCELLED counts = %+v", c)
			}
		})
	}
}

// payCallback applies PENDING → PAID for orderID in its own transaction and
// records a "paid" event only when this call changed the order: the effect
// that must happen once per payment.
func payCallback(ctx context.Context, e *env, m *transition.Machine, orderID string) (transition.Result, error) {
	var res transition.Result
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		var err error
		if res, err = m.Apply(ctx, tx, orderID, "PAID", transition.Into(new(string))); err != nil || !res.Changed {
			return err
		}
		_, err = tx.Exec(ctx, `insert into `+e.table("order_events")+` (order_id, event) values ($1, 'paid')`, orderID)
		return err
	})
	return res, err
}

// 20 identical provider callbacks at once (PENDING → PAID, each in its own
// transaction): the order changes once (version 0 → 1), one callback is
// told it changed it, the 19 others that it was already applied, and the
// once-only effect exists once. Five orders, so a lucky interleaving cannot
// pass.
func TestTransitionConcurrentCallbacks(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	m := ordersTable(t, e, false)
	for o := range 5 {
		id := fmt.Sprintf("o-%d", o)
		e.newOrder(id, "30.00")
		var wg sync.WaitGroup
		start := make(chan struct{})
		results := make([]transition.Result, 20)
		errs := make([]error, 20)
		for i := range results {
			wg.Go(func() {
				<-start
				results[i], errs[i] = payCallback(e.ctx, e, m, id)
			})
		}
		close(start)
		wg.Wait()
		changed, already := 0, 0
		for i, res := range results {
			switch {
			case errs[i] != nil:
				t.Fatalf("callback %d: %v", i, errs[i])
			case res.Changed:
				changed++
			case res.AlreadyApplied:
				already++
			}
		}
		if changed != 1 || already != 19 {
			t.Fatalf("order %s: %d callbacks changed it, %d already applied; want 1 and 19", id, changed, already)
		}
		if s, v := e.order(id); s != "PAID" || v != 1 {
			t.Fatalf("order %s is %s at version %d, want PAID at 1", id, s, v)
		}
		if n := e.count(`select count(*) from `+e.table("order_events")+` where order_id = $1`, id); n != 1 {
			t.Fatalf("order %s: %d paid events, want 1", id, n)
		}
	}
}

// A payment provider delivers its callback three times (the provider's
// retries carry new event IDs, so no message or request ID dedups them):
// the order changes once, through an HTTP handler (net/http, a real
// server) and through a Kafka consumer under idemq (pgstore, the handler's
// transaction) alike.
func TestTransitionProviderCallbackThreeTimes(t *testing.T) {
	t.Parallel()
	t.Run("http", func(t *testing.T) {
		t.Parallel()
		e := setup(t, nil)
		m := ordersTable(t, e, false)
		e.newOrder("o-http", "30.00")
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, err := payCallback(r.Context(), e, m, r.FormValue("order_id"))
			switch {
			case errors.Is(err, transition.ErrIllegalTransition):
				http.Error(w, err.Error(), http.StatusConflict)
			case err != nil:
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
			default:
				w.WriteHeader(http.StatusNoContent)
			}
		}))
		t.Cleanup(srv.Close)
		for i := range 3 {
			resp, err := http.PostForm(srv.URL, url.Values{"order_id": {"o-http"}, "event_id": {fmt.Sprintf("evt-%d", i)}})
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				t.Fatalf("delivery %d: %d %s", i+1, resp.StatusCode, body)
			}
		}
		if s, v := e.order("o-http"); s != "PAID" || v != 1 {
			t.Fatalf("order is %s at version %d, want PAID at 1", s, v)
		}
		if n := e.count(`select count(*) from ` + e.table("order_events")); n != 1 {
			t.Fatalf("%d paid events, want 1", n)
		}
		if c := m.Stats()["PAID"]; c.Applied != 1 || c.AlreadyApplied != 2 {
			t.Fatalf("PAID counts = %+v; want 1 applied, 2 already applied", c)
		}
	})
	t.Run("kafka", func(t *testing.T) {
		t.Parallel()
		e := setup(t, nil)
		m := ordersTable(t, e, false)
		e.newOrder("o-kafka", "30.00")
		topic, group := newTopic(t, 1), randomName("g-")
		produce(t, topic,
			kmsg{id: "evt-1", payload: "o-kafka"}, kmsg{id: "evt-2", payload: "o-kafka"}, kmsg{id: "evt-3", payload: "o-kafka"})
		handler := func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
			res, err := m.Apply(ctx, tx, string(msg.Payload), "PAID", transition.Into(new(string)))
			if err != nil || !res.Changed {
				return err
			}
			_, err = tx.Exec(ctx, `insert into `+e.table("order_events")+` (order_id, event) values ($1, 'paid')`, string(msg.Payload))
			return err
		}
		r := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: handler}, newSpySource(t, group, topic))
		waitCaughtUp(t, group, topic)
		r.stop(t)
		for _, id := range []string{"evt-1", "evt-2", "evt-3"} {
			if rec := e.record(group, id); rec.Status != dedup.StatusSucceeded {
				t.Fatalf("record %s: %+v, want SUCCEEDED", id, rec)
			}
		}
		if s, v := e.order("o-kafka"); s != "PAID" || v != 1 {
			t.Fatalf("order is %s at version %d, want PAID at 1", s, v)
		}
		if n := e.count(`select count(*) from ` + e.table("order_events")); n != 1 {
			t.Fatalf("%d paid events, want 1", n)
		}
	})
}

// s26Rules is S26's declared path NEW → AUTHORIZED → CAPTURED → SETTLED,
// with the branch AUTHORIZED → VOIDED that never reaches CAPTURED.
var s26Rules = append(transition.Path("NEW", "AUTHORIZED", "CAPTURED", "SETTLED"), transition.Rule{From: "AUTHORIZED", To: "VOIDED"})

// S26 through consumer.Run on a real Kafka topic and the Postgres store,
// MaxAttempts 3, in atomic, batched and lease mode: order o-26 is SETTLED
// (version 3) and the provider sends CAPTURED for it twice (c-1, c-2): each
// is already applied (no change, version 3) and processed at its first
// delivery, without a dead letter. A CAPTURED for o-26v, which is VOIDED
// and can never reach CAPTURED (c-3), is refused once: FAILED_FINAL at
// attempt 1 with a permanent_error dead letter, not retried.
func TestTransitionLateCallbackS26(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"atomic", "batched", "lease"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, func(c *pgstore.Config) { c.MaxAttempts = 3 })
			e.exec(`create table ` + e.table("payments26") + ` (id text primary key, status text not null, version bigint not null)`)
			e.exec(`insert into ` + e.table("payments26") + ` values ('o-26', 'SETTLED', 3), ('o-26v', 'VOIDED', 2)`)
			m, err := transition.New(transition.Config{Table: pgx.Identifier{e.schema, "payments26"}, Rules: s26Rules})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			calls := map[string]int{}
			results := map[string][]transition.Result{}
			apply := func(ctx context.Context, db transition.DB, msg *dedup.Message) error {
				res, err := m.Apply(ctx, db, string(msg.Payload), "CAPTURED")
				mu.Lock()
				calls[msg.Identity.MessageID]++
				results[msg.Identity.MessageID] = append(results[msg.Identity.MessageID], res)
				mu.Unlock()
				return err
			}
			topic, group := newTopic(t, 1), randomName("g-")
			cfg := consumer.Config{Scope: group, Store: e.store}
			switch mode {
			case "atomic":
				cfg.Handler = func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error { return apply(ctx, tx, msg) }
			case "batched":
				cfg.Handler = func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error { return apply(ctx, tx, msg) }
				cfg.BatchSize, cfg.BatchWait = 3, 200*time.Millisecond
			case "lease":
				cfg.LeaseHandler = func(ctx context.Context, msg *dedup.Message) error { return apply(ctx, e.pool, msg) }
			}
			var counters consumer.Counters
			cfg.Metrics = &counters
			produce(t, topic, kmsg{id: "c-1", payload: "o-26"}, kmsg{id: "c-2", payload: "o-26"}, kmsg{id: "c-3", payload: "o-26v"})
			r := startConsumer(t, cfg, newSpySource(t, group, topic))
			waitCaughtUp(t, group, topic)
			r.stop(t)

			for _, id := range []string{"c-1", "c-2"} {
				rec := e.record(group, id)
				if rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 {
					t.Fatalf("%s (CAPTURED on a SETTLED order) = %s at attempt %d (%s); want SUCCEEDED at attempt 1", id, rec.Status, rec.Attempts, rec.LastError)
				}
				mu.Lock()
				res := results[id]
				mu.Unlock()
				if last := res[len(res)-1]; !last.AlreadyApplied || last.Changed || last.Version != 3 {
					t.Fatalf("%s: Apply = %+v; want already applied at version 3", id, last)
				}
			}
			rec := e.record(group, "c-3")
			if rec.Status != dedup.StatusFailedFinal || rec.Attempts != 1 || rec.LastErrorClass != "permanent:error" {
				t.Fatalf("c-3 (CAPTURED on a VOIDED order) = %s at attempt %d, class %q; want FAILED_FINAL at attempt 1, class permanent:error", rec.Status, rec.Attempts, rec.LastErrorClass)
			}
			dls := e.deadLetters(group)
			if len(dls) != 1 || dls[0].MessageID != "c-3" || dls[0].Reason != dedup.ReasonPermanentError || dls[0].Attempts != 1 || !strings.Contains(dls[0].Error, "illegal transition VOIDED → CAPTURED") {
				t.Fatalf("dead letters = %+v; want one, c-3, permanent_error at attempt 1", dls)
			}
			if mode != "batched" { // batched: a failing batch is rerun one message per transaction
				mu.Lock()
				defer mu.Unlock()
				for _, id := range []string{"c-1", "c-2", "c-3"} {
					if calls[id] != 1 {
						t.Fatalf("handler calls = %v; want 1 each", calls)
					}
				}
			}
			for id, want := range map[string]string{"o-26": "SETTLED", "o-26v": "VOIDED"} {
				var status string
				var version int64
				if err := e.pool.QueryRow(e.ctx, `select status, version from `+e.table("payments26")+` where id = $1`, id).Scan(&status, &version); err != nil {
					t.Fatal(err)
				}
				if status != want || version != map[string]int64{"o-26": 3, "o-26v": 2}[id] {
					t.Fatalf("%s is %s at version %d; want %s unchanged", id, status, version, want)
				}
			}
			if counters.Get("retry") != 0 {
				t.Fatalf("counters = %v; want no retry", counters.Snapshot())
			}
		})
	}
}
