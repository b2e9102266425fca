package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
)

// atCommit installs on table tbl (of the test's schema) a deferred
// constraint trigger, so it runs at COMMIT, after the handler returned: for
// each row of events ("insert", "update") where cond holds (SQL over NEW),
// the first n times (n < 0: every time), it runs action (PL/pgSQL). A
// sequence counts the firings: sequences are not rolled back, so the count
// survives the failed commits and the test is deterministic.
func (e *env) atCommit(tbl, name, events, cond, action string, n int) {
	e.t.Helper()
	seq, fn := e.table(name+"_seq"), e.table(name+"_fn")
	limit := "true"
	if n >= 0 {
		limit = "nextval('" + seq + "') <= " + strconv.Itoa(n)
	}
	e.exec(`create sequence ` + seq)
	e.exec(`create function ` + fn + `() returns trigger language plpgsql as $$
begin
  if (` + cond + `) and ` + limit + ` then
    ` + action + `;
  end if;
  return null;
end $$`)
	e.exec(`create constraint trigger ` + pgx.Identifier{name}.Sanitize() + ` after ` + events + ` on ` + tbl +
		` deferrable initially deferred for each row execute function ` + fn + `()`)
}

// killOwnBackend terminates the committing session itself: the client gets
// FATAL 57P01 "terminating connection due to administrator command" at
// COMMIT, and the transaction does not commit. Only the test's own backend
// is ever terminated.
const killOwnBackend = `perform pg_terminate_backend(pg_backend_pid())`

// raiseSQLState raises an error with the given SQLSTATE.
func raiseSQLState(code string) string {
	return `raise exception 'simulated SQLSTATE ` + code + ` at commit' using errcode = '` + code + `'`
}

// itemHandler inserts the payload as k into tbl through the handler's
// transaction, counting calls per message ID.
type itemHandler struct {
	tbl   string
	mu    sync.Mutex
	calls map[string]int
}

func newItemHandler(tbl string) *itemHandler { return &itemHandler{tbl: tbl, calls: map[string]int{}} }

func (h *itemHandler) handle(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
	h.mu.Lock()
	h.calls[m.Identity.MessageID]++
	h.mu.Unlock()
	_, err := tx.Exec(ctx, `insert into `+h.tbl+` (k) values ($1)`, string(m.Payload))
	return err
}

func (h *itemHandler) callsFor(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[id]
}

func (h *itemHandler) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.calls {
		n += c
	}
	return n
}

// S19: batched mode, BatchSize 3, MaxAttempts 3, deliveries at offsets 0,
// 1, 2 of one partition; offset 1 makes the batch's COMMIT fail: (a) its
// insert violates a deferred unique constraint that already holds its key,
// reported only at COMMIT; (b) a deferred trigger raises a serialization
// failure (40001) at COMMIT for its key, every time. The batch finds its
// culprit: offsets 0 and 2 SUCCEEDED, offset 1 FAILED_FINAL after 3
// attempts with one dead letter, committed offset 3, 2 business rows (plus
// the pre-existing one), and a bounded number of handler calls.
func TestS19BadEntryNeverBlocksABatch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, class string
		prepare     func(e *env, tbl string)
		preExisting int
	}{
		{name: "deferred unique violation", class: "pg:23505:items_k_key", preExisting: 1, prepare: func(e *env, tbl string) {
			e.exec(`create table ` + tbl + ` (k text, constraint items_k_key unique (k) deferrable initially deferred)`)
			e.exec(`insert into ` + tbl + ` values ('taken')`)
		}},
		{name: "serialization failure at commit", class: "pg:40001", prepare: func(e *env, tbl string) {
			e.exec(`create table ` + tbl + ` (k text)`)
			e.atCommit(tbl, "serialize_taken", "insert", `new.k = 'taken'`, raiseSQLState("40001"), -1)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, func(cfg *pgstore.Config) { cfg.MaxAttempts = 3 })
			tbl := e.table("items")
			c.prepare(e, tbl)
			h := newItemHandler(tbl)
			topic, group := newTopic(t, 1), randomName("g-")
			produce(t, topic, kmsg{id: "s19-0", payload: "item-0"}, kmsg{id: "s19-1", payload: "taken"}, kmsg{id: "s19-2", payload: "item-2"})
			var counters consumer.Counters
			r := startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: h.handle, Metrics: &counters,
				BatchSize: 3, BatchWait: 500 * time.Millisecond}, newSpySource(t, group, topic))
			eventually(t, 60*time.Second, "committed offset 3", func() bool { return groupOffset(t, group, topic) == 3 })
			r.stop(t)

			for _, id := range []string{"s19-0", "s19-2"} {
				if rec := e.record(group, id); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 {
					t.Errorf("%s = %s attempts %d, want SUCCEEDED attempts 1", id, rec.Status, rec.Attempts)
				}
			}
			rec := e.record(group, "s19-1")
			if rec.Status != dedup.StatusFailedFinal || rec.Attempts != 3 || rec.LastErrorClass != c.class {
				t.Errorf("s19-1 = %s attempts %d class %q, want FAILED_FINAL attempts 3 class %s", rec.Status, rec.Attempts, rec.LastErrorClass, c.class)
			}
			dls := e.deadLetters(group)
			if len(dls) != 1 || dls[0].MessageID != "s19-1" || dls[0].Reason != dedup.ReasonAttemptsExhausted {
				t.Errorf("dead letters = %+v, want one for s19-1 (attempts_exhausted)", dls)
			}
			if n := e.count(`select count(*) from ` + tbl + ` where k <> 'taken'`); n != 2 {
				t.Errorf("business rows = %d, want 2", n)
			}
			if n := e.count(`select count(*) from ` + tbl); n != 2+c.preExisting {
				t.Errorf("all rows = %d, want %d", n, 2+c.preExisting)
			}
			if counters.Get("processed") != 2 || counters.Get("dead_letter") != 1 || counters.Get("retry") != 2 {
				t.Errorf("counters = %v, want processed 2, dead_letter 1, retry 2", counters.Snapshot())
			}
			// Bounded: every round of the lane costs at most (1 + the
			// transient retries) × (batch + per-message rerun) handler calls.
			if n := h.total(); n > 60 {
				t.Errorf("handler calls = %d (%v), want a bounded number", n, h.calls)
			}
			t.Logf("handler calls: %v", h.calls)
		})
	}
}

// The same through consumer.Run on a real Kafka topic, MaxAttempts 1: the
// delivery whose COMMIT is terminated is neither acked (no offset at or
// past it is committed before its record is SUCCEEDED) nor dead-lettered;
// the lane retries it without counting; every message is applied once and
// the group's offset reaches the end.
func TestKafkaOutcomeUnknownAtCommitRedelivered(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"atomic", "batched", "lease"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, func(cfg *pgstore.Config) { cfg.MaxAttempts = 1 })
			tbl := e.table("items")
			e.exec(`create table ` + tbl + ` (k text primary key)`)
			h := newItemHandler(tbl)
			cfg := consumer.Config{Store: e.store}
			switch mode {
			// Atomic and batched: the victim's COMMIT is terminated twice, so
			// the delivery is redelivered twice (a batch: rerun whole, never
			// one message per transaction, which would count an attempt).
			case "atomic":
				cfg.Handler = h.handle
				e.atCommit(tbl, "kill_victim", "insert", `new.k = 'victim'`, killOwnBackend, 2)
			case "batched":
				cfg.Handler, cfg.BatchSize, cfg.BatchWait = h.handle, 5, 200*time.Millisecond
				e.atCommit(tbl, "kill_victim", "insert", `new.k = 'victim'`, killOwnBackend, 2)
			case "lease":
				cfg.LeaseHandler = func(ctx context.Context, m *dedup.Message) error {
					h.mu.Lock()
					h.calls[m.Identity.MessageID]++
					h.mu.Unlock()
					_, err := e.pool.Exec(ctx, `insert into `+tbl+` (k) values ($1) on conflict do nothing`, string(m.Payload))
					return err
				}
				// The completion's COMMIT is terminated once: it is retried in
				// place and recognises its own earlier run.
				e.atCommit(e.table("consumption_records"), "kill_done", "update",
					`new.message_id = 'm-2' and new.status = 'SUCCEEDED'`, killOwnBackend, 1)
			}
			topic, group := newTopic(t, 1), randomName("g-")
			cfg.Scope = group
			var msgs []kmsg
			for i := range 5 {
				payload := fmt.Sprintf("item-%d", i)
				if i == 2 {
					payload = "victim"
				}
				msgs = append(msgs, kmsg{id: fmt.Sprintf("m-%d", i), payload: payload})
			}
			produce(t, topic, msgs...)
			src := newSpySource(t, group, topic)
			var early atomic.Value // an offset committed before the victim's record was SUCCEEDED
			src.beforeOK = func(done []consumer.Delivery) {
				for _, d := range done {
					if d.Offset < 2 {
						continue
					}
					rec, err := e.store.Lookup(context.Background(), group, "m-2")
					if err != nil || rec.Status != dedup.StatusSucceeded {
						early.Store(fmt.Sprintf("offset %d committed while m-2 is %s (%v)", d.Offset, rec.Status, err))
					}
				}
			}
			var counters consumer.Counters
			cfg.Metrics = &counters
			r := startConsumer(t, cfg, src)
			eventually(t, 60*time.Second, "committed offset 5", func() bool { return groupOffset(t, group, topic) == 5 })
			r.stop(t)
			if v := early.Load(); v != nil {
				t.Fatal(v)
			}
			if rec := e.record(group, "m-2"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 {
				t.Fatalf("m-2 = %s attempts %d, want SUCCEEDED attempts 1", rec.Status, rec.Attempts)
			}
			if dls := e.deadLetters(group); len(dls) != 0 {
				t.Fatalf("dead letters = %+v, want none", dls)
			}
			if n := e.count(`select count(*) from ` + tbl); n != 5 {
				t.Fatalf("rows = %d, want 5", n)
			}
			if counters.Get("processed") != 5 || counters.Get("dead_letter") != 0 || counters.Get("retry") != 0 {
				t.Fatalf("counters = %v", counters.Snapshot())
			}
			want := 3 // two terminated commits, then the one that lands
			if mode == "lease" {
				want = 1 // the completion is retried, not the handler
			}
			if n := h.callsFor("m-2"); n != want {
				t.Fatalf("m-2 handler calls = %d, want %d", n, want)
			}
		})
	}
}

// A COMMIT that committed but whose reply was lost (a faultProxy drops it)
// is an outcome unknown too: not counted, not acked; the next copy finds
// the truth. Atomic and batched: the next copy is a duplicate, applied once.
// Lease mode retries the call in place (OutcomeUnknownRetry): a claim whose
// reply was lost finds its own committed claim by owner token and runs the
// handler at attempt 1 (with MaxAttempts 1, no dead letter), and a
// completion or failure mark whose reply was lost recognises its own
// earlier commit by owner token and fence (not reported as fenced). With no
// retry allowed, the claim's unknown outcome is returned as such.
// TestLeaseCallAnswersLost covers every lease call one by one.
func TestCommitReplyLost(t *testing.T) {
	t.Parallel()
	newEnv := func(t *testing.T, tweak func(*pgstore.Config)) (*env, *faultProxy, *pgstore.Store, string, *itemHandler) {
		e := setup(t, nil)
		tbl := e.table("items")
		e.exec(`create table ` + tbl + ` (k text primary key)`)
		proxy, pool := newPGProxy(t, 4)
		cfg := pgstore.Config{Schema: e.schema, Fingerprinter: testFingerprinter(t), MaxAttempts: 1}
		if tweak != nil {
			tweak(&cfg)
		}
		st, err := pgstore.New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return e, proxy, st, tbl, newItemHandler(tbl)
	}
	// lose arms the proxy from inside the handler, for the next request
	// that match accepts.
	lose := func(p *faultProxy, match func([]byte) bool, h pgstore.Handler) pgstore.Handler {
		return func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			if err := h(ctx, tx, m); err != nil {
				return err
			}
			p.DropReplyOnce(match)
			return nil
		}
	}

	t.Run("atomic", func(t *testing.T) {
		t.Parallel()
		e, proxy, st, tbl, h := newEnv(t, nil)
		res, err := st.Process(e.ctx, msg(t, "orders", "m-1", "", "one"), lose(proxy, pgIsCommit, h.handle))
		if !errors.Is(err, dedup.ErrOutcomeUnknown) || !res.HandlerCalled || proxy.Dropped() != 1 {
			t.Fatalf("%+v, %v (proxy dropped %d); want ErrOutcomeUnknown with HandlerCalled", res, err, proxy.Dropped())
		}
		res, err = st.Process(e.ctx, msg(t, "orders", "m-1", "", "one"), h.handle)
		if err != nil || res.Outcome != dedup.OutcomeDuplicate || res.HandlerCalled {
			t.Fatalf("next copy: %+v, %v; want a duplicate (the commit had landed)", res, err)
		}
		if n := e.count(`select count(*) from ` + tbl); n != 1 || h.total() != 1 || len(e.deadLetters("orders")) != 0 {
			t.Fatalf("rows %d, calls %d; want 1 and 1, no dead letter", n, h.total())
		}
	})

	t.Run("batched", func(t *testing.T) {
		t.Parallel()
		e, proxy, st, tbl, h := newEnv(t, nil)
		batch := func() []*dedup.Message {
			return []*dedup.Message{msg(t, "orders", "m-1", "", "one"), msg(t, "orders", "m-2", "", "two")}
		}
		handler := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			if m.Identity.MessageID == "m-2" {
				return lose(proxy, pgIsCommit, h.handle)(ctx, tx, m)
			}
			return h.handle(ctx, tx, m)
		}
		results, err := st.ProcessBatch(e.ctx, batch(), handler)
		if !errors.Is(err, dedup.ErrOutcomeUnknown) || len(results) != 2 || !results[0].HandlerCalled || !results[1].HandlerCalled {
			t.Fatalf("%+v, %v; want ErrOutcomeUnknown with HandlerCalled", results, err)
		}
		results, err = st.ProcessBatch(e.ctx, batch(), h.handle)
		if err != nil || results[0].Outcome != dedup.OutcomeDuplicate || results[1].Outcome != dedup.OutcomeDuplicate {
			t.Fatalf("next copies: %+v, %v; want duplicates", results, err)
		}
		if n := e.count(`select count(*) from ` + tbl); n != 2 || h.total() != 2 {
			t.Fatalf("rows %d, calls %d; want 2 and 2", n, h.total())
		}
	})

	leaseOpt := dedup.LeaseOptions{TTL: 30 * time.Second, DisableHeartbeat: true}
	leaseInsert := func(e *env, tbl string, calls *atomic.Int32) dedup.LeaseHandler {
		return func(ctx context.Context, m *dedup.Message) error {
			calls.Add(1)
			_, err := e.pool.Exec(ctx, `insert into `+tbl+` (k) values ($1)`, string(m.Payload))
			return err
		}
	}

	t.Run("lease claim", func(t *testing.T) {
		t.Parallel()
		e, proxy, st, tbl, _ := newEnv(t, nil)
		var calls atomic.Int32
		proxy.DropReplyOnce(pgCommitAfter(pgLeaseClaim))
		res, err := st.ProcessLeased(e.ctx, msg(t, "orders", "m-1", "", "one"), leaseInsert(e, tbl, &calls), leaseOpt)
		if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 || calls.Load() != 1 || proxy.Dropped() != 1 {
			t.Fatalf("%+v, %v, %d calls (proxy dropped %d); want processed at attempt 1: the retried claim finds its own",
				res, err, calls.Load(), proxy.Dropped())
		}
		if rec := e.record("orders", "m-1"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 || rec.Fence != 1 {
			t.Fatalf("record = %+v, want SUCCEEDED at attempt 1, fence 1 (one claim)", rec)
		}
		if n := e.count(`select count(*) from ` + tbl); n != 1 || len(e.deadLetters("orders")) != 0 {
			t.Fatalf("rows %d; want 1, no dead letter", n)
		}
	})

	// The retries may outlast the TTL: the claim found then is extended as a
	// new claim would be, so the handler never starts under an expired
	// lease that another copy could take over.
	t.Run("lease claim found after its TTL", func(t *testing.T) {
		t.Parallel()
		e, proxy, st, tbl, _ := newEnv(t, func(c *pgstore.Config) {
			c.OutcomeUnknownRetry = pgstore.RetryPolicy{Attempts: 1, Initial: 3 * time.Second} // waits 1.5s to 4.5s
		})
		var calls atomic.Int32
		var live atomic.Bool
		proxy.DropReplyOnce(pgCommitAfter(pgLeaseClaim))
		res, err := st.ProcessLeased(e.ctx, msg(t, "orders", "m-1", "", "one"), func(ctx context.Context, m *dedup.Message) error {
			live.Store(e.count(`select count(*) from `+e.table("consumption_records")+
				` where message_id = 'm-1' and status = 'PROCESSING' and lease_until > now()`) == 1)
			return leaseInsert(e, tbl, &calls)(ctx, m)
		}, dedup.LeaseOptions{TTL: time.Second, DisableHeartbeat: true})
		if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 || calls.Load() != 1 {
			t.Fatalf("%+v, %v, %d calls; want processed at attempt 1", res, err, calls.Load())
		}
		if !live.Load() {
			t.Fatal("the handler ran under an expired lease: the claim found by its owner token was not extended")
		}
	})

	t.Run("lease claim without retries", func(t *testing.T) {
		t.Parallel()
		e, proxy, st, tbl, _ := newEnv(t, func(c *pgstore.Config) { c.OutcomeUnknownRetry = pgstore.RetryPolicy{Disable: true} })
		var calls atomic.Int32
		proxy.DropReplyOnce(pgCommitAfter(pgLeaseClaim))
		res, err := st.ProcessLeased(e.ctx, msg(t, "orders", "m-1", "", "one"), leaseInsert(e, tbl, &calls), leaseOpt)
		if !errors.Is(err, dedup.ErrOutcomeUnknown) || res.HandlerCalled || calls.Load() != 0 || proxy.Dropped() != 1 {
			t.Fatalf("%+v, %v, %d calls; want ErrOutcomeUnknown before the handler", res, err, calls.Load())
		}
		// The claim had committed unseen: its lease stands until its TTL.
		if rec := e.record("orders", "m-1"); rec.Status != dedup.StatusProcessing || rec.Attempts != 1 {
			t.Fatalf("record after the lost claim reply = %+v, want PROCESSING attempts 1", rec)
		}
	})

	t.Run("lease completion", func(t *testing.T) {
		t.Parallel()
		e, proxy, st, tbl, _ := newEnv(t, nil)
		var calls atomic.Int32
		res, err := st.ProcessLeased(e.ctx, msg(t, "orders", "m-1", "", "one"), func(ctx context.Context, m *dedup.Message) error {
			proxy.DropReplyOnce(pgExecOf(pgLeaseDone))
			return leaseInsert(e, tbl, &calls)(ctx, m)
		}, leaseOpt)
		if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 || proxy.Dropped() != 1 {
			t.Fatalf("%+v, %v (proxy dropped %d); want processed: the retried completion finds its own commit", res, err, proxy.Dropped())
		}
		if rec := e.record("orders", "m-1"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 || calls.Load() != 1 {
			t.Fatalf("record = %+v, %d calls", rec, calls.Load())
		}
	})

	t.Run("lease failure mark", func(t *testing.T) {
		t.Parallel()
		e, proxy, st, _, _ := newEnv(t, nil)
		res, err := st.ProcessLeased(e.ctx, msg(t, "orders", "m-1", "", "one"), func(context.Context, *dedup.Message) error {
			proxy.DropReplyOnce(pgCommitAfter(pgLeaseFail))
			return errors.New("provider said no")
		}, leaseOpt)
		if err != nil || res.Outcome != dedup.OutcomeDeadLetter || res.Attempts != 1 || proxy.Dropped() != 1 {
			t.Fatalf("%+v, %v (proxy dropped %d); want a dead letter: the retried mark finds its own commit", res, err, proxy.Dropped())
		}
		dls := e.deadLetters("orders")
		if len(dls) != 1 || dls[0].Reason != dedup.ReasonAttemptsExhausted || res.DeadLetterID != dls[0].ID {
			t.Fatalf("dead letters = %+v, result's ID %d; want one (attempts used up), with that ID", dls, res.DeadLetterID)
		}
	})
}
