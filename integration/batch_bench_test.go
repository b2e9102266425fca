package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/jackc/pgx/v5"
)

// BenchmarkBatch100 measures batched mode (Store.ProcessBatch, 100 messages
// per batch, one lane) with the Redis fast path configured:
//
//   - unique: new messages (each claims its record and runs the handler's
//     insert; Redis misses);
//   - unique/batchhandler: new messages through Store.ProcessBatchSet, the
//     BatchHandler writing the batch's business rows with one unnest insert;
//   - duplicates-redis: copies of messages that already succeeded (set up
//     untimed), answered from Redis.
//
// b.N is the number of messages; each reports msgs/s.
//
//	make bench   (or: go test -run '^$' -bench Batch100 -benchtime 20000x ./integration)
func BenchmarkBatch100(b *testing.B) {
	e, _, handler := benchPayments(b)
	fast, err := redisfast.New(redisfast.Config{Client: redisClient(b), Prefix: randomName("fp-"), Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	st, err := pgstore.New(e.pool, pgstore.Config{Schema: e.schema, Fingerprinter: testFingerprinter(b), FastPath: fast})
	if err != nil {
		b.Fatal(err)
	}
	const size = 100
	batches := func(b *testing.B, run string, want dedup.Outcome) {
		for i := 0; i < b.N; i += size {
			batch := make([]*dedup.Message, 0, size)
			for j := i; j < min(i+size, b.N); j++ {
				batch = append(batch, benchMsg(b, fmt.Sprintf("b100-%s-%d", run, j)))
			}
			res, err := st.ProcessBatch(e.ctx, batch, handler)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range res {
				if r.Outcome != want {
					b.Fatalf("%+v, want %s", r, want)
				}
			}
		}
	}
	b.Run("unique", func(b *testing.B) {
		run := randomName("")
		start := time.Now()
		batches(b, run, dedup.OutcomeProcessed)
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
	b.Run("unique/batchhandler", func(b *testing.B) {
		bh := unnestPayments(e.table("bench_payments"))
		run := randomName("")
		start := time.Now()
		for i := 0; i < b.N; i += size {
			batch := make([]*dedup.Message, 0, size)
			for j := i; j < min(i+size, b.N); j++ {
				batch = append(batch, benchMsg(b, fmt.Sprintf("b100-%s-%d", run, j)))
			}
			res, err := st.ProcessBatchSet(e.ctx, batch, bh)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range res {
				if r.Outcome != dedup.OutcomeProcessed {
					b.Fatalf("%+v, want %s", r, dedup.OutcomeProcessed)
				}
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
	b.Run("duplicates-redis", func(b *testing.B) {
		run := randomName("")
		batches(b, run, dedup.OutcomeProcessed)
		b.ResetTimer()
		start := time.Now()
		batches(b, run, dedup.OutcomeDuplicate)
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
}

// unnestPayments is a BatchHandler writing one payment row per message of
// the batch with one statement (benchPayments' table).
func unnestPayments(tbl string) pgstore.BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message) error {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.Identity.MessageID
		}
		_, err := tx.Exec(ctx, `insert into `+tbl+` (payment_id, amount) select unnest($1::text[]), 100`, ids)
		return err
	}
}
