package integration

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The relay on an outbox of 200,000 published rows (waiting for their purge)
// and 400 pending rows over 40 keys, with generic plans forced: claiming,
// publishing and marking never scan the table.
func TestRelayNoTableScanOnLargeOutbox(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	tbl := o.table("outbox")
	o.exec(`insert into ` + tbl + ` (id, topic, key, headers, payload, published_at, published_by)
select gen_random_uuid(), 'done', ('k-' || (g % 1000))::bytea, '{}', 'x', now(), 'old-relay' from generate_series(1, 200000) g`)
	o.addRows(t, "scale-topic", 400, 40, "scale")
	o.exec(`analyze ` + tbl)

	cfg, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // RunOnce needs one connection; its counters are flushed below
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	pool, err := pgxpool.NewWithConfig(o.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := outbox.New(pool, outbox.Config{Schema: o.schema})
	if err != nil {
		t.Fatal(err)
	}
	var published atomic.Int64
	r, err := outbox.NewRelay(ob, outbox.PublisherFunc(func(_ context.Context, batch []outbox.Envelope) error {
		published.Add(int64(len(batch)))
		return nil
	}), fastRelay("scale"))
	if err != nil {
		t.Fatal(err)
	}
	seqScans := func() int64 {
		var n int64
		err := pool.AcquireFunc(o.ctx, func(c *pgxpool.Conn) error {
			if _, err := c.Exec(o.ctx, `select pg_stat_force_next_flush()`); err != nil {
				return err
			}
			return c.QueryRow(o.ctx, `select seq_scan from pg_stat_user_tables where schemaname = $1 and relname = 'outbox'`, o.schema).Scan(&n)
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := seqScans()
	for published.Load() < 400 {
		if _, err := r.RunOnce(o.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if after := seqScans(); after != before {
		t.Fatalf("the relay scanned the 200,400-row outbox %d times (generic plans)", after-before)
	}
}
