package integration

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// On a consumption-record table of 200,000 rows, with Postgres forced to use
// generic plans for prepared statements (what pgx's statement cache gets
// after a few executions), no store operation scans the table: claims,
// duplicates by message ID and by business key, lease claims and lookups all
// go through the unique indexes. A scan would make every duplicate cost a
// pass over the whole table.
func TestNoTableScanOnLargeRecordTable(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	rec := e.table("consumption_records")
	e.exec(`insert into ` + rec + ` (scope, message_id, business_key, fingerprint, fingerprint_key_id, status, attempts, expires_at)
select 'big', 'old-' || g, case when g % 2 = 0 then 'bk-' || g else '' end, '\x00'::bytea, 'k1', 'SUCCEEDED', 1, now() + interval '1 day'
from generate_series(1, 200000) g`)
	e.exec(`analyze ` + rec)

	cfg, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	one, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(one.Close)
	st, err := pgstore.New(one, pgstore.Config{Schema: e.schema, Fingerprinter: testFingerprinter(t)})
	if err != nil {
		t.Fatal(err)
	}
	seqScans := func() int64 {
		// Flush this backend's counters, then read them (shared stats).
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
	for i := range 8 {
		id, bk := fmt.Sprintf("new-%d", i), fmt.Sprintf("nbk-%d", i)
		for _, m := range []*dedup.Message{
			msg(t, "big", id, bk, "x"),                           // new
			msg(t, "big", id, bk, "x"),                           // duplicate by message ID
			msg(t, "big", id+"-resend", bk, "x"),                 // duplicate by business key
			msg(t, "big", fmt.Sprintf("old-%d", 2*i+1), "", "y"), // conflict with a preloaded record
		} {
			if _, err := st.Process(e.ctx, m, noop); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := st.ProcessLeased(e.ctx, msg(t, "big", "lease-"+id, "lbk-"+id, "x"), func(context.Context, *dedup.Message) error { return nil }, dedup.LeaseOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Lookup(e.ctx, "big", id); err != nil {
			t.Fatal(err)
		}
		if _, err := st.LookupBusinessKey(e.ctx, "big", bk); err != nil {
			t.Fatal(err)
		}
	}
	if after := seqScans(); after != before {
		t.Fatalf("the store scanned the 200,000-row record table %d times (generic plans)", after-before)
	}
}

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
