package pgstore

// Store-level tests of commits on Postgres: a COMMIT terminated by the
// server (57P01), serialization failures and deadlocks retried without
// using an attempt, and the handler's isolation level. Moved here from the
// integration module; the harness is in env_test.go.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testkit"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// atCommit installs testkit.AtCommit's trigger on table tbl of the test's
// schema (see there).
func (e *storeEnv) atCommit(tbl, name, events, cond, action string, n int) {
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

// itemsEnv is a store with MaxAttempts 1 and a table items (k text primary
// key) with an itemHandler on it; own: on a schema of the test's own (for a
// trigger on the record table).
func itemsEnv(t *testing.T, own bool) (*storeEnv, string, *itemHandler) {
	t.Helper()
	mk := newEnv
	if own {
		mk = newOwnSchemaEnv
	}
	e := mk(t, func(cfg *Config) { cfg.MaxAttempts = 1 })
	tbl := e.table("items")
	e.exec(`create table ` + tbl + ` (k text primary key)`)
	return e, tbl, newItemHandler(tbl)
}

// A connection terminated at COMMIT (57P01) leaves the outcome unknown. It
// is not the handler's failure: with MaxAttempts 1 the message is not
// dead-lettered, not marked, not counted; the store returns an error
// wrapping ErrOutcomeUnknown (the runtime does not ack it) with HandlerCalled
// set; the next delivery processes it, and it is applied exactly once. In
// every Postgres mode: atomic and batched return it; lease mode retries its
// claim and its completion in place (OutcomeUnknownRetry) and returns it
// when the retries are used up.
func TestOutcomeUnknownAtCommit(t *testing.T) {
	t.Parallel()
	noTrace := func(t *testing.T, e *storeEnv, id string) {
		t.Helper()
		if _, err := e.store.Lookup(e.ctx, e.scope, id); !errors.Is(err, dedup.ErrNotFound) {
			t.Fatalf("%s has a record after the unknown commit (err %v), want none: nothing marked or counted", id, err)
		}
		if dls := e.deadLetters(); len(dls) != 0 {
			t.Fatalf("dead letters = %+v, want none", dls)
		}
	}
	unknown := func(t *testing.T, what string, res dedup.Result, err error) {
		t.Helper()
		if !errors.Is(err, dedup.ErrOutcomeUnknown) || !dedup.IsOutcomeUnknown(err) || !res.HandlerCalled || res.Outcome != "" {
			t.Fatalf("%s: %+v, %v; want an error wrapping ErrOutcomeUnknown with HandlerCalled and no outcome", what, res, err)
		}
	}

	t.Run("atomic", func(t *testing.T) {
		e, tbl, h := itemsEnv(t, false)
		e.atCommit(tbl, "kill_victim", "insert", `new.k = 'victim'`, killOwnBackend, 1)
		res, err := e.store.Process(e.ctx, e.msg("m-victim", "", "victim"), h.handle)
		unknown(t, "first delivery", res, err)
		noTrace(t, e, "m-victim")
		res, err = e.store.Process(e.ctx, e.msg("m-victim", "", "victim"), h.handle)
		if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 {
			t.Fatalf("next delivery: %+v, %v; want processed at attempt 1", res, err)
		}
		if n := e.count(`select count(*) from ` + tbl); n != 1 || h.callsFor("m-victim") != 2 {
			t.Fatalf("rows %d, handler calls %d; want 1 row from 2 calls", n, h.callsFor("m-victim"))
		}
	})

	t.Run("batched", func(t *testing.T) {
		e, tbl, h := itemsEnv(t, false)
		e.atCommit(tbl, "kill_victim", "insert", `new.k = 'victim'`, killOwnBackend, 1)
		batch := func() []*dedup.Message {
			return []*dedup.Message{e.msg("m-a", "", "a"), e.msg("m-victim", "", "victim"), e.msg("m-c", "", "c")}
		}
		results, err := e.store.ProcessBatch(e.ctx, batch(), h.handle)
		if !errors.Is(err, dedup.ErrOutcomeUnknown) || len(results) != 3 {
			t.Fatalf("first batch: %+v, %v; want ErrOutcomeUnknown", results, err)
		}
		for i, r := range results {
			if !r.HandlerCalled || r.Outcome != "" {
				t.Fatalf("first batch result %d = %+v, want HandlerCalled and no outcome", i, r)
			}
		}
		for _, id := range []string{"m-a", "m-victim", "m-c"} {
			noTrace(t, e, id)
		}
		results, err = e.store.ProcessBatch(e.ctx, batch(), h.handle)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range results {
			if r.Outcome != dedup.OutcomeProcessed || r.Attempts != 1 {
				t.Fatalf("next batch result %d = %+v, want processed at attempt 1", i, r)
			}
		}
		if n := e.count(`select count(*) from ` + tbl); n != 3 || h.callsFor("m-victim") != 2 {
			t.Fatalf("rows %d, victim calls %d; want 3 rows, 2 calls", n, h.callsFor("m-victim"))
		}
	})

	// Lease mode commits its claim, then its completion. A completion
	// terminated at COMMIT is retried in place (OutcomeUnknownRetry) and
	// recognises its own earlier run by owner token and fence.
	leaseCharge := func(e *storeEnv, tbl string, calls *atomic.Int32) dedup.LeaseHandler {
		return func(ctx context.Context, _ *dedup.Message) error {
			calls.Add(1)
			l, _ := dedup.LeaseFromContext(ctx)
			_, err := e.pool.Exec(ctx, `insert into `+tbl+` (k) values ($1) on conflict do nothing`, l.IdempotencyKey())
			return err
		}
	}
	opt := dedup.LeaseOptions{TTL: 30 * time.Second}

	t.Run("lease completion", func(t *testing.T) {
		e, tbl, _ := itemsEnv(t, true)
		e.atCommit(e.records(), "kill_done", "update", `new.message_id = 'm-victim' and new.status = 'SUCCEEDED'`, killOwnBackend, 1)
		var calls atomic.Int32
		res, err := e.store.ProcessLeased(e.ctx, e.msg("m-victim", "", "victim"), leaseCharge(e, tbl, &calls), opt)
		if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 || !res.HandlerCalled || calls.Load() != 1 {
			t.Fatalf("%+v, %v, %d calls; want processed at attempt 1 after the completion was retried", res, err, calls.Load())
		}
		if rec := e.record("m-victim"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 {
			t.Fatalf("record = %+v", rec)
		}
		if n := e.count(`select last_value from ` + e.table("kill_done_seq")); n != 2 {
			t.Fatalf("the completion committed %d times in the trigger's count, want 2 (terminated once, then retried)", n)
		}
		if len(e.deadLetters()) != 0 {
			t.Fatal("dead letter written")
		}
	})

	t.Run("lease completion unknown after its retries", func(t *testing.T) {
		e, tbl, _ := itemsEnv(t, true)
		e.atCommit(e.records(), "kill_done", "update", `new.message_id = 'm-victim' and new.status = 'SUCCEEDED'`, killOwnBackend, -1)
		st := e.newStore(e.pool, func(c *Config) {
			c.MaxAttempts, c.OutcomeUnknownRetry = 1, RetryPolicy{Attempts: 1, Initial: time.Millisecond}
		})
		var calls atomic.Int32
		res, err := st.ProcessLeased(e.ctx, e.msg("m-victim", "", "victim"), leaseCharge(e, tbl, &calls), opt)
		unknown(t, "completion", res, err)
		if res.Attempts != 1 || calls.Load() != 1 {
			t.Fatalf("%+v, %d calls", res, calls.Load())
		}
		// Not marked failed, no dead letter: the lease stays until it
		// expires (or the next try of the completion lands).
		if rec := e.record("m-victim"); rec.Status != dedup.StatusProcessing || rec.Attempts != 1 || rec.LastError != "" {
			t.Fatalf("record = %+v, want PROCESSING attempts 1 without an error", rec)
		}
		if len(e.deadLetters()) != 0 {
			t.Fatal("dead letter written")
		}
	})

	// A claim terminated at COMMIT did not commit: it is retried in place
	// (OutcomeUnknownRetry), finds no claim of its own, claims anew, and the
	// handler runs at attempt 1.
	t.Run("lease claim", func(t *testing.T) {
		e, tbl, _ := itemsEnv(t, true)
		e.atCommit(e.records(), "kill_claim", "insert", `new.message_id = 'm-victim'`, killOwnBackend, 1)
		var calls atomic.Int32
		res, err := e.store.ProcessLeased(e.ctx, e.msg("m-victim", "", "victim"), leaseCharge(e, tbl, &calls), opt)
		if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 || calls.Load() != 1 {
			t.Fatalf("%+v, %v, %d calls; want processed at attempt 1 after the claim was retried", res, err, calls.Load())
		}
		if n := e.count(`select last_value from ` + e.table("kill_claim_seq")); n != 2 {
			t.Fatalf("the claim's insert reached COMMIT %d times in the trigger's count, want 2 (terminated once, then retried)", n)
		}
		if rec := e.record("m-victim"); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 || rec.Fence != 1 {
			t.Fatalf("record = %+v, want SUCCEEDED at attempt 1, fence 1", rec)
		}
		if n := e.count(`select count(*) from ` + tbl); n != 1 || len(e.deadLetters()) != 0 {
			t.Fatalf("rows = %d, want 1 and no dead letter", n)
		}
	})
}

// Serialization failures (40001) and deadlocks (40P01) are retried at once
// without using an attempt: with MaxAttempts 1, a handler that meets one
// once (raised by its own statement, or by a deferred trigger at COMMIT)
// ends SUCCEEDED at attempt 1, in atomic, batched and lease mode (where
// the completion mark meets it).
func TestTransientFailureCountsNoAttempt(t *testing.T) {
	t.Parallel()
	// once makes h fail its first call with SQLSTATE code, raised by a
	// statement of its transaction.
	once := func(h *itemHandler, code string) Handler {
		var fired atomic.Bool
		return func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			if !fired.Swap(true) {
				h.mu.Lock()
				h.calls[m.Identity.MessageID]++
				h.mu.Unlock()
				_, err := tx.Exec(ctx, `do $$ begin raise exception 'simulated' using errcode = '`+code+`'; end $$`)
				return fmt.Errorf("insert item: %w", err)
			}
			return h.handle(ctx, tx, m)
		}
	}
	check := func(t *testing.T, e *storeEnv, h *itemHandler, res dedup.Result, err error, id string, wantCalls int) {
		t.Helper()
		if err != nil || res.Outcome != dedup.OutcomeProcessed || res.Attempts != 1 || !res.HandlerCalled {
			t.Fatalf("%+v, %v; want processed at attempt 1", res, err)
		}
		rec := e.record(id)
		if rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 || rec.LastError != "" {
			t.Fatalf("record = %+v, want SUCCEEDED attempts 1, no error recorded", rec)
		}
		if h != nil && h.callsFor(id) != wantCalls {
			t.Fatalf("handler calls = %d, want %d", h.callsFor(id), wantCalls)
		}
	}
	for _, code := range []string{"40001", "40P01"} {
		t.Run("atomic handler "+code, func(t *testing.T) {
			e, _, h := itemsEnv(t, false)
			res, err := e.store.Process(e.ctx, e.msg("m-1", "", "one"), once(h, code))
			check(t, e, h, res, err, "m-1", 2)
		})
		t.Run("batched handler "+code, func(t *testing.T) {
			e, tbl, h := itemsEnv(t, false)
			results, err := e.store.ProcessBatch(e.ctx, []*dedup.Message{e.msg("m-1", "", "one"), e.msg("m-2", "", "two")}, once(h, code))
			if err != nil {
				t.Fatal(err)
			}
			check(t, e, h, results[0], nil, "m-1", 2)
			check(t, e, h, results[1], nil, "m-2", 1)
			if n := e.count(`select count(*) from ` + tbl); n != 2 {
				t.Fatalf("rows = %d", n)
			}
		})
	}
	t.Run("atomic commit 40001", func(t *testing.T) {
		e, tbl, h := itemsEnv(t, false)
		e.atCommit(tbl, "serialize_once", "insert", `new.k = 'one'`, raiseSQLState("40001"), 1)
		res, err := e.store.Process(e.ctx, e.msg("m-1", "", "one"), h.handle)
		check(t, e, h, res, err, "m-1", 2)
	})
	t.Run("batched commit 40001", func(t *testing.T) {
		e, tbl, h := itemsEnv(t, false)
		e.atCommit(tbl, "serialize_once", "insert", `new.k = 'two'`, raiseSQLState("40001"), 1)
		results, err := e.store.ProcessBatch(e.ctx, []*dedup.Message{e.msg("m-1", "", "one"), e.msg("m-2", "", "two")}, h.handle)
		if err != nil {
			t.Fatal(err)
		}
		check(t, e, h, results[0], nil, "m-1", 2)
		check(t, e, h, results[1], nil, "m-2", 2)
	})
	t.Run("lease completion 40P01", func(t *testing.T) {
		e, tbl, _ := itemsEnv(t, true)
		e.atCommit(e.records(), "deadlock_once", "update", `new.message_id = 'm-1' and new.status = 'SUCCEEDED'`, raiseSQLState("40P01"), 1)
		var calls atomic.Int32
		res, err := e.store.ProcessLeased(e.ctx, e.msg("m-1", "", "one"), func(ctx context.Context, m *dedup.Message) error {
			calls.Add(1)
			_, err := e.pool.Exec(ctx, `insert into `+tbl+` (k) values ($1)`, string(m.Payload))
			return err
		}, dedup.LeaseOptions{TTL: 30 * time.Second})
		check(t, e, nil, res, err, "m-1", 0)
		if calls.Load() != 1 {
			t.Fatalf("handler calls = %d, want 1", calls.Load())
		}
	})
	// A transient failure that outlives its retries is the handler's
	// failure: counted and marked (here final, with MaxAttempts 1).
	t.Run("atomic retries used up", func(t *testing.T) {
		e, tbl, h := itemsEnv(t, false)
		e.atCommit(tbl, "serialize_always", "insert", `new.k = 'one'`, raiseSQLState("40001"), -1)
		res, err := e.store.Process(e.ctx, e.msg("m-1", "", "one"), h.handle)
		if err != nil || res.Outcome != dedup.OutcomeDeadLetter || res.Attempts != 1 {
			t.Fatalf("%+v, %v; want a dead letter at attempt 1", res, err)
		}
		if rec := e.record("m-1"); rec.LastErrorClass != "pg:40001" {
			t.Fatalf("record = %+v", rec)
		}
		if n := h.callsFor("m-1"); n != 4 {
			t.Fatalf("handler calls = %d, want 4 (1 + 3 default transient retries)", n)
		}
	})
}

// A handler runs under the isolation level of Config.TxOptions (read
// committed by default), in atomic and batched mode; under serializable, a
// real serialization conflict between two concurrent handlers (write skew)
// is retried without using an attempt.
func TestHandlerIsolationLevel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		level pgx.TxIsoLevel
		want  string
	}{{"", "read committed"}, {pgx.RepeatableRead, "repeatable read"}, {pgx.Serializable, "serializable"}} {
		t.Run(c.want, func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) { cfg.TxOptions = pgx.TxOptions{IsoLevel: c.level} })
			var mu sync.Mutex
			var seen []string
			h := func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
				var level string
				err := tx.QueryRow(ctx, `show transaction_isolation`).Scan(&level)
				mu.Lock()
				seen = append(seen, level)
				mu.Unlock()
				return err
			}
			if _, err := e.store.Process(e.ctx, e.msg("m-1", "", "x"), h); err != nil {
				t.Fatal(err)
			}
			if _, err := e.store.ProcessBatch(e.ctx, []*dedup.Message{e.msg("m-2", "", "x"), e.msg("m-3", "", "x")}, h); err != nil {
				t.Fatal(err)
			}
			if len(seen) != 3 || seen[0] != c.want || seen[1] != c.want || seen[2] != c.want {
				t.Fatalf("isolation seen by the handler = %v, want %s", seen, c.want)
			}
		})
	}

	// Two handlers' reads must overlap for the write skew to happen. The
	// handler of each doctor waits, after the first read it completes, until
	// the other's has completed its own (a channel each, closed once; a
	// minute at most, then the test fails saying so): never "the first two
	// tries", since a try may fail before its read (a serialization failure
	// at the read itself, or on the claim's predicate locks) and be retried.
	// "failure before the read" forces that: the first try of all raises
	// 40001 before reading.
	for _, failFirst := range []bool{false, true} {
		name := "serializable write skew"
		if failFirst {
			name += " after a failure before the read"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) {
				cfg.MaxAttempts = 1
				cfg.TxOptions = pgx.TxOptions{IsoLevel: pgx.Serializable}
			})
			tbl := e.table("on_call")
			e.exec(`create table ` + tbl + ` (doctor text primary key, on_call bool not null)`)
			e.exec(`insert into ` + tbl + ` values ('alice', true), ('bob', true)`)
			// Each handler reads how many are on call, waits until the
			// other has read too (after its own first read only), then
			// takes its doctor off call: classic write skew, which
			// serializable isolation refuses for one of them with 40001.
			read := map[string]chan struct{}{"alice": make(chan struct{}), "bob": make(chan struct{})}
			once := map[string]*sync.Once{"alice": {}, "bob": {}}
			other := map[string]string{"alice": "bob", "bob": "alice"}
			var tries atomic.Int32
			h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
				doctor := string(m.Payload)
				if tries.Add(1) == 1 && failFirst {
					_, err := tx.Exec(ctx, `do $$ begin raise exception 'injected before the read' using errcode = '40001'; end $$`)
					return err
				}
				var n int
				if err := tx.QueryRow(ctx, `select count(*) from `+tbl+` where on_call`).Scan(&n); err != nil {
					return err
				}
				first := false
				once[doctor].Do(func() { first = true; close(read[doctor]) })
				if first {
					select {
					case <-read[other[doctor]]:
					case <-time.After(time.Minute):
						t.Errorf("%s's handler read; %s's has not read within a minute: the reads cannot be made to overlap", doctor, other[doctor])
						return errors.New("barrier timed out")
					}
				}
				_, err := tx.Exec(ctx, `update `+tbl+` set on_call = false where doctor = $1`, doctor)
				return err
			}
			var wg sync.WaitGroup
			results := make([]dedup.Result, 2)
			errs := make([]error, 2)
			for i, doctor := range []string{"alice", "bob"} {
				wg.Go(func() {
					results[i], errs[i] = e.store.Process(e.ctx, e.msg("m-"+doctor, "", doctor), h)
				})
			}
			wg.Wait()
			for i := range results {
				if errs[i] != nil || results[i].Outcome != dedup.OutcomeProcessed || results[i].Attempts != 1 {
					t.Fatalf("handler %d: %+v, %v; want processed at attempt 1", i, results[i], errs[i])
				}
			}
			want := int32(3) // two first tries, one retried after the serialization failure
			if failFirst {
				want++
			}
			if n := tries.Load(); n < want {
				t.Fatalf("handler tries = %d, want at least %d (one serialization failure retried)", n, want)
			}
			if n := e.count(`select count(*) from ` + tbl + ` where on_call`); n != 0 {
				t.Fatalf("on call = %d, want 0 (both updates applied, one after a retry)", n)
			}
		})
	}
}

// A handler cut off by its own deadline inside a statement (pgx's default
// context watcher closes the connection to interrupt it) is the handler's
// failure: counted and marked in a new transaction, dead-lettered after
// MaxAttempts, in atomic and batched modes. Before, the closed connection
// made it "outcome unknown", never counted, so such a message came back and
// was cut off forever (with consumer.Config.MaxHandlerDuration, holding its
// partition).
func TestHandlerDeadlineInsideAStatementIsCounted(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		t.Run(map[bool]string{false: "atomic", true: "batched"}[batched], func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.MaxAttempts = 2 })
			pool := e.newPool(func(*pgxpool.Config) {}) // pgx's default context watcher: it closes the connection
			st := e.newStore(pool, func(c *Config) { c.MaxAttempts = 2 })
			stuck := func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
				hctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
				_, err := tx.Exec(hctx, `select pg_sleep(30)`)
				return err
			}
			run := func() dedup.Result {
				t.Helper()
				m := e.msg("m-stuck", "", "x")
				if batched {
					rs, err := st.ProcessBatch(e.ctx, []*dedup.Message{m}, stuck)
					if err != nil || len(rs) != 1 {
						t.Fatalf("ProcessBatch = %+v, %v; want one result and no error (the handler's failure is recorded)", rs, err)
					}
					return rs[0]
				}
				r, err := st.Process(e.ctx, m, stuck)
				if err != nil {
					t.Fatalf("Process: %v; want no error: the handler's deadline is its failure, recorded", err)
				}
				return r
			}
			if r := run(); r.Outcome != dedup.OutcomeRetry || !errors.Is(r.Err, context.DeadlineExceeded) {
				t.Fatalf("first cut-off run = %+v; want a counted retry with the deadline as its error", r)
			}
			if rec := e.record("m-stuck"); rec.Status != dedup.StatusFailedRetryable || rec.Attempts != 1 {
				t.Fatalf("record after the first run = %+v; want FAILED_RETRYABLE, 1 attempt", rec)
			}
			if r := run(); r.Outcome != dedup.OutcomeDeadLetter {
				t.Fatalf("second cut-off run = %+v; want a dead letter at MaxAttempts 2", r)
			}
		})
	}
}
