package integration

// S27, a purge meets a retry: a key that succeeded, its record expired
// (expires_at 1 s in the past); eight copies and the purge start together,
// released by one channel, then two more copies follow. Every answer is a
// replay, the one new execution, or "in flight"; never an error (a 5xx).
// Exactly one new execution (the purge always deletes the expired record,
// and the key's next claim runs as new), rows equal executions, and the
// last copy replays it. The interleaving is left to the scheduler here,
// many rounds over; the race forced between a claim and its next read is
// in dedup/pgstore (purge_race_test.go).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/httpidem"
	"github.com/jackc/pgx/v5"
)

// s27Rounds is how many times each test runs S27's shape, with a key of
// its own each time.
const s27Rounds = 8

// s27Race runs copy(0..7) and purge together, released by one channel, and
// waits for all of them (failing the test after a minute).
func s27Race(t *testing.T, copyFn func(i int), purge func()) {
	t.Helper()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { <-start; copyFn(i) })
	}
	wg.Go(func() { <-start; purge() })
	close(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("S27: the copies and the purge did not finish within a minute")
	}
}

// s27Expire moves the expiry of key's record 1 s into the past.
func s27Expire(e *env, scope, key string) {
	e.t.Helper()
	tag, err := e.pool.Exec(e.ctx, `update `+e.table("consumption_records")+` set expires_at = now() - interval '1 second'
where scope = $1 and message_id = $2`, scope, key)
	if err != nil || tag.RowsAffected() != 1 {
		e.t.Fatalf("expire %s/%s: %d rows, %v", scope, key, tag.RowsAffected(), err)
	}
}

// s27Purge runs the real purge of e's store, which must delete exactly
// the one expired record.
func s27Purge(t *testing.T, e *env) func() {
	return func() {
		n, err := e.store.PurgeRecords(e.ctx, pgstore.PurgeOptions{})
		if err != nil || n != 1 {
			t.Errorf("purge: deleted %d, %v; want 1", n, err)
		}
	}
}

// TestS27PurgeMeetsHTTPRetry: POST /transfers behind the middleware, in
// atomic and lease mode.
func TestS27PurgeMeetsHTTPRetry(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"atomic", "lease"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := setup(t, nil)
			e.exec(`create table ` + e.table("transfers") + ` (id bigint generated always as identity, key text not null)`)
			var calls atomic.Int64
			cfg := httpidem.Config{Store: e.store, Fingerprinter: e.store.Config().Fingerprinter,
				Tenant: func(*http.Request) (string, error) { return "acme", nil }, Principal: httpidem.Header("X-User")}
			if mode == "lease" {
				cfg.Lease = &dedup.LeaseOptions{TTL: 30 * time.Second}
			}
			mw, err := httpidem.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			mux.Handle("POST /transfers", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				key := r.Header.Get(httpidem.KeyHeader)
				var err error
				if tx := httpidem.FromContext(r.Context()); tx != nil {
					_, err = tx.Exec(r.Context(), `insert into `+e.table("transfers")+` (key) values ($1)`, key)
				} else { // lease mode: no transaction
					_, err = e.pool.Exec(r.Context(), `insert into `+e.table("transfers")+` (key) values ($1)`, key)
				}
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"id":"`+key+`"}`) //nolint:gosec // a test server's JSON answer; the key is the test's own
			})))
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			type answer struct {
				status int
				replay bool
				body   string
			}
			post := func(key string) answer {
				req, err := http.NewRequestWithContext(e.ctx, http.MethodPost, srv.URL+"/transfers", strings.NewReader(`{"from":"a","to":"b","amount":"10.00"}`))
				if err != nil {
					t.Error(err)
					return answer{}
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-User", "alice")
				req.Header.Set(httpidem.KeyHeader, key)
				res, err := srv.Client().Do(req)
				if err != nil {
					t.Error(err)
					return answer{}
				}
				defer func() { _ = res.Body.Close() }()
				b, _ := io.ReadAll(res.Body)
				return answer{status: res.StatusCode, replay: res.Header.Get(httpidem.ReplayHeader) == "true", body: string(b)}
			}
			for round := range s27Rounds {
				key := fmt.Sprintf("tr-27-%d", round)
				if a := post(key); a.status != http.StatusCreated || a.replay {
					t.Fatalf("round %d: first request: %d (replay %v) %s", round, a.status, a.replay, a.body)
				}
				s27Expire(e, s27RecordScope(t, e, key), key)
				before := calls.Load()
				answers := make([]answer, 10)
				s27Race(t, func(i int) { answers[i] = post(key) }, s27Purge(t, e))
				answers[8], answers[9] = post(key), post(key)
				for i, a := range answers {
					if a.status != http.StatusCreated && a.status != http.StatusConflict {
						t.Errorf("round %d: copy %d answered %d, want 201 or 409: %s", round, i, a.status, a.body)
					}
				}
				if last := answers[9]; last.status != http.StatusCreated || !last.replay {
					t.Errorf("round %d: the last copy answered %d (replay %v), want the new execution's replay", round, last.status, last.replay)
				}
				if n := calls.Load() - before; n != 1 {
					t.Errorf("round %d: %d new executions, want 1", round, n)
				}
				rows := e.count(`select count(*) from `+e.table("transfers")+` where key = $1`, key)
				if rows != 2 {
					t.Errorf("round %d: %d transfer rows, want 2 (the first execution and the one after the purge)", round, rows)
				}
				if t.Failed() {
					t.FailNow()
				}
			}
		})
	}
}

// s27RecordScope is the scope of key's record (the middleware's scope for
// the route, as it composed it).
func s27RecordScope(t *testing.T, e *env, key string) string {
	t.Helper()
	var scope string
	if err := e.pool.QueryRow(e.ctx, `select scope from `+e.table("consumption_records")+` where message_id = $1`, key).Scan(&scope); err != nil {
		t.Fatalf("record of %s: %v", key, err)
	}
	return scope
}

// TestS27PurgeMeetsMQDuplicate: the same race for a consumer's duplicate,
// in every mode of pgstore: atomic (Process), batched (ProcessBatch),
// set-based (ProcessBatchSet) and lease (ProcessLeased). A copy is a
// duplicate, the one new execution, or (lease) a retry while the owner
// holds the record; never an error.
func TestS27PurgeMeetsMQDuplicate(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.exec(`create table ` + e.table("ledger") + ` (id bigint generated always as identity, message_id text not null)`)
	insert := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		_, err := tx.Exec(ctx, `insert into `+e.table("ledger")+` (message_id) values ($1)`, m.Identity.MessageID)
		return err
	}
	var calls atomic.Int64
	modes := map[string]func(m *dedup.Message) (dedup.Result, error){
		"atomic": func(m *dedup.Message) (dedup.Result, error) {
			return e.store.Process(e.ctx, m, func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error { calls.Add(1); return insert(ctx, tx, m) })
		},
		"batched": func(m *dedup.Message) (dedup.Result, error) {
			rs, err := e.store.ProcessBatch(e.ctx, []*dedup.Message{m}, func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error { calls.Add(1); return insert(ctx, tx, m) })
			if err != nil || len(rs) != 1 {
				return dedup.Result{}, errors.Join(err, fmt.Errorf("%d results", len(rs)))
			}
			return rs[0], nil
		},
		"set": func(m *dedup.Message) (dedup.Result, error) {
			rs, err := e.store.ProcessBatchSet(e.ctx, []*dedup.Message{m}, func(ctx context.Context, tx pgx.Tx, ms []*dedup.Message) error {
				for _, m := range ms {
					calls.Add(1)
					if err := insert(ctx, tx, m); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil || len(rs) != 1 {
				return dedup.Result{}, errors.Join(err, fmt.Errorf("%d results", len(rs)))
			}
			return rs[0], nil
		},
		"lease": func(m *dedup.Message) (dedup.Result, error) {
			return e.store.ProcessLeased(e.ctx, m, func(ctx context.Context, m *dedup.Message) error {
				calls.Add(1)
				_, err := e.pool.Exec(ctx, `insert into `+e.table("ledger")+` (message_id) values ($1)`, m.Identity.MessageID)
				return err
			}, dedup.LeaseOptions{TTL: 30 * time.Second})
		},
	}
	for _, mode := range []string{"atomic", "batched", "set", "lease"} {
		process := modes[mode]
		for round := range s27Rounds {
			id := fmt.Sprintf("led-27-%s-%d", mode, round)
			msg := func() *dedup.Message {
				ident, err := dedup.NewIdentity("ledgers", id, "", "")
				if err != nil {
					t.Fatal(err)
				}
				return &dedup.Message{Identity: ident, Topic: "ledgers", Payload: []byte(`{"amount":10}`)}
			}
			if r, err := process(msg()); err != nil || r.Outcome != dedup.OutcomeProcessed {
				t.Fatalf("%s round %d: first delivery: %s, %v", mode, round, r.Outcome, err)
			}
			s27Expire(e, "ledgers", id)
			before := calls.Load()
			results, errs := make([]dedup.Result, 10), make([]error, 10)
			s27Race(t, func(i int) { results[i], errs[i] = process(msg()) }, s27Purge(t, e))
			results[8], errs[8] = process(msg())
			results[9], errs[9] = process(msg())
			processed := 0
			for i, r := range results {
				switch {
				case errs[i] != nil:
					t.Errorf("%s round %d: copy %d: %v", mode, round, i, errs[i])
				case r.Outcome == dedup.OutcomeProcessed:
					processed++
				case r.Outcome == dedup.OutcomeDuplicate:
				case r.Outcome == dedup.OutcomeRetry && errors.Is(r.Err, dedup.ErrLeaseHeld):
				default:
					t.Errorf("%s round %d: copy %d: %s (%v), want processed, duplicate or lease held", mode, round, i, r.Outcome, r.Err)
				}
			}
			if results[9].Outcome != dedup.OutcomeDuplicate {
				t.Errorf("%s round %d: the last copy: %s, want a duplicate of the new execution", mode, round, results[9].Outcome)
			}
			if n := calls.Load() - before; n != 1 || processed != 1 {
				t.Errorf("%s round %d: %d new executions, %d processed; want 1 and 1", mode, round, n, processed)
			}
			if rows := e.count(`select count(*) from `+e.table("ledger")+` where message_id = $1`, id); rows != 2 {
				t.Errorf("%s round %d: %d ledger rows, want 2", mode, round, rows)
			}
			if t.Failed() {
				t.FailNow()
			}
		}
	}
}

// TestS27PurgeMeetsInspect: `idemq inspect` (HTTPStore.Inspect, what the
// CLI runs for an HTTP request) beside the purge: each shows the record with
// its stored response, or finds nothing; never a SUCCEEDED record without
// the response it holds.
func TestS27PurgeMeetsInspect(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	hs, err := pgstore.NewHTTPStore(e.store)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpidem.New(httpidem.Config{Store: e.store, Fingerprinter: e.store.Config().Fingerprinter,
		Tenant: func(*http.Request) (string, error) { return "acme", nil }, Principal: httpidem.Header("X-User")})
	if err != nil {
		t.Fatal(err)
	}
	h := http.NewServeMux()
	h.Handle("POST /transfers", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })))
	for round := range s27Rounds {
		key := fmt.Sprintf("tr-27-%d", round)
		req := httptest.NewRequestWithContext(e.ctx, http.MethodPost, "/transfers", strings.NewReader(`{"amount":"10.00"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User", "alice")
		req.Header.Set(httpidem.KeyHeader, key)
		rw := httptest.NewRecorder()
		h.ServeHTTP(rw, req)
		if rw.Code != http.StatusCreated {
			t.Fatalf("round %d: request: %d %s", round, rw.Code, rw.Body)
		}
		scope := s27RecordScope(t, e, key)
		s27Expire(e, scope, key)
		var found, gone atomic.Int64
		s27Race(t, func(i int) {
			in, err := hs.Inspect(e.ctx, dedup.Identity{Scope: scope, MessageID: key})
			switch {
			case errors.Is(err, dedup.ErrNotFound):
				gone.Add(1)
			case err != nil:
				t.Errorf("round %d: inspect %d: %v", round, i, err)
			case in.Stored == nil || in.Stored.Response.Status != http.StatusCreated || in.Record.Status != dedup.StatusSucceeded:
				t.Errorf("round %d: inspect %d: record %s with stored part %+v; want SUCCEEDED with its 201", round, i, in.Record.Status, in.Stored)
			default:
				found.Add(1)
			}
		}, s27Purge(t, e))
		if found.Load()+gone.Load() != 8 {
			t.Errorf("round %d: %d inspections found the record, %d nothing; want 8 in all", round, found.Load(), gone.Load())
		}
		if _, err := hs.Inspect(e.ctx, dedup.Identity{Scope: scope, MessageID: key}); !errors.Is(err, dedup.ErrNotFound) {
			t.Errorf("round %d: inspect after the purge: %v, want ErrNotFound", round, err)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
}
