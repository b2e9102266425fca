package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// gate opens once n callers have arrived, and stays open: every caller
// waits for the n-th, or fails the test after a minute.
type gate struct {
	n       int32
	arrived atomic.Int32
	open    chan struct{}
	once    sync.Once
}

func newGate(n int32) *gate { return &gate{n: n, open: make(chan struct{})} }

func (g *gate) wait() error {
	if g.arrived.Add(1) >= g.n {
		g.once.Do(func() { close(g.open) })
	}
	select {
	case <-g.open:
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("gate: %d of %d callers arrived in a minute", g.arrived.Load(), g.n)
	}
}

// sqlStates is a pgx tracer (queries and batches) that counts the SQLSTATE
// of every failed statement on its pool's connections.
type sqlStates struct {
	mu    sync.Mutex
	codes map[string]int
}

func (s *sqlStates) note(err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		s.mu.Lock()
		s.codes[pgErr.Code]++
		s.mu.Unlock()
	}
}

func (s *sqlStates) count(code string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.codes[code]
}

func (s *sqlStates) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (s *sqlStates) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	s.note(d.Err)
}
func (s *sqlStates) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (s *sqlStates) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.note(d.Err)
}
func (s *sqlStates) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// smallStore is a store on the test's schema over a pool of its own with
// MaxConns connections in the default exec mode (statements prepared and
// cached per connection), traced by the returned sqlStates.
func (e *env) smallStore(maxConns int32, tweak func(*pgstore.Config)) (*pgstore.Store, *sqlStates) {
	e.t.Helper()
	pc, err := pgxpool.ParseConfig(postgresDSN(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	pc.MaxConns, pc.MinConns = maxConns, 0
	states := &sqlStates{codes: map[string]int{}}
	pc.ConnConfig.Tracer = states
	p, err := pgxpool.NewWithConfig(e.ctx, pc)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Close)
	cfg := pgstore.Config{Schema: e.schema, Fingerprinter: testFingerprinter(e.t), MaxAttempts: 1}
	if tweak != nil {
		tweak(&cfg)
	}
	st, err := pgstore.New(p, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return st, states
}

// s29Mode runs one message in one of the store's modes.
type s29Mode struct {
	name string
	run  func(ctx context.Context, s *pgstore.Store, m *dedup.Message, h pgstore.Handler) (dedup.Result, error)
}

var s29Modes = []s29Mode{
	{"atomic", func(ctx context.Context, s *pgstore.Store, m *dedup.Message, h pgstore.Handler) (dedup.Result, error) {
		return s.Process(ctx, m, h)
	}},
	{"batched", func(ctx context.Context, s *pgstore.Store, m *dedup.Message, h pgstore.Handler) (dedup.Result, error) {
		rs, err := s.ProcessBatch(ctx, []*dedup.Message{m}, h)
		if err != nil || len(rs) != 1 {
			return dedup.Result{}, fmt.Errorf("ProcessBatch: %d results, %w", len(rs), err)
		}
		return rs[0], nil
	}},
	{"set-based BatchHandler", func(ctx context.Context, s *pgstore.Store, m *dedup.Message, h pgstore.Handler) (dedup.Result, error) {
		rs, err := s.ProcessBatchSet(ctx, []*dedup.Message{m}, func(ctx context.Context, tx pgx.Tx, ms []*dedup.Message) error {
			for _, m := range ms {
				if err := h(ctx, tx, m); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil || len(rs) != 1 {
			return dedup.Result{}, fmt.Errorf("ProcessBatchSet: %d results, %w", len(rs), err)
		}
		return rs[0], nil
	}},
	{"http", func(ctx context.Context, s *pgstore.Store, m *dedup.Message, h pgstore.Handler) (dedup.Result, error) {
		hs, err := pgstore.NewHTTPStore(s)
		if err != nil {
			return dedup.Result{}, err
		}
		sum, keyID, err := s.Config().Fingerprinter.Sum(m.Payload)
		if err != nil {
			return dedup.Result{}, err
		}
		r, err := hs.Process(ctx, pgstore.HTTPRequest{Message: m, Principal: "s29", Sum: sum, KeyID: keyID,
			Matches: func(_ int, got []byte, gotKey string) (bool, error) {
				return bytes.Equal(got, sum) && gotKey == keyID, nil
			},
			MaxUnfinished: 1000, UnfinishedWindow: time.Hour,
		}, func(ctx context.Context, tx pgx.Tx, attempt int) (pgstore.HTTPResponse, error) {
			m.Attempt = attempt
			return pgstore.HTTPResponse{Status: 200, Stored: []byte("ok")}, h(ctx, tx, m)
		})
		return r.Result, err
	}},
}

// runPair runs two messages at once (one per connection of a pool of 2).
func runPair(t *testing.T, run func(m *dedup.Message) (dedup.Result, error), a, b *dedup.Message) [2]dedup.Result {
	t.Helper()
	var rs [2]dedup.Result
	var errs [2]error
	var wg sync.WaitGroup
	for i, m := range []*dedup.Message{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i], errs[i] = run(m)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	return rs
}

// S29: a pool of 2 connections (default exec mode), MaxAttempts 1. The
// handler reads `select * from ledgers where id = $1` and adds the payload
// length. Two messages warm both connections; then `alter table ledgers add
// column memo text` runs; then led-29-3 and led-29-4 arrive together, one
// on each connection, and each connection fails once with 0A000 ("cached
// plan must not change result type"). That is the statement cache's
// failure, not the message's: retried at once without counting; both are
// processed at attempt 1, nothing is dead-lettered, the total is exact.
func TestS29SchemaChangeIsNotTheMessagesFailure(t *testing.T) {
	t.Parallel()
	for _, mode := range s29Modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, func(cfg *pgstore.Config) { cfg.MaxAttempts = 1 })
			st, _ := e.smallStore(2, nil)
			ledgers := e.table("ledgers")
			e.exec(`create table ` + ledgers + ` (id text primary key, total bigint not null)`)
			e.exec(`insert into ` + ledgers + ` values ('L', 0)`)
			var cachedPlan atomic.Int32
			var g *gate
			h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
				if err := g.wait(); err != nil {
					return dedup.Permanent(err)
				}
				rows, _ := tx.Query(ctx, `select * from `+ledgers+` where id = $1`, "L")
				n := 0
				for rows.Next() {
					n++
				}
				if err := rows.Err(); err != nil {
					var pgErr *pgconn.PgError
					if errors.As(err, &pgErr) && pgErr.Code == "0A000" {
						cachedPlan.Add(1)
					}
					return fmt.Errorf("read ledger: %w", err)
				}
				if n != 1 {
					return fmt.Errorf("ledger L: %d rows", n)
				}
				_, err := tx.Exec(ctx, `update `+ledgers+` set total = total + $2 where id = $1`, "L", len(m.Payload))
				return err
			}
			run := func(m *dedup.Message) (dedup.Result, error) { return mode.run(e.ctx, st, m, h) }
			scope := randomName("s29-")
			g = newGate(2)
			warm := runPair(t, run, msg(t, scope, "led-29-1", "", "a"), msg(t, scope, "led-29-2", "", "bb"))
			for i, r := range warm {
				if r.Outcome != dedup.OutcomeProcessed {
					t.Fatalf("warm-up message %d: %+v", i+1, r)
				}
			}
			e.exec(`alter table ` + ledgers + ` add column memo text`)
			g = newGate(2)
			rs := runPair(t, run, msg(t, scope, "led-29-3", "", "ccc"), msg(t, scope, "led-29-4", "", "dddd"))
			if n := cachedPlan.Load(); n != 2 {
				t.Errorf("the handler saw %d 0A000 errors, want 2 (one per warm connection): the test no longer reproduces S29", n)
			}
			for i, r := range rs {
				id := fmt.Sprintf("led-29-%d", i+3)
				if r.Outcome != dedup.OutcomeProcessed || r.Attempts != 1 {
					t.Errorf("%s: outcome %s attempts %d err %v, want processed at attempt 1 (the 0A000 retried in place, not counted)", id, r.Outcome, r.Attempts, r.Err)
				}
				if rec := e.record(scope, id); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 {
					t.Errorf("%s record = %s attempts %d class %q, want SUCCEEDED attempts 1", id, rec.Status, rec.Attempts, rec.LastErrorClass)
				}
			}
			if dls := e.deadLetters(scope); len(dls) != 0 {
				t.Errorf("dead letters = %+v, want none", dls)
			}
			if n := e.count(`select total::int from ` + ledgers + ` where id = 'L'`); n != 1+2+3+4 {
				t.Errorf("ledger total = %d, want %d", n, 1+2+3+4)
			}
		})
	}
}

// S29, idemq's own statements: the records table changes under a consumer
// whose two connections have idemq's statements cached (as when idemq's
// next migration is applied beside it; here the result type of a column the
// claim returns). The claim's 0A000 is retried in place in every mode,
// lease mode included: nothing is dead-lettered, no attempt is used.
func TestS29OwnMigrationBesideALiveConsumer(t *testing.T) {
	t.Parallel()
	type runner func(ctx context.Context, s *pgstore.Store, m *dedup.Message, h pgstore.Handler) (dedup.Result, error)
	modes := map[string]runner{}
	for _, m := range s29Modes {
		modes[m.name] = m.run
	}
	modes["lease"] = func(ctx context.Context, s *pgstore.Store, m *dedup.Message, h pgstore.Handler) (dedup.Result, error) {
		return s.ProcessLeased(ctx, m, func(ctx context.Context, m *dedup.Message) error { return h(ctx, nil, m) },
			dedup.LeaseOptions{TTL: time.Minute})
	}
	for name, run := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, func(cfg *pgstore.Config) { cfg.MaxAttempts = 1 })
			st, states := e.smallStore(2, nil)
			var g *gate
			var calls atomic.Int32
			h := func(context.Context, pgx.Tx, *dedup.Message) error {
				calls.Add(1)
				if err := g.wait(); err != nil {
					return dedup.Permanent(err)
				}
				return nil
			}
			do := func(m *dedup.Message) (dedup.Result, error) { return run(e.ctx, st, m, h) }
			scope := randomName("s29own-")
			g = newGate(2)
			runPair(t, do, msg(t, scope, "own-1", "", "a"), msg(t, scope, "own-2", "", "b"))
			e.exec(`alter table ` + e.table("consumption_records") + ` alter column fingerprint_key_id type varchar`)
			before := states.count("0A000")
			g = newGate(2)
			rs := runPair(t, do, msg(t, scope, "own-3", "", "c"), msg(t, scope, "own-4", "", "d"))
			if n := states.count("0A000") - before; n < 1 {
				t.Errorf("idemq's statements failed %d times with 0A000 after the ALTER, want at least 1: the test no longer reproduces the case", n)
			}
			for i, r := range rs {
				id := fmt.Sprintf("own-%d", i+3)
				if r.Outcome != dedup.OutcomeProcessed || r.Attempts != 1 {
					t.Errorf("%s: outcome %s attempts %d err %v, want processed at attempt 1", id, r.Outcome, r.Attempts, r.Err)
				}
				if rec := e.record(scope, id); rec.Status != dedup.StatusSucceeded || rec.Attempts != 1 {
					t.Errorf("%s record = %s attempts %d, want SUCCEEDED attempts 1", id, rec.Status, rec.Attempts)
				}
			}
			if dls := e.deadLetters(scope); len(dls) != 0 {
				t.Errorf("dead letters = %+v, want none", dls)
			}
			if n := calls.Load(); n != 4 {
				t.Errorf("handler calls = %d, want 4 (once per message)", n)
			}
		})
	}
}

// S32: the recorded error is the cause. One handler inserts a row whose key
// already exists (23505), ignores the error and returns nil; another goes
// on after that failure and returns the next statement's error (25P02,
// "current transaction is aborted") wrapped twice. Both records, and their
// dead letters (MaxAttempts 1), show class pg:23505 and the original
// message text, not pg:25P02, in every mode.
func TestS32RecordedErrorIsTheCause(t *testing.T) {
	t.Parallel()
	for _, mode := range s29Modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, func(cfg *pgstore.Config) { cfg.MaxAttempts = 1 })
			tbl := e.table("accounts")
			e.exec(`create table ` + tbl + ` (id text constraint s32_accounts_pkey primary key)`)
			e.exec(`insert into ` + tbl + ` values ('taken')`)
			swallow := func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
				_, _ = tx.Exec(ctx, `insert into `+tbl+` values ($1)`, "taken")
				return nil
			}
			goOn := func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
				_, _ = tx.Exec(ctx, `insert into `+tbl+` values ($1)`, "taken")
				_, err := tx.Exec(ctx, `insert into `+tbl+` values ($1)`, "other")
				if err != nil {
					return fmt.Errorf("open account: %w", fmt.Errorf("insert: %w", err))
				}
				return nil
			}
			scope := randomName("s32-")
			for _, c := range []struct {
				id string
				h  pgstore.Handler
			}{{"s32-swallow", swallow}, {"s32-wrapped", goOn}} {
				res, err := mode.run(e.ctx, e.store, msg(t, scope, c.id, "", "x"), c.h)
				if err != nil || res.Outcome != dedup.OutcomeDeadLetter {
					t.Fatalf("%s: %+v %v, want a dead letter (MaxAttempts 1)", c.id, res, err)
				}
				if got := dedup.ErrorClass(res.Err); !strings.HasPrefix(got, "pg:23505") {
					t.Errorf("%s: Result.Err class %q (%v), want pg:23505", c.id, got, res.Err)
				}
				rec := e.record(scope, c.id)
				if !strings.HasPrefix(rec.LastErrorClass, "pg:23505") || !strings.Contains(rec.LastError, "duplicate key value") {
					t.Errorf("%s record class %q error %q, want pg:23505 and the original message", c.id, rec.LastErrorClass, rec.LastError)
				}
			}
			dls := e.deadLetters(scope)
			if len(dls) != 2 {
				t.Fatalf("dead letters = %d, want 2", len(dls))
			}
			for _, d := range dls {
				if !strings.HasPrefix(d.ErrorClass, "pg:23505") || !strings.Contains(d.Error, "duplicate key value") {
					t.Errorf("dead letter %s class %q error %q, want pg:23505 and the original message", d.MessageID, d.ErrorClass, d.Error)
				}
			}
			if n := e.count(`select count(*) from ` + tbl); n != 1 {
				t.Errorf("accounts = %d rows, want only the seed", n)
			}
		})
	}
}
