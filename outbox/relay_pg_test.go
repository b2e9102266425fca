package outbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sendCounter is a pgx tracer counting what a connection sends: statements
// sent alone (each one round trip), pipelined batches (one round trip each
// once their statements are prepared) and prepares.
type sendCounter struct {
	queries, batches, prepares atomic.Int64
	sql                        atomic.Pointer[[]string]
}

func (c *sendCounter) note(s string) {
	for {
		old := c.sql.Load()
		var next []string
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, strings.Join(strings.Fields(s), " "))
		if c.sql.CompareAndSwap(old, &next) {
			return
		}
	}
}

func (c *sendCounter) reset() {
	c.queries.Store(0)
	c.batches.Store(0)
	c.prepares.Store(0)
	c.sql.Store(nil)
}

func (c *sendCounter) sent() []string {
	if p := c.sql.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *sendCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.queries.Add(1)
	c.note(d.SQL)
	return ctx
}
func (c *sendCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *sendCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	c.batches.Add(1)
	var parts []string
	for _, q := range d.Batch.QueuedQueries {
		parts = append(parts, strings.Fields(q.SQL)[0])
	}
	c.note("batch[" + strings.Join(parts, ", ") + "]")
	return ctx
}
func (c *sendCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *sendCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (c *sendCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.prepares.Add(1)
	return ctx
}
func (c *sendCounter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// tracedOutbox returns an Outbox on ob's table whose pool holds a single
// connection traced by the returned counter.
func tracedOutbox(t *testing.T, ctx context.Context, ob *Outbox) (*Outbox, *sendCounter) {
	t.Helper()
	pc, err := pgxpool.ParseConfig(os.Getenv("TEST_POSTGRES_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	sc := &sendCounter{}
	pc.ConnConfig.Tracer = sc
	pc.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	traced, err := New(pool, ob.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return traced, sc
}

// ackAll is a ChainPublisher that acknowledges every row, except the rows
// of the keys in fail, which fail.
type ackAll struct{ fail map[string]bool }

func (ackAll) Publish(context.Context, []Envelope) error {
	return errors.New("ackAll: PublishChains only")
}

func (p ackAll) PublishChains(_ context.Context, chains [][]Envelope) []ChainResult {
	out := make([]ChainResult, len(chains))
	for i, c := range chains {
		if len(c) > 0 && p.fail[string(c[0].Key)] {
			out[i].Err = errors.New("broker says no")
			continue
		}
		out[i].Acked = len(c)
	}
	return out
}

// addKeyed commits n rows over keys keys (row i has key "k<i mod keys>").
func addKeyed(t *testing.T, ctx context.Context, ob *Outbox, n, keys int) {
	t.Helper()
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{Topic: "t", Key: []byte(fmt.Sprintf("k%d", i%keys)), Payload: []byte(fmt.Sprint(i))}
	}
	tx, err := ob.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := ob.AddBatch(ctx, tx, msgs); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// A batch that the oldest rows fill costs two round trips: BEGIN with the
// claim statement in one pipeline, the marks (published and failed) with
// COMMIT in another; nothing is sent alone.
func TestRelayBatchTakesTwoRoundTrips(t *testing.T) {
	ob, ctx := pgOutbox(t)
	addKeyed(t, ctx, ob, 1000, 50)
	traced, sc := tracedOutbox(t, ctx, ob)
	for _, tc := range []struct {
		name              string
		pub               ackAll
		published, failed int
	}{
		{"all acknowledged", ackAll{}, 100, 0},
		// 50 keys, two rows each: a failed head holds its follower back.
		{"some failed", ackAll{fail: map[string]bool{"k7": true, "k8": true}}, 96, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A first batch prepares the statements on the connection.
			warm, err := NewRelay(traced, ackAll{}, RelayConfig{Name: "warm", BatchSize: 100, DisablePurge: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := warm.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			r, err := NewRelay(traced, tc.pub, RelayConfig{Name: "rt", BatchSize: 100, DisablePurge: true})
			if err != nil {
				t.Fatal(err)
			}
			sc.reset()
			res, err := r.RunOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if res.Claimed != 100 || res.Published != tc.published || res.Failed != tc.failed {
				t.Fatalf("RunOnce = %+v, want 100 rows claimed, %d published, %d failed", res, tc.published, tc.failed)
			}
			if q, b, p := sc.queries.Load(), sc.batches.Load(), sc.prepares.Load(); q != 0 || b != 2 || p != 0 {
				t.Fatalf("one batch sent %d statements alone, %d pipelines, %d prepares (%q); want 0, 2, 0",
					q, b, p, sc.sent())
			}
		})
	}
}

// The claim locks its heads by looking their seqs up in the primary key
// whatever the table's statistics say: on a table never analyzed
// (autovacuum off), where Postgres guesses that 0.5% of the rows are
// unpublished, with custom plans and generic ones, the subtree of the lock
// (LockRows) finds the rows by "seq = ANY" on an index and neither scans the
// table nor joins the candidates with the unpublished rows (a semi join over
// every unpublished row took seconds per claim on such a table).
func TestRelayClaimPlanNeedsNoStatistics(t *testing.T) {
	ob, ctx := pgOutbox(t)
	if _, err := ob.pool.Exec(ctx, "alter table "+ob.q.table+" set (autovacuum_enabled = false)"); err != nil {
		t.Fatal(err)
	}
	addKeyed(t, ctx, ob, 5000, 5000)
	conn, err := ob.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, "set plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		for _, stmt := range []struct {
			name, sql, args string
		}{
			{"claim", ob.q.claimSQL, "500, 500, null, 1000"},
			{"claim_walk", ob.q.claimWalkSQL, `500, 500, '{1,2,3}', '', '\x', 500`},
		} {
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// A prepared statement with its parameters, as the relay runs
			// it, explained.
			if _, err := tx.Exec(ctx, "prepare claim_plan as "+stmt.sql); err != nil {
				t.Fatal(err)
			}
			rows, err := tx.Query(ctx, "explain execute claim_plan("+stmt.args+")")
			if err != nil {
				t.Fatal(err)
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			_ = tx.Rollback(ctx)
			if _, err := conn.Exec(ctx, "deallocate claim_plan"); err != nil {
				t.Fatal(err)
			}
			lock := subtree(lines, "LockRows")
			if len(lock) == 0 || !strings.Contains(strings.Join(lock, "\n"), "Index Cond: (seq = ANY") {
				t.Errorf("%s with %s: the lock does not look its rows up by seq:\n%s", stmt.name, mode, strings.Join(lines, "\n"))
			}
			for _, l := range lock {
				for _, bad := range []string{"Seq Scan", "Semi Join", "Hash Join", "Merge Join", "Recheck Cond: (published_at IS NULL)"} {
					if strings.Contains(l, bad) {
						t.Errorf("%s with %s: the lock's plan has %q:\n%s", stmt.name, mode, bad, strings.Join(lines, "\n"))
					}
				}
			}
		}
	}
}

// A mark that fails leaves nothing committed, the failed publishes of the
// batch included, and the connection is not left inside the transaction: a
// trigger refuses to mark rows published, RunOnce returns the error, every
// row is still unpublished with its attempts unchanged, and once the trigger
// is gone the next RunOnce publishes them on the same single connection.
func TestRelayFailedMarkCommitsNothing(t *testing.T) {
	ob, ctx := pgOutbox(t)
	addKeyed(t, ctx, ob, 20, 5)
	traced, _ := tracedOutbox(t, ctx, ob)
	schema := ob.cfg.Schema
	if _, err := ob.pool.Exec(ctx, `create function `+schema+`.refuse_mark() returns trigger language plpgsql as $$
begin
  if new.published_at is not null then raise exception 'mark refused'; end if;
  return new;
end $$;
create trigger refuse_mark before update on `+ob.q.table+` for each row execute function `+schema+`.refuse_mark()`); err != nil {
		t.Fatal(err)
	}
	r, err := NewRelay(traced, ackAll{fail: map[string]bool{"k3": true}}, RelayConfig{Name: "m", DisablePurge: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.RunOnce(ctx)
	if err == nil || !strings.Contains(err.Error(), "mark refused") {
		t.Fatalf("RunOnce = %+v, %v; want the refused mark's error", res, err)
	}
	if st := r.Stats(); st.DBErrors != 1 || st.Published != 0 || st.Failed != 0 {
		t.Fatalf("stats %+v, want one lost batch and nothing counted", st)
	}
	var unpublished, attempts int64
	if err := ob.pool.QueryRow(ctx, "select count(*) filter (where published_at is null), coalesce(sum(attempts), 0) from "+
		ob.q.table).Scan(&unpublished, &attempts); err != nil {
		t.Fatal(err)
	}
	if unpublished != 20 || attempts != 0 {
		t.Fatalf("after the refused mark: %d rows unpublished, %d attempts recorded; want 20 and 0", unpublished, attempts)
	}
	if _, err := ob.pool.Exec(ctx, "drop trigger refuse_mark on "+ob.q.table); err != nil {
		t.Fatal(err)
	}
	res, err = r.RunOnce(ctx)
	if err != nil || res.Published != 16 || res.Failed != 1 {
		t.Fatalf("RunOnce after the trigger is gone = %+v, %v; want 16 published (k3's 4 rows wait behind its failed head)", res, err)
	}
}

// subtree returns the plan line holding node and the lines indented below
// it (EXPLAIN's text format), or nothing if no line holds node.
func subtree(lines []string, node string) []string {
	for i, l := range lines {
		if !strings.Contains(l, node) {
			continue
		}
		indent := len(l) - len(strings.TrimLeft(l, " ->"))
		out := []string{l}
		for _, m := range lines[i+1:] {
			if len(m)-len(strings.TrimLeft(m, " ->")) <= indent {
				break
			}
			out = append(out, m)
		}
		return out
	}
	return nil
}

// A relay publishing in rounds (a plain Publisher) whose claim transaction
// is lost while a round is out (its backend terminated, as a Postgres
// restart or failover would) sends no further round: the rows are free for
// another relay to claim, and publishing more of them would race its
// publishes (S16, two relays). The batch counts as lost and every row stays
// unpublished, to be published again with the same message IDs.
func TestRelayRoundsStopWhenClaimLost(t *testing.T) {
	ob, ctx := pgOutbox(t)
	addKeyed(t, ctx, ob, 12, 3) // 3 keys, 4 rows each: 4 rounds
	traced, sc := tracedOutbox(t, ctx, ob)
	var pid uint32
	conn, err := traced.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid = conn.Conn().PgConn().PID() // the pool's one connection: the claim's
	conn.Release()
	var calls, rows atomic.Int64
	pub := PublisherFunc(func(ctx context.Context, batch []Envelope) error {
		if calls.Add(1) == 1 {
			var ok bool
			if err := ob.pool.QueryRow(ctx, "select pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
				t.Errorf("terminate the claim's backend %d: %v, %v", pid, ok, err)
			}
		}
		rows.Add(int64(len(batch)))
		return nil
	})
	r, err := NewRelay(traced, pub, RelayConfig{Name: "lost", DisablePurge: true})
	if err != nil {
		t.Fatal(err)
	}
	sc.reset()
	res, err := r.RunOnce(ctx)
	if err == nil {
		t.Fatalf("RunOnce = %+v, nil; want the lost claim's error", res)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("Publish called %d times (%d rows) after the claim was lost in round 1; want 1: no round after the loss", n, rows.Load())
	}
	if st := r.Stats(); st.DBErrors != 1 || st.Published != 0 {
		t.Fatalf("stats %+v, want one lost batch and nothing marked", st)
	}
	var unpublished int64
	if err := ob.pool.QueryRow(ctx, "select count(*) from "+ob.q.table+" where published_at is null").Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	if unpublished != 12 {
		t.Fatalf("%d rows unpublished after the lost claim, want 12", unpublished)
	}
}
