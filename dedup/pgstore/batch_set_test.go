package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// roundTrips is a pgx QueryTracer and BatchTracer that counts round trips:
// one per statement sent alone, one per pipeline (batch), and keeps the SQL
// of each, a pipeline's statements joined by " ;; ".
type roundTrips struct {
	mu   sync.Mutex
	on   bool
	sent []string
	cur  []string // the statements of the pipeline being sent
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, q pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on {
		r.sent = append(r.sent, strings.TrimSpace(q.SQL))
	}
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cur = nil
	return ctx
}
func (r *roundTrips) TraceBatchQuery(_ context.Context, _ *pgx.Conn, q pgx.TraceBatchQueryData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cur = append(r.cur, strings.TrimSpace(q.SQL))
}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on {
		r.sent = append(r.sent, strings.Join(r.cur, " ;; "))
	}
}

// count starts counting from zero (on) or stops, and returns what was sent.
func (r *roundTrips) count(on bool) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.sent
	r.on, r.sent = on, nil
	return out
}

// touching are the round trips of sent whose SQL names table.
func touching(sent []string, table string) []string {
	var out []string
	for _, s := range sent {
		if strings.Contains(s, table) {
			out = append(out, s)
		}
	}
	return out
}

// batchOf is n messages "<prefix>-<i>" with business keys "<prefix>-bk-<i>".
func (e *storeEnv) batchOf(prefix string, n int) []*dedup.Message {
	msgs := make([]*dedup.Message, n)
	for i := range msgs {
		msgs[i] = e.msg(fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("%s-bk-%d", prefix, i), "p")
	}
	return msgs
}

// unnestInsert is a BatchHandler writing one business row per message with
// one statement.
func unnestInsert(tbl string) BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message) error {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.Identity.MessageID
		}
		_, err := tx.Exec(ctx, `insert into `+tbl+` (message_id) select unnest($1::text[])`, ids)
		return err
	}
}

// A batch is claimed in ONE round trip, whatever its size: the only round
// trip of a batch that touches the consumption-record table is the claim
// pipeline (insert + read, and the ordered lock), in both batched modes.
// With a BatchHandler, a batch of 100 new messages costs exactly four round
// trips: BEGIN, the claim, the handler's own statement, COMMIT. With a
// per-message Handler, a batch of n new messages costs n + 3: each
// message's savepoint (release + set) travels with its handler's first
// statement (before, each cost a round trip of its own: 2n + 2), and no
// record statement.
func TestBatchClaimIsOneRoundTrip(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("rows")
	e.exec(`create table ` + tbl + ` (message_id text)`)
	rt := &roundTrips{}
	one := e.newPool(func(c *pgxpool.Config) { c.MaxConns, c.ConnConfig.Tracer = 1, rt })
	st := e.newStore(one, nil)
	rec := e.store.q.tables["records"].(string)
	const n = 100

	perMsg := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		_, err := tx.Exec(ctx, `insert into `+tbl+` values ($1)`, m.Identity.MessageID)
		return err
	}
	for _, mode := range []string{"batchhandler", "handler"} {
		run := func(msgs []*dedup.Message) []dedup.Result {
			var res []dedup.Result
			var err error
			if mode == "batchhandler" {
				res, err = st.ProcessBatchSet(e.ctx, msgs, unnestInsert(tbl))
			} else {
				res, err = st.ProcessBatch(e.ctx, msgs, perMsg)
			}
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		run(e.batchOf("warm-"+mode, n)) // prepares the statements (pgx's cache)
		rt.count(true)
		res := run(e.batchOf(mode, n))
		sent := rt.count(false)
		for i, r := range res {
			if r.Outcome != dedup.OutcomeProcessed {
				t.Fatalf("%s: result %d = %+v", mode, i, r)
			}
		}
		claims := touching(sent, rec)
		if len(claims) != 1 || !strings.Contains(claims[0], "insert into "+rec) || !strings.Contains(claims[0], "for update") {
			t.Fatalf("%s: %d round trips touch the record table, want 1 (the claim pipeline); the first: %.300q", mode, len(claims), claims)
		}
		want := 4 // BEGIN, claim, the handler's insert, COMMIT
		if mode == "handler" {
			want = 1 + 1 + n + 1 // BEGIN, claim (+ first savepoint), n handler inserts (+ each later one's savepoint), COMMIT
		}
		if len(sent) != want {
			t.Fatalf("%s: %d round trips for a batch of %d, want %d; the first: %.300q", mode, len(sent), n, want, sent)
		}
	}
	if got := e.count(`select count(*) from ` + tbl); got != 4*n {
		t.Fatalf("business rows = %d, want %d", got, 4*n)
	}
}

// A new record is written once: inserted SUCCEEDED by the claim, never
// updated (no PROCESSING → SUCCEEDED round trip, no second row version); a
// batch of duplicates writes nothing at all. An update trigger on the
// record table counts every UPDATE, in both batched modes.
func TestBatchNewRecordsWrittenOnce(t *testing.T) {
	e := newOwnSchemaEnv(t, nil)
	tbl, upd := e.table("rows"), e.table("record_updates")
	e.exec(`create table ` + tbl + ` (message_id text)`)
	e.exec(`create table ` + upd + ` (message_id text, old_status text, new_status text)`)
	fn := pgx.Identifier{e.biz, "count_update"}.Sanitize()
	e.exec(`create function ` + fn + `() returns trigger language plpgsql as $$
begin insert into ` + upd + ` values (new.message_id, old.status, new.status); return new; end $$`)
	e.exec(`create trigger count_update after update on ` + e.records() + ` for each row execute function ` + fn + `()`)

	perMsg := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		_, err := tx.Exec(ctx, `insert into `+tbl+` values ($1)`, m.Identity.MessageID)
		return err
	}
	for _, mode := range []string{"batchhandler", "handler"} {
		for try := range 2 { // new, then all duplicates
			msgs := e.batchOf(mode, 50)
			var res []dedup.Result
			var err error
			if mode == "batchhandler" {
				res, err = e.store.ProcessBatchSet(e.ctx, msgs, unnestInsert(tbl))
			} else {
				res, err = e.store.ProcessBatch(e.ctx, msgs, perMsg)
			}
			want := []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeDuplicate}[try]
			if err != nil || len(res) != 50 || res[0].Outcome != want || res[49].Outcome != want {
				t.Fatalf("%s try %d: %v, %v", mode, try, res, err)
			}
		}
	}
	if n := e.count(`select count(*) from ` + upd); n != 0 {
		t.Fatalf("%d record updates, want 0 (each new record inserted SUCCEEDED, duplicates read only)", n)
	}
	if n := e.count(`select count(*) from ` + e.records() + ` where status = 'SUCCEEDED' and expires_at is not null`); n != 100 {
		t.Fatalf("%d SUCCEEDED records with an expiry, want 100", n)
	}
}

// Copies within one batch and across batches, business-key collisions and
// conflicts inside a batch, in both batched modes: the first copy is new,
// a later one a duplicate (by message ID or business key) or a conflict
// (dead-lettered), in order; the batch handler sees the new messages only,
// in order.
func TestBatchDuplicatesAndConflictsInsideABatch(t *testing.T) {
	for _, mode := range []string{"batchhandler", "handler"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, nil)
			tbl := e.table("rows")
			e.exec(`create table ` + tbl + ` (message_id text)`)
			var calls [][]string
			bh := func(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message) error {
				var ids []string
				for _, m := range msgs {
					if m.Attempt != 1 {
						return fmt.Errorf("%s: Attempt %d", m.Identity.MessageID, m.Attempt)
					}
					ids = append(ids, m.Identity.MessageID)
				}
				calls = append(calls, ids)
				return unnestInsert(tbl)(ctx, tx, msgs)
			}
			run := func(msgs []*dedup.Message) []dedup.Result {
				t.Helper()
				var res []dedup.Result
				var err error
				if mode == "batchhandler" {
					res, err = e.store.ProcessBatchSet(e.ctx, msgs, bh)
				} else {
					res, err = e.store.ProcessBatch(e.ctx, msgs, func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
						return bh(ctx, tx, []*dedup.Message{m})
					})
				}
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			batch := func() []*dedup.Message {
				return []*dedup.Message{
					e.msg("a", "", "x"),
					e.msg("b", "bk-1", "x"),
					e.msg("a", "", "x"),      // same ID, same payload: duplicate by message ID
					e.msg("c", "bk-1", "x"),  // b's business key, same payload: duplicate by business key
					e.msg("a", "", "other"),  // a's ID, another payload: conflict
					e.msg("d", "bk-1", "y"),  // b's business key, another payload: conflict
					e.msg("e", "bk-2", "x"),  // new
					e.msg("b", "bk-9", "x"),  // b's ID and payload, another business key: duplicate by message ID
					e.msg("f", "", "x"),      // new
					e.msg("f", "bk-10", "x"), // f's ID and payload, a business key added: duplicate by message ID
				}
			}
			type want struct {
				out dedup.Outcome
				by  dedup.MatchedBy
			}
			dup := func(by dedup.MatchedBy) want { return want{dedup.OutcomeDuplicate, by} }
			conflict := func(by dedup.MatchedBy) want { return want{dedup.OutcomeConflict, by} }
			later := []want{dup(dedup.ByMessageID), dup(dedup.ByMessageID), dup(dedup.ByMessageID), dup(dedup.ByBusinessKey),
				conflict(dedup.ByMessageID), conflict(dedup.ByBusinessKey), dup(dedup.ByMessageID), dup(dedup.ByMessageID),
				dup(dedup.ByMessageID), dup(dedup.ByMessageID)}
			first := slices.Clone(later)
			for _, i := range []int{0, 1, 6, 8} {
				first[i] = want{dedup.OutcomeProcessed, ""}
			}
			for try, wants := range [][]want{first, later} {
				for i, r := range run(batch()) {
					if r.Outcome != wants[i].out || r.MatchedBy != wants[i].by {
						t.Fatalf("batch %d result %d = %+v, want %s by %q", try, i, r, wants[i].out, wants[i].by)
					}
					if try == 0 && r.Outcome == dedup.OutcomeConflict && r.DeadLetterID == 0 {
						t.Fatalf("batch %d result %d: a conflict without its dead letter: %+v", try, i, r)
					}
				}
			}
			got := fmt.Sprint(calls)
			if mode == "batchhandler" && got != "[[a b e f]]" {
				t.Fatalf("batch handler calls %s, want [[a b e f]] (the new messages only, in order)", got)
			}
			if mode == "handler" && got != "[[a] [b] [e] [f]]" {
				t.Fatalf("handler calls %s, want [[a] [b] [e] [f]]", got)
			}
			if n := e.count(`select count(*) from ` + tbl); n != 4 {
				t.Fatalf("business rows = %d, want 4", n)
			}
		})
	}
}

// 20 batches run at once over overlapping message IDs (each a random
// selection, in random order, of 60 IDs), half with a BatchHandler and half
// with a per-message Handler: every message's handler effect is there
// exactly once, and every result is processed or a duplicate, each ID
// processed once. Batches that wait on each other's claims (and deadlock
// retries, if any) lose nothing and double nothing.
func TestConcurrentBatchesOverlappingExactlyOnce(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("rows")
	e.exec(`create table ` + tbl + ` (message_id text)`)
	pool := e.newPool(func(c *pgxpool.Config) { c.MaxConns = 8 })
	st := e.newStore(pool, nil)
	const ids, batches, size = 60, 20, 30
	var mu sync.Mutex
	processed := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, batches)
	for b := range uint64(batches) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(b, 7))
			var msgs []*dedup.Message
			for _, i := range r.Perm(ids)[:size] {
				id := fmt.Sprintf("m-%d", i)
				msgs = append(msgs, e.msg(id, "bk-"+id, "p"))
			}
			var res []dedup.Result
			var err error
			if b%2 == 0 {
				res, err = st.ProcessBatchSet(e.ctx, msgs, unnestInsert(tbl))
			} else {
				res, err = st.ProcessBatch(e.ctx, msgs, func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
					_, err := tx.Exec(ctx, `insert into `+tbl+` values ($1)`, m.Identity.MessageID)
					return err
				})
			}
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i, x := range res {
				switch x.Outcome {
				case dedup.OutcomeProcessed:
					processed[msgs[i].Identity.MessageID]++
				case dedup.OutcomeDuplicate:
				default:
					errs <- fmt.Errorf("batch %d result %d (%s) = %+v", b, i, msgs[i].Identity.MessageID, x)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	rows, err := e.pool.Query(e.ctx, `select message_id, count(*) from `+tbl+` group by 1`)
	if err != nil {
		t.Fatal(err)
	}
	effects, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		ID string
		N  int
	}])
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range effects {
		if x.N != 1 || processed[x.ID] != 1 {
			t.Errorf("%s: %d business rows, processed %d times; want 1 and 1", x.ID, x.N, processed[x.ID])
		}
	}
	if len(effects) != len(processed) {
		t.Errorf("%d IDs with an effect, %d processed", len(effects), len(processed))
	}
}

// A failing BatchHandler does not block its batch: the batch is rerun one
// message per transaction, the handler called with one-message slices, so
// that the message at fault (here a Permanent error, then a panic) is
// dead-lettered or marked for a retry while the others commit, each effect
// once.
func TestBatchHandlerCulpritFallback(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("rows")
	e.exec(`create table ` + tbl + ` (message_id text)`)
	var calls []int
	bh := func(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message) error {
		calls = append(calls, len(msgs))
		if err := unnestInsert(tbl)(ctx, tx, msgs); err != nil {
			return err
		}
		for _, m := range msgs {
			switch m.Identity.MessageID {
			case "m-2":
				return dedup.Permanent(errors.New("poison, after its write"))
			case "m-4":
				panic("handler bug")
			}
		}
		return nil
	}
	var msgs []*dedup.Message
	for i := range 6 {
		msgs = append(msgs, e.msg(fmt.Sprintf("m-%d", i), "", "p"))
	}
	res, err := e.store.ProcessBatchSet(e.ctx, msgs, bh)
	if err != nil {
		t.Fatal(err)
	}
	wants := []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeProcessed, dedup.OutcomeDeadLetter, dedup.OutcomeProcessed, dedup.OutcomeRetry, ""}
	for i, r := range res {
		if r.Outcome != wants[i] {
			t.Fatalf("result %d = %+v, want %q", i, r, wants[i])
		}
	}
	if fmt.Sprint(calls) != "[6 1 1 1 1 1]" {
		t.Fatalf("handler calls with %v messages, want [6 1 1 1 1 1] (the batch, then one by one up to the retry)", calls)
	}
	if got := e.count(`select count(*) from ` + tbl + ` where message_id in ('m-0', 'm-1', 'm-3')`); got != 3 {
		t.Fatalf("%d effects of the good messages, want 3", got)
	}
	if got := e.count(`select count(*) from ` + tbl + ` where message_id in ('m-2', 'm-4', 'm-5')`); got != 0 {
		t.Fatalf("%d effects of failed or unattempted messages survived", got)
	}
	if r := e.record("m-4"); r.Status != dedup.StatusFailedRetryable || r.Attempts != 1 {
		t.Fatalf("m-4 = %+v, want FAILED_RETRYABLE after 1 attempt", r)
	}
	if n := e.count(`select count(*) from `+e.records()+` where scope = $1 and message_id = 'm-5'`, e.scope); n != 0 {
		t.Fatalf("m-5, after the retry, has a record")
	}
}

// The batch stops at a message that must be retried (here a record another
// owner is processing: PROCESSING, lease live): in both modes the messages
// after it are not attempted and leave no record (the claim inserted them;
// they are taken back before COMMIT), and a batch handler is called with
// the messages before it only. A FAILED_RETRYABLE record is taken again:
// the batch handler gets it with its Attempt counted.
func TestBatchStopsAtRetryAndUnclaimsTheRest(t *testing.T) {
	for _, mode := range []string{"batchhandler", "handler"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, nil)
			tbl := e.table("rows")
			e.exec(`create table ` + tbl + ` (message_id text)`)
			sum, keyID, err := e.store.fp.Sum([]byte("p"))
			if err != nil {
				t.Fatal(err)
			}
			e.exec(`insert into `+e.records()+` (scope, message_id, fingerprint, fingerprint_key_id, status, attempts, lease_until, owner_token)
values ($1, 'held', $2, $3, 'PROCESSING', 1, now() + interval '1 hour', gen_random_uuid()),
       ($1, 'again', $2, $3, 'FAILED_RETRYABLE', 1, null, null)`, e.scope, sum, keyID)
			var calls []string
			bh := func(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message) error {
				for _, m := range msgs {
					calls = append(calls, fmt.Sprintf("%s@%d", m.Identity.MessageID, m.Attempt))
				}
				return unnestInsert(tbl)(ctx, tx, msgs)
			}
			msgs := []*dedup.Message{e.msg("new-1", "", "p"), e.msg("again", "", "p"), e.msg("held", "", "p"), e.msg("new-2", "", "p")}
			var res []dedup.Result
			if mode == "batchhandler" {
				res, err = e.store.ProcessBatchSet(e.ctx, msgs, bh)
			} else {
				res, err = e.store.ProcessBatch(e.ctx, msgs, func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
					return bh(ctx, tx, []*dedup.Message{m})
				})
			}
			if err != nil {
				t.Fatal(err)
			}
			wants := []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeProcessed, dedup.OutcomeRetry, ""}
			for i, r := range res {
				if r.Outcome != wants[i] {
					t.Fatalf("result %d = %+v, want %q", i, r, wants[i])
				}
			}
			if got := strings.Join(calls, ","); got != "new-1@1,again@2" {
				t.Fatalf("handler got %s, want new-1@1,again@2", got)
			}
			if r := e.record("again"); r.Status != dedup.StatusSucceeded || r.Attempts != 2 {
				t.Fatalf("again = %+v, want SUCCEEDED after 2 attempts", r)
			}
			if n := e.count(`select count(*) from `+e.records()+` where scope = $1 and message_id = 'new-2'`, e.scope); n != 0 {
				t.Fatalf("new-2, after the stop, has a record")
			}
			// Its next delivery is new.
			res, err = e.store.ProcessBatchSet(e.ctx, []*dedup.Message{e.msg("new-2", "", "p")}, bh)
			if err != nil || res[0].Outcome != dedup.OutcomeProcessed {
				t.Fatalf("new-2 redelivered: %+v, %v", res, err)
			}
		})
	}
}

// A batch handler that swallows a statement error (returns nil with the
// transaction aborted) fails its batch, which the one-by-one rerun then
// pins on that message alone.
func TestBatchHandlerLeavingTheTransactionAborted(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("rows")
	e.exec(`create table ` + tbl + ` (message_id text)`)
	bh := func(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message) error {
		if err := unnestInsert(tbl)(ctx, tx, msgs); err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Identity.MessageID == "m-1" {
				_, _ = tx.Exec(ctx, `select 1/0`) // error swallowed
			}
		}
		return nil
	}
	res, err := e.store.ProcessBatchSet(e.ctx, []*dedup.Message{e.msg("m-0", "", "p"), e.msg("m-1", "", "p"), e.msg("m-2", "", "p")}, bh)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Outcome != dedup.OutcomeProcessed || res[1].Outcome != dedup.OutcomeRetry || res[2].Outcome != "" {
		t.Fatalf("results %+v; want m-0 processed, m-1 to retry, m-2 not attempted", res)
	}
	if got := e.count(`select count(*) from ` + tbl); got != 1 {
		t.Fatalf("%d business rows, want m-0's only", got)
	}
}

// On a record table of 200,000 rows, with generic plans forced (what pgx's
// statement cache gets after a few executions), a batch claim never scans
// the table, in either batched mode: the read and the lock go through the
// two unique indexes (message ID, business key), new messages and
// duplicates of both keys alike.
func TestNoTableScanOnBatchClaim(t *testing.T) {
	e := newOwnSchemaEnv(t, nil)
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
	noopSet := func(context.Context, pgx.Tx, []*dedup.Message) error { return nil }
	for i := range 8 {
		var msgs []*dedup.Message
		for j := range 20 {
			id, bk := fmt.Sprintf("new-%d-%d", i, j), fmt.Sprintf("nbk-%d-%d", i, j)
			msgs = append(msgs, e.msg(id, bk, "x"), e.msg(id, bk, "x"), e.msg(id+"-resend", bk, "x"))
		}
		msgs = append(msgs, e.msg(fmt.Sprintf("old-%d", 2*i+1), "", "y"), e.msg(fmt.Sprintf("other-%d", i), fmt.Sprintf("bk-%d", 2*i+2), "y"))
		if _, err := st.ProcessBatch(e.ctx, msgs, noop); err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			m.Identity.MessageID += "-set"
		}
		if _, err := st.ProcessBatchSet(e.ctx, msgs, noopSet); err != nil {
			t.Fatal(err)
		}
	}
	if after := seqScans(); after != before {
		t.Fatalf("the batch claims scanned the 200,000-row record table %d times (generic plans)", after-before)
	}
}

// A BatchHandler that fails with one message to run is not run again: the
// failure is that message's, marked as Process marks a handler failure after
// its rollback (one execution, one attempt), while the batch's duplicates
// are answered as before.
func TestBatchHandlerSoleFailureRunsOnce(t *testing.T) {
	e := newEnv(t, nil)
	e.finish("done", "p", dedup.StatusSucceeded)
	var calls int
	bh := func(context.Context, pgx.Tx, []*dedup.Message) error {
		calls++
		return fmt.Errorf("provider timeout %d", calls)
	}
	res, err := e.store.ProcessBatchSet(e.ctx, []*dedup.Message{e.msg("done", "", "p"), e.msg("m-1", "", "p")}, bh)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Outcome != dedup.OutcomeDuplicate || res[1].Outcome != dedup.OutcomeRetry || !res[1].HandlerCalled || res[1].Attempts != 1 {
		t.Fatalf("results %+v; want the duplicate, then m-1 to retry after 1 attempt", res)
	}
	if calls != 1 {
		t.Fatalf("handler called %d times for one delivery, want 1", calls)
	}
	if r := e.record("m-1"); r.Status != dedup.StatusFailedRetryable || r.Attempts != 1 || r.LastError != "provider timeout 1" {
		t.Fatalf("m-1 = %+v, want FAILED_RETRYABLE, 1 attempt, the error kept", r)
	}
}
