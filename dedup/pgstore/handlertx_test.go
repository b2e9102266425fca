package pgstore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// In batched mode each handler's savepoint travels with its first statement
// (savepointTx), whatever that statement is: Exec with and without
// arguments (a multi-statement simple query), Query, QueryRow, SendBatch,
// or, sent alone first, CopyFrom and a nested tx.Begin. Handler semantics
// are unchanged: a handler that fails after writing rolls back its own
// writes only; one whose first statement fails is rolled back too; one
// that fails before sending anything rolls nothing back — in particular not
// to the previous message's savepoint, which would undo that message's
// committed-as-processed writes — and no ROLLBACK TO SAVEPOINT is sent for
// it; a handler that leaves the transaction aborted is still caught
// (marked FAILED_RETRYABLE, the batch stops there).
func TestBatchHandlerSavepointWithFirstStatement(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("sp_rows")
	e.exec(`create table ` + tbl + ` (k text primary key)`)
	rt := &roundTrips{}
	one := e.newPool(func(c *pgxpool.Config) { c.MaxConns, c.ConnConfig.Tracer = 1, rt })
	st := e.newStore(one, nil)
	ins := `insert into ` + tbl + ` (k) values ($1)`
	insert := func(ctx context.Context, tx pgx.Tx, k string) error {
		_, err := tx.Exec(ctx, ins, k)
		return err
	}
	errRejected := dedup.Permanent(errors.New("rejected"))
	handlers := map[string]Handler{
		"ok-0": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error { return insert(ctx, tx, "ok-0") },
		"ok-1": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error { return insert(ctx, tx, "ok-1") },
		// Right after ok-1's write: rolling back to ok-1's savepoint would
		// lose ok-1's row.
		"fail-before": func(context.Context, pgx.Tx, *dedup.Message) error { return errRejected },
		"fail-after-write": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			if err := insert(ctx, tx, "fail-after-write"); err != nil {
				return err
			}
			return errRejected
		},
		"fail-first-statement": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			return dedup.Permanent(insert(ctx, tx, "ok-0")) // a unique violation
		},
		"no-args": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			_, err := tx.Exec(ctx, `insert into `+tbl+` values ('no-args-a'); insert into `+tbl+` values ('no-args-b')`)
			return err
		},
		"query": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			rows, err := tx.Query(ctx, `select $1::text || '-' || g from generate_series(1, 2) g`, "query")
			if err != nil {
				return err
			}
			ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			for _, k := range ks {
				if err := insert(ctx, tx, k); err != nil {
					return err
				}
			}
			return nil
		},
		"query-row": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			var k string
			if err := tx.QueryRow(ctx, ins+` returning k`, "query-row").Scan(&k); err != nil || k != "query-row" {
				return errors.Join(err, errors.New("query-row: "+k))
			}
			return nil
		},
		"send-batch": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			b := &pgx.Batch{}
			b.Queue(ins, "send-batch-a")
			b.Queue(ins, "send-batch-b")
			return tx.SendBatch(ctx, b).Close()
		},
		"copy": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{e.biz, "sp_rows"}, []string{"k"}, pgx.CopyFromRows([][]any{{"copy-a"}, {"copy-b"}}))
			return err
		},
		"nested": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			kept, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := insert(ctx, kept, "nested-kept"); err != nil {
				return err
			}
			if err := kept.Commit(ctx); err != nil {
				return err
			}
			undone, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := insert(ctx, undone, "nested-undone"); err != nil {
				return err
			}
			return undone.Rollback(ctx)
		},
		"nested-fail": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			inner, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := insert(ctx, inner, "nested-fail"); err != nil {
				return err
			}
			if err := inner.Commit(ctx); err != nil {
				return err
			}
			return errRejected // its nested write goes with the handler's savepoint
		},
		"nothing": func(context.Context, pgx.Tx, *dedup.Message) error { return nil },
		"ok-2":    func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error { return insert(ctx, tx, "ok-2") },
		// Last: its retryable failure stops the batch.
		"left-aborted": func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			_, _ = tx.Exec(ctx, `select 1/$1::int`, 0)
			return nil
		},
	}
	order := []string{"ok-0", "ok-1", "fail-before", "fail-after-write", "fail-first-statement", "no-args", "query", "query-row",
		"send-batch", "copy", "nested", "nested-fail", "nothing", "ok-2", "left-aborted"}
	want := map[string]dedup.Outcome{"fail-before": dedup.OutcomeDeadLetter, "fail-after-write": dedup.OutcomeDeadLetter,
		"fail-first-statement": dedup.OutcomeDeadLetter, "nested-fail": dedup.OutcomeDeadLetter, "left-aborted": dedup.OutcomeRetry}
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		return handlers[m.Identity.MessageID](ctx, tx, m)
	}
	msgs := make([]*dedup.Message, len(order))
	for i, id := range order {
		msgs[i] = e.msg(id, "", "p")
	}
	rt.count(true)
	res, err := st.ProcessBatch(e.ctx, msgs, h)
	sent := rt.count(false)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range order {
		w, ok := want[id]
		if !ok {
			w = dedup.OutcomeProcessed
		}
		if res[i].Outcome != w {
			t.Errorf("%s: %+v, want %s", id, res[i], w)
		}
	}
	var got []string
	rows, err := e.pool.Query(e.ctx, `select k from `+tbl+` order by k`)
	if err == nil {
		got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatal(err)
	}
	wantRows := []string{"copy-a", "copy-b", "nested-kept", "no-args-a", "no-args-b", "ok-0", "ok-1", "ok-2",
		"query-1", "query-2", "query-row", "send-batch-a", "send-batch-b"}
	if !slices.Equal(got, wantRows) {
		t.Errorf("business rows = %q, want %q (each failing handler's own writes gone, every other kept)", got, wantRows)
	}
	// A ROLLBACK TO SAVEPOINT for each failed handler that sent something
	// (fail-after-write, fail-first-statement, nested-fail, left-aborted);
	// none for fail-before, which sent nothing.
	rollbacks := 0
	for _, s := range sent {
		rollbacks += strings.Count(s, "rollback to savepoint idemq_handler")
	}
	if rollbacks != 4 {
		t.Errorf("%d rollbacks to the handler's savepoint, want 4 (none for the handler that sent nothing); sent: %q", rollbacks, sent)
	}
	// No savepoint of idemq's was sent alone except before CopyFrom and a
	// nested Begin (copy, nested, nested-fail): every other rides with a
	// statement.
	alone := 0
	for _, s := range sent {
		if strings.HasPrefix(s, "release savepoint idemq_handler") && !strings.Contains(s, tbl) && !strings.Contains(s, "select") {
			alone++
		}
	}
	if alone != 3 {
		t.Errorf("%d savepoints sent alone, want 3 (before CopyFrom and the two nested Begins); sent: %q", alone, sent)
	}
	if r := e.record("left-aborted"); r.Status != dedup.StatusFailedRetryable {
		t.Errorf("left-aborted record = %+v, want FAILED_RETRYABLE", r)
	}
}

// A handler statement that fails before the batch's savepoint could run — a
// statement pgx has to prepare first and that does not prepare (a syntax
// error), or a simple query (Exec without arguments) that fails — leaves it
// unknown whether the savepoint was set: the store never rolls back to the
// previous message's savepoint then (which would undo that message's
// writes); the batch's try fails and is rerun one message per transaction,
// with the same outcomes as before: the failing message dead-lettered, the
// others processed, their writes kept.
func TestBatchHandlerStatementFailsBeforeSavepoint(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("sp_pre")
	e.exec(`create table ` + tbl + ` (k text primary key)`)
	for _, bad := range []string{"syntax-with-args", "simple-query"} {
		h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			var err error
			switch id := m.Identity.MessageID; id {
			case bad + "-bad":
				if bad == "simple-query" {
					_, err = tx.Exec(ctx, `insert into `+tbl+` values ('x'); selec 1`)
				} else {
					_, err = tx.Exec(ctx, `insert into `+tbl+` valuez ($1)`, id)
				}
				return dedup.Permanent(err)
			default:
				_, err = tx.Exec(ctx, `insert into `+tbl+` values ($1)`, id)
			}
			return err
		}
		msgs := []*dedup.Message{e.msg(bad+"-a", "", "p"), e.msg(bad+"-bad", "", "p"), e.msg(bad+"-b", "", "p")}
		res, err := e.store.ProcessBatch(e.ctx, msgs, h)
		if err != nil {
			t.Fatal(err)
		}
		for i, w := range []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeDeadLetter, dedup.OutcomeProcessed} {
			if res[i].Outcome != w {
				t.Errorf("%s: result %d = %+v, want %s", bad, i, res[i], w)
			}
		}
		if got := e.count(`select count(*) from `+tbl+` where k in ($1, $2)`, bad+"-a", bad+"-b"); got != 2 {
			t.Errorf("%s: %d of the other messages' rows kept, want 2", bad, got)
		}
	}
	if got := e.count(`select count(*) from ` + tbl); got != 4 {
		t.Errorf("business rows = %d, want 4", got)
	}
}

// Counted on the wire (tripConn): a batch of n new messages whose Handler
// sends one statement costs n + 3 round trips — BEGIN, the claim (with the
// first savepoint), one per handler statement (each carrying the release of
// the previous savepoint and the next one), COMMIT. Before the savepoint
// rode with the handler's statement it was 2n + 2.
func TestBatchHandlerRoundTripsOnTheWire(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("sp_wire")
	e.exec(`create table ` + tbl + ` (k text primary key)`)
	st, trips := e.tripStore(nil)
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		_, err := tx.Exec(ctx, `insert into `+tbl+` values ($1)`, m.Identity.MessageID)
		return err
	}
	const n = 50
	for i, prefix := range []string{"warm", "count"} { // the first fills pgx's statement cache
		before := trips.Load()
		res, err := st.ProcessBatch(e.ctx, e.batchOf(prefix, n), h)
		if err != nil {
			t.Fatal(err)
		}
		for j, r := range res {
			if r.Outcome != dedup.OutcomeProcessed {
				t.Fatalf("%s: result %d = %+v", prefix, j, r)
			}
		}
		if got := trips.Load() - before; i == 1 && got != n+3 {
			t.Fatalf("%d round trips for a batch of %d new messages, want %d (n + 3)", got, n, n+3)
		}
	}
}
