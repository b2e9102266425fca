package pgstore

import (
	"context"
	"strings"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// However the handler sent the statement it ignored (Exec, QueryRow, Query
// and its rows, SendBatch, a nested transaction), the record keeps that
// statement's error as the cause of its failure (S32), not the 25P02 or
// the refused COMMIT that followed; a handler that recovered from its
// failed statement with a savepoint succeeds.
func TestSwallowedStatementIsTheCause(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("accounts")
	e.exec(`create table ` + tbl + ` (id text constraint accounts_pkey primary key)`)
	e.exec(`insert into ` + tbl + ` values ('taken')`)
	dup := `insert into ` + tbl + ` values ($1) returning id`
	for _, c := range []struct {
		name string
		send func(ctx context.Context, tx pgx.Tx)
	}{
		{"exec", func(ctx context.Context, tx pgx.Tx) { _, _ = tx.Exec(ctx, dup, "taken") }},
		{"query row", func(ctx context.Context, tx pgx.Tx) { var id string; _ = tx.QueryRow(ctx, dup, "taken").Scan(&id) }},
		{"query rows", func(ctx context.Context, tx pgx.Tx) {
			rows, _ := tx.Query(ctx, dup, "taken")
			for rows.Next() {
			}
			rows.Close()
		}},
		{"batch", func(ctx context.Context, tx pgx.Tx) {
			b := &pgx.Batch{}
			b.Queue(`select 1`)
			b.Queue(dup, "taken")
			_ = tx.SendBatch(ctx, b).Close()
		}},
		{"nested transaction", func(ctx context.Context, tx pgx.Tx) {
			sub, err := tx.Begin(ctx)
			if err == nil {
				_, _ = sub.Exec(ctx, dup, "taken")
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := "m-" + strings.ReplaceAll(c.name, " ", "-")
			res, err := e.store.Process(e.ctx, e.msg(id, "", "x"), func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
				c.send(ctx, tx)
				return nil
			})
			if err != nil || res.Outcome != dedup.OutcomeRetry || res.Attempts != 1 {
				t.Fatalf("%+v %v, want a retryable handler failure at attempt 1", res, err)
			}
			r := e.record(id)
			if r.LastErrorClass != "pg:23505:accounts_pkey" || !strings.Contains(r.LastError, "duplicate key value") {
				t.Fatalf("record class %q error %q, want pg:23505:accounts_pkey and the statement's message", r.LastErrorClass, r.LastError)
			}
		})
	}
	t.Run("recovered with a savepoint", func(t *testing.T) {
		res, err := e.store.Process(e.ctx, e.msg("m-recovered", "", "x"), func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			_ = pgx.BeginFunc(ctx, tx, func(sub pgx.Tx) error {
				_, err := sub.Exec(ctx, dup, "taken")
				return err
			}) // its error ignored: the savepoint was rolled back
			return nil
		})
		if err != nil || res.Outcome != dedup.OutcomeProcessed {
			t.Fatalf("%+v %v, want processed", res, err)
		}
	})
	if n := e.count(`select count(*) from ` + tbl); n != 1 {
		t.Fatalf("accounts = %d rows, want only the seed", n)
	}
}
