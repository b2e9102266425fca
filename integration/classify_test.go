package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testkit"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
)

// atCommit installs testkit.AtCommit's trigger on table tbl of the test's
// schema (see there).
func (e *env) atCommit(tbl, name, events, cond, action string, n int) {
	e.t.Helper()
	for _, q := range testkit.AtCommit(e.table(name+"_seq"), e.table(name+"_fn"), name, tbl, events, cond, action, n) {
		e.exec(q)
	}
}

const killOwnBackend = testkit.KillOwnBackend

var raiseSQLState = testkit.RaiseSQLState

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
