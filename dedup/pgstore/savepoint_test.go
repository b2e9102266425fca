package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// savepointDepth is a pgx QueryTracer and BatchTracer that follows the
// savepoint nesting of its connections' transactions, statement by
// statement (pipelined ones included), and keeps the deepest seen.
type savepointDepth struct {
	mu         sync.Mutex
	depth, max int
	set        int // SAVEPOINT statements seen
}

func (d *savepointDepth) see(sql string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := strings.ToLower(strings.TrimSpace(sql))
	switch {
	case strings.HasPrefix(s, "begin"), strings.HasPrefix(s, "commit"), s == "rollback":
		d.depth = 0
	case strings.Contains(s, "release savepoint"):
		d.depth--
	case strings.Contains(s, "rollback to savepoint"):
	case strings.Contains(s, "savepoint "):
		d.depth++
		d.set++
		d.max = max(d.max, d.depth)
	}
}

func (d *savepointDepth) TraceQueryStart(ctx context.Context, _ *pgx.Conn, q pgx.TraceQueryStartData) context.Context {
	d.see(q.SQL)
	return ctx
}
func (d *savepointDepth) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (d *savepointDepth) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (d *savepointDepth) TraceBatchQuery(_ context.Context, _ *pgx.Conn, q pgx.TraceBatchQueryData) {
	d.see(q.SQL)
}
func (d *savepointDepth) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (d *savepointDepth) stats() (maxDepth, set int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.max, d.set
}

// Batched mode releases each message's handler savepoint once it can no
// longer be needed (pipelined with the next claim; a reclaim replaces it),
// so savepoints never nest, however large the batch; a failing handler
// still rolls back alone: its writes are gone, the others' kept.
func TestProcessBatchSavepointsReleased(t *testing.T) {
	e := newEnv(t, nil)
	tbl := e.table("orders")
	e.exec(`create table ` + tbl + ` (message_id text primary key)`)
	tracer := &savepointDepth{}
	one := e.newPool(func(c *pgxpool.Config) { c.MaxConns, c.ConnConfig.Tracer = 1, tracer })
	st := e.newStore(one, nil)

	failOnce := map[string]bool{"m-7": true} // retryable the first time: reclaimed in the second batch
	h := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if _, err := tx.Exec(ctx, `insert into `+tbl+` values ($1)`, m.Identity.MessageID); err != nil {
			return err
		}
		switch id := m.Identity.MessageID; {
		case id == "m-3":
			return dedup.Permanent(errors.New("rejected after a write"))
		case failOnce[id]:
			failOnce[id] = false
			return errors.New("retry me, after a write")
		}
		return nil
	}
	const n = 50
	batch := func() []*dedup.Message {
		var b []*dedup.Message
		for i := range n {
			b = append(b, e.msg(fmt.Sprintf("m-%d", i), "", "p"))
		}
		return append(b, e.msg("m-1", "", "p")) // a duplicate within the batch
	}
	// First batch: stops at m-7's retry; second: m-7 reclaimed, the rest new
	// or duplicates.
	for try, stopAt := range []int{7, -1} {
		res, err := st.ProcessBatch(e.ctx, batch(), h)
		if err != nil {
			t.Fatalf("batch %d: %v", try, err)
		}
		for i, r := range res {
			want := dedup.OutcomeProcessed
			switch {
			case try == 0 && i == stopAt:
				want = dedup.OutcomeRetry
			case try == 0 && i > stopAt:
				want = ""
			case i == 3:
				want = map[int]dedup.Outcome{0: dedup.OutcomeDeadLetter, 1: dedup.OutcomeDuplicate}[try]
			case i == n, try == 1 && i < 7:
				want = dedup.OutcomeDuplicate
			}
			if r.Outcome != want {
				t.Fatalf("batch %d result %d = %+v, want %q", try, i, r, want)
			}
		}
	}
	if maxDepth, set := tracer.stats(); maxDepth > 1 || set < n {
		t.Fatalf("savepoints nested %d deep (want ≤ 1) over %d set", maxDepth, set)
	}
	if got := e.count(`select count(*) from ` + tbl); got != n-1 {
		t.Fatalf("business rows = %d, want %d (all but m-3's)", got, n-1)
	}
	if got := e.count(`select count(*) from ` + tbl + ` where message_id = 'm-3'`); got != 0 {
		t.Fatalf("m-3's write survived its failure")
	}
	if r := e.record("m-7"); r.Status != dedup.StatusSucceeded || r.Attempts != 2 {
		t.Fatalf("m-7 record = %+v", r)
	}
}
