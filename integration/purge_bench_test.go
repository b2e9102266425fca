package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkPurgeUnderIngest measures retention at work: a purge of about a
// million expired records (Store.Purge, 1,000 per statement) while messages
// are ingested through pgstore at a steady rate, for four layouts of the
// record table on the same data, in one run:
//
//   - layout=004: migrations 001 to 004 (a btree index on expires_at,
//     fillfactor 100) and the purge of that release (1,000 expired records
//     at a time, found through that index, in expires_at order);
//   - layout=brin: a BRIN index on expires_at instead (fillfactor 100),
//     purged the same way without the ordering;
//   - layout=005: migration 005 (no index on expires_at, fillfactor 90) and
//     Store.Purge (a walk of the primary key to the expiry frontier);
//   - layout=005-ff100: the same at fillfactor 100 (no room kept on a page
//     for the updated versions of its records).
//
// Each layout gets its own schema holding 1,020,000 records inserted 8 days
// ago (SUCCEEDED and expired, but 1% FAILED_FINAL within its 30 days and
// 0.1% FAILED_RETRYABLE, which stay), then 200,000 live SUCCEEDED records
// from the last day, vacuumed. The ingest runs two batched lanes
// (Store.ProcessBatch, 100 messages per transaction, paced to
// IDEMQ_PURGE_BENCH_RATE messages/s between them, default 500) and one
// lease-mode lane (Store.ProcessLeased, a tenth of that rate, each handler
// taking 100 ms): first 10 s alone, then while the purge runs. Each layout
// reports:
//
//   - ingest-msgs/s: messages ingested per second while the purge ran (and
//     alone-msgs/s before it): below the paced rate when Postgres cannot
//     keep up;
//   - batch-p99-ms: the 99th percentile of a 100-message batch's duration
//     while the purge ran;
//   - purge-rows/s: rows deleted per second of purge;
//   - hot-%: the share of HOT updates of the record table over the run
//     (pg_stat_user_tables n_tup_hot_upd / n_tup_upd);
//   - idx-MB: the size of the table's indexes after loading, and heap-MB
//     the table's own;
//   - migrate-005-ms (layout=004 only): migration 005's statements run on
//     that populated table at the end.
//
// The purge's correctness is checked on each layout: every expired record
// gone, every FAILED_FINAL, FAILED_RETRYABLE and live record kept.
//
//	go test -run '^$' -bench PurgeUnderIngest -benchtime 1x -timeout 30m ./integration
func BenchmarkPurgeUnderIngest(b *testing.B) {
	rate := 500
	if v := os.Getenv("IDEMQ_PURGE_BENCH_RATE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10 {
			b.Fatalf("IDEMQ_PURGE_BENCH_RATE=%q: want a number of messages per second, at least 10", v)
		}
		rate = n
	}
	for _, l := range purgeLayouts {
		b.Run("layout="+l.name, func(b *testing.B) {
			for range b.N {
				runPurgeUnderIngest(b, l, rate)
			}
		})
	}
}

// purgeLayout is one way to index and purge the record table.
type purgeLayout struct {
	name string
	// ddl turns the migrated (005) table into this layout; %[1]s is the
	// table, %[2]s the quoted schema.
	ddl string
	// purge is nil for Store.Purge; else one statement deleting at most $1
	// expired records, run until it deletes fewer.
	purge string
}

var purgeLayouts = []purgeLayout{
	{
		name: "004",
		ddl: `alter table %[1]s set (fillfactor = 100);
			create index consumption_records_expires_idx on %[1]s (expires_at) where expires_at is not null`,
		// The purge statement of migrations 001 to 004's release.
		purge: `delete from %[1]s where id in (
			select id from %[1]s where expires_at < now() order by expires_at limit $1 for update skip locked)`,
	},
	{
		name: "brin",
		ddl: `alter table %[1]s set (fillfactor = 100);
			create index consumption_records_expires_brin on %[1]s using brin (expires_at)`,
		purge: `delete from %[1]s where id in (
			select id from %[1]s where expires_at < now() limit $1 for update skip locked)`,
	},
	{name: "005"},
	{name: "005-ff100", ddl: `alter table %[1]s set (fillfactor = 100)`},
}

const (
	purgeBenchOld  = 1_020_000 // records inserted 8 days ago
	purgeBenchLive = 200_000   // live records from the last day
)

func runPurgeUnderIngest(b *testing.B, l purgeLayout, rate int) {
	e := setup(b, nil)
	ctx := e.ctx
	records := e.table("consumption_records")
	for _, stmt := range splitStatements(l.ddl) {
		e.exec(fmt.Sprintf(stmt, records, pgx.Identifier{e.schema}.Sanitize()))
	}
	// The loaded records, in id order: old (expired but for 1% final and
	// 0.1% retryable), then live.
	start := time.Now()
	e.exec(`insert into `+records+` (scope, message_id, fingerprint, fingerprint_key_id, status, attempts, source, created_at, updated_at, expires_at)
		select 'old', 'old-' || g, decode(md5(g::text) || md5(g::text), 'hex'), 'k1', s.status, 1, 'bench/0/' || g, t, t,
		  case s.status when 'SUCCEEDED' then t + interval '7 days' when 'FAILED_FINAL' then t + interval '30 days' end
		from generate_series(1, $1::int) g,
		  lateral (select now() - interval '8 days' + g * interval '1 ms' as t) c,
		  lateral (select case when g % 100 = 0 then 'FAILED_FINAL' when g % 1000 = 1 then 'FAILED_RETRYABLE' else 'SUCCEEDED' end as status) s`,
		purgeBenchOld)
	e.exec(`insert into `+records+` (scope, message_id, fingerprint, fingerprint_key_id, status, attempts, source, created_at, updated_at, expires_at)
		select 'live', 'live-' || g, decode(md5(g::text) || md5(g::text), 'hex'), 'k1', 'SUCCEEDED', 1, 'bench/0/' || g, t, t, t + interval '7 days'
		from generate_series(1, $1::int) g, lateral (select now() - interval '1 day' + g * interval '1 ms' as t) c`,
		purgeBenchLive)
	e.exec(`vacuum analyze ` + records)
	expired := e.count(`select count(*) from ` + records + ` where expires_at < now()`)
	kept := e.count(`select count(*) from ` + records + ` where expires_at is null or expires_at >= now()`)
	heapMB, idxMB := purgeBenchSizes(b, e, records)
	b.Logf("layout %s: loaded %d expired and %d kept records in %s; heap %.1f MB, indexes %.1f MB",
		l.name, expired, kept, time.Since(start).Round(time.Second), heapMB, idxMB)

	// The ingest: its own pool, closed at the end so that its backends hand
	// over their statistics.
	cfg := testPool(b).Config()
	cfg.MaxConns = 16
	ingestPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer ingestPool.Close()
	st, err := pgstore.New(ingestPool, pgstore.Config{Schema: e.schema, Fingerprinter: testFingerprinter(b)})
	if err != nil {
		b.Fatal(err)
	}
	upd0, hot0 := purgeBenchHOT(b, e, records, 0)

	ing := &purgeIngest{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	ingestErr := make(chan error, 3)
	for lane := range 2 {
		wg.Go(func() { ingestErr <- ing.batched(ctx, st, lane, rate/2, stop) })
	}
	wg.Go(func() { ingestErr <- ing.leased(ctx, st, max(rate/10, 1), stop) })

	time.Sleep(10 * time.Second)
	aloneMsgs, aloneSecs := ing.take()

	purgeStart := time.Now()
	var purged int64
	if l.purge == "" {
		purged, err = st.Purge(ctx, 1000)
	} else {
		q := fmt.Sprintf(l.purge, records)
		for err == nil {
			var tag interface{ RowsAffected() int64 }
			tag, err = ingestPool.Exec(ctx, q, 1000)
			if err == nil {
				purged += tag.RowsAffected()
				if tag.RowsAffected() < 1000 {
					break
				}
			}
		}
	}
	purgeSecs := time.Since(purgeStart).Seconds()
	if err != nil {
		b.Fatalf("purge: %v", err)
	}
	msgs, secs := ing.take()
	lat := ing.latencies()
	close(stop)
	wg.Wait()
	close(ingestErr)
	for err := range ingestErr {
		if err != nil {
			b.Fatal(err)
		}
	}
	ingestPool.Close()
	upd, hot := purgeBenchHOT(b, e, records, upd0+int64(ing.total()))
	upd, hot = upd-upd0, hot-hot0

	// Correctness: every loaded record that had expired is gone; the kept
	// ones are all there.
	if n := e.count(`select count(*) from `+records+` where scope in ('old', 'live') and expires_at < $1`, purgeStart); n != 0 {
		b.Fatalf("layout %s: %d expired records left", l.name, n)
	}
	if n := e.count(`select count(*) from ` + records + ` where scope in ('old', 'live')`); n != kept {
		b.Fatalf("layout %s: %d loaded records left, want the %d kept", l.name, n, kept)
	}
	if purged < int64(expired) {
		b.Fatalf("layout %s: purged %d, want at least %d", l.name, purged, expired)
	}

	var migrateMS float64
	if l.name == "004" { // migration 005's statements, on this populated table
		start := time.Now()
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `set local lock_timeout = '10s'; drop index if exists `+
				pgx.Identifier{e.schema, "consumption_records_expires_idx"}.Sanitize()+`; alter table `+records+` set (fillfactor = 90)`)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		migrateMS = float64(time.Since(start).Microseconds()) / 1000
		b.ReportMetric(migrateMS, "migrate-005-ms")
	}

	hotPct := 0.0
	if upd > 0 {
		hotPct = 100 * float64(hot) / float64(upd)
	}
	b.ReportMetric(aloneMsgs/aloneSecs, "alone-msgs/s")
	b.ReportMetric(msgs/secs, "ingest-msgs/s")
	b.ReportMetric(lat.p99, "batch-p99-ms")
	b.ReportMetric(float64(purged)/purgeSecs, "purge-rows/s")
	b.ReportMetric(hotPct, "hot-%")
	b.ReportMetric(idxMB, "idx-MB")
	b.ReportMetric(heapMB, "heap-MB")
	b.Logf("layout %s: ingest %.0f msgs/s alone, %.0f during the purge (batch p50 %.1f ms, p99 %.1f ms); purge %d rows in %.1f s (%.0f rows/s); %d of %d updates HOT (%.1f%%); migration 005 %.1f ms",
		l.name, aloneMsgs/aloneSecs, msgs/secs, lat.p50, lat.p99, purged, purgeSecs, float64(purged)/purgeSecs, hot, upd, hotPct, migrateMS)
}

// splitStatements splits ddl at semicolons (the layouts' DDL has no
// semicolon inside a statement).
func splitStatements(ddl string) []string {
	var out []string
	for _, s := range strings.Split(ddl, ";") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// purgeBenchSizes returns the table's heap and index sizes in MB.
func purgeBenchSizes(b *testing.B, e *env, records string) (heap, idx float64) {
	b.Helper()
	if err := e.pool.QueryRow(e.ctx, `select pg_relation_size($1::regclass) / 1048576.0, pg_indexes_size($1::regclass) / 1048576.0`, records).Scan(&heap, &idx); err != nil {
		b.Fatal(err)
	}
	return heap, idx
}

// purgeBenchHOT returns the table's n_tup_upd and n_tup_hot_upd, once
// n_tup_upd has reached atLeast (statistics arrive after the backends that
// counted them hand them over) or a minute has passed.
func purgeBenchHOT(b *testing.B, e *env, records string, atLeast int64) (upd, hot int64) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if err := e.pool.QueryRow(e.ctx, `select n_tup_upd, n_tup_hot_upd from pg_stat_user_tables where relid = $1::regclass`, records).Scan(&upd, &hot); err != nil {
			b.Fatal(err)
		}
		if upd >= atLeast || time.Now().After(deadline) {
			return upd, hot
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// purgeIngest counts the ingested messages and the batches' durations.
type purgeIngest struct {
	mu      sync.Mutex
	n       int // messages since the last take
	all     int // lease-mode messages in all (one update each, at least)
	since   time.Time
	batchMS []float64 // batch durations since the last take
	last    []float64 // those of the last take
}

// take returns the messages and seconds since the previous take (or the
// start), and keeps the batch durations of that span for latencies.
func (p *purgeIngest) take() (msgs, secs float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	msgs, secs = float64(p.n), now.Sub(p.since).Seconds()
	p.n, p.since, p.last, p.batchMS = 0, now, p.batchMS, nil
	return msgs, secs
}

func (p *purgeIngest) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.all
}

func (p *purgeIngest) latencies() (l struct{ p50, p99 float64 }) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := slices.Clone(p.last)
	slices.Sort(s)
	if len(s) > 0 {
		l.p50, l.p99 = s[len(s)/2], s[len(s)*99/100]
	}
	return l
}

func (p *purgeIngest) add(n int, d time.Duration, leased bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.since.IsZero() {
		p.since = time.Now().Add(-d)
	}
	p.n += n
	if leased {
		p.all += n
	} else {
		p.batchMS = append(p.batchMS, float64(d.Microseconds())/1000)
	}
}

// batched ingests perSec messages a second, 100 per Store.ProcessBatch,
// until stop closes.
func (p *purgeIngest) batched(ctx context.Context, st *pgstore.Store, lane, perSec int, stop <-chan struct{}) error {
	const size = 100
	tick := time.NewTicker(time.Second * size / time.Duration(perSec))
	defer tick.Stop()
	ok := func(context.Context, pgx.Tx, *dedup.Message) error { return nil }
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		case <-tick.C:
		}
		batch := make([]*dedup.Message, size)
		for j := range batch {
			id, err := dedup.NewIdentity("ingest", fmt.Sprintf("b%d-%d-%d", lane, i, j), "", "")
			if err != nil {
				return err
			}
			batch[j] = &dedup.Message{Identity: id, Payload: []byte(`{"amount":100}`), Topic: "bench"}
		}
		t0 := time.Now()
		res, err := st.ProcessBatch(ctx, batch, ok)
		if err != nil {
			return err
		}
		for _, r := range res {
			if r.Outcome != dedup.OutcomeProcessed {
				return fmt.Errorf("batch: %+v", r)
			}
		}
		p.add(size, time.Since(t0), false)
	}
}

// leased ingests perSec messages a second through Store.ProcessLeased (a
// committed claim, a handler of 100 ms, as a call to another service would
// take, then the completion: one update each), each message in a goroutine
// of its own, until stop closes.
func (p *purgeIngest) leased(ctx context.Context, st *pgstore.Store, perSec int, stop <-chan struct{}) error {
	tick := time.NewTicker(time.Second / time.Duration(perSec))
	defer tick.Stop()
	opt := dedup.LeaseOptions{TTL: time.Minute, DisableHeartbeat: true}
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	defer wg.Wait()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		case err := <-errs:
			return err
		case <-tick.C:
		}
		id, err := dedup.NewIdentity("ingest", fmt.Sprintf("l-%d", i), "", "")
		if err != nil {
			return err
		}
		wg.Go(func() {
			t0 := time.Now()
			res, err := st.ProcessLeased(ctx, &dedup.Message{Identity: id, Payload: []byte(`{"amount":100}`), Topic: "bench"},
				func(context.Context, *dedup.Message) error { time.Sleep(100 * time.Millisecond); return nil }, opt)
			if err == nil && res.Outcome != dedup.OutcomeProcessed {
				err = errors.New("lease: " + string(res.Outcome))
			}
			if err != nil {
				select {
				case errs <- err:
				default:
				}
				return
			}
			p.add(1, time.Since(t0), true)
		})
	}
}
