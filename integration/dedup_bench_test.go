package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
)

// BenchmarkDedupOverhead measures what atomic mode costs per message against
// a ceiling measured in the same run: the same handler write in a plain
// transaction (begin, insert, commit) with no consumption record. Sub-benchmarks:
//
//   - ceiling=plain-tx: the handler's insert alone;
//   - process-new: Store.Process of a new message (claim, insert, mark, commit);
//   - process-batch-50: Store.ProcessBatch, 50 new messages per transaction
//     (a savepoint each, one commit);
//   - process-duplicate: Store.Process of a message that already succeeded
//     (one read of the record, no lock, a commit that writes nothing; the
//     handler does not run). It also reports "wal-B/msg": the WAL the
//     server wrote per duplicate (pg_current_wal_insert_lsn before and
//     after; 0 when nothing else writes to the server meanwhile).
//
// Each reports msgs/s and, for the idemq cases, "x-ceiling": its time per
// message divided by the ceiling's from the same run.
//
//	make bench   (or: go test -run '^$' -bench DedupOverhead ./integration)
func BenchmarkDedupOverhead(b *testing.B) {
	e, insert, handler := benchPayments(b)
	var ceiling time.Duration
	perMsg := func(b *testing.B, d time.Duration) time.Duration {
		per := d / time.Duration(b.N)
		b.ReportMetric(float64(b.N)/d.Seconds(), "msgs/s")
		return per
	}

	b.Run("ceiling=plain-tx", func(b *testing.B) {
		run := randomName("")
		start := time.Now()
		for i := range b.N {
			id := fmt.Sprintf("plain-%s-%d", run, i)
			if err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error { return insert(e.ctx, tx, id) }); err != nil {
				b.Fatal(err)
			}
		}
		ceiling = perMsg(b, time.Since(start))
	})
	b.Run("process-new", func(b *testing.B) {
		run := randomName("")
		start := time.Now()
		for i := range b.N {
			res, err := e.store.Process(e.ctx, benchMsg(b, fmt.Sprintf("new-%s-%d", run, i)), handler)
			if err != nil || res.Outcome != dedup.OutcomeProcessed {
				b.Fatalf("%+v %v", res, err)
			}
		}
		if per := perMsg(b, time.Since(start)); ceiling > 0 {
			b.ReportMetric(float64(per)/float64(ceiling), "x-ceiling")
		}
	})
	b.Run("process-batch-50", func(b *testing.B) {
		run := randomName("")
		const size = 50
		start := time.Now()
		for i := 0; i < b.N; i += size {
			var batch []*dedup.Message
			for j := i; j < min(i+size, b.N); j++ {
				batch = append(batch, benchMsg(b, fmt.Sprintf("batch-%s-%d", run, j)))
			}
			res, err := e.store.ProcessBatch(e.ctx, batch, handler)
			if err != nil || res[len(res)-1].Outcome != dedup.OutcomeProcessed {
				b.Fatalf("%v", err)
			}
		}
		if per := perMsg(b, time.Since(start)); ceiling > 0 {
			b.ReportMetric(float64(per)/float64(ceiling), "x-ceiling")
		}
	})
	b.Run("process-duplicate", func(b *testing.B) {
		run := randomName("")
		m := benchMsg(b, "dup-"+run)
		if _, err := e.store.Process(e.ctx, m, handler); err != nil {
			b.Fatal(err)
		}
		walBefore := walInsertLSN(b, e)
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			res, err := e.store.Process(e.ctx, benchMsg(b, m.Identity.MessageID), handler)
			if err != nil || res.Outcome != dedup.OutcomeDuplicate {
				b.Fatalf("%+v %v", res, err)
			}
		}
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(walInsertLSN(b, e)-walBefore)/float64(b.N), "wal-B/msg")
		if per := perMsg(b, elapsed); ceiling > 0 {
			b.ReportMetric(float64(per)/float64(ceiling), "x-ceiling")
		}
	})
}

// walInsertLSN is the server's WAL insert position, in bytes.
func walInsertLSN(b *testing.B, e *env) int64 {
	b.Helper()
	var lsn int64
	if err := e.pool.QueryRow(e.ctx, `select (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8`).Scan(&lsn); err != nil {
		b.Fatal(err)
	}
	return lsn
}

func benchMsg(b *testing.B, id string) *dedup.Message {
	ident, err := dedup.NewIdentity("bench", id, "", "")
	if err != nil {
		b.Fatal(err)
	}
	return &dedup.Message{Identity: ident, Payload: []byte(`{"amount":100}`), Topic: "bench"}
}

// benchPayments is the benchmarks' shared workload: a test schema with a
// bench_payments table, insert (the business write alone, for the ceiling)
// and handler (the same write as a pgstore.Handler, keyed by message ID).
func benchPayments(b *testing.B) (*env, func(context.Context, pgx.Tx, string) error, pgstore.Handler) {
	e := setup(b, nil)
	tbl := e.table("bench_payments")
	e.exec(`create table ` + tbl + ` (payment_id text primary key, amount bigint not null)`)
	insert := func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) values ($1, 100)`, id)
		return err
	}
	handler := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		return insert(ctx, tx, m.Identity.MessageID)
	}
	return e, insert, handler
}
