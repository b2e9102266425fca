package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkPurgeAtScale measures whether the production purge keeps up with
// ingest on a large record table. In a schema of its own it loads
// IDEMQ_PURGE_SCALE_ROWS consumption records (default 10,000,000) with
// INSERT … SELECT generate_series, in chunks, into the migrated table with
// its live indexes, in id order = creation order over 10 days:
//
//   - the oldest 30%, created 10 days to 7 days + 1 hour ago: SUCCEEDED and
//     expired (SucceededRetention 7 days), but for 1% FAILED_FINAL (30
//     days, not expired) and 0.1% FAILED_RETRYABLE (no expires_at), which
//     stay;
//   - the other 70%, created 7 days − 2 hours ago to now: live, with the
//     same 1% FAILED_FINAL and 0.1% FAILED_RETRYABLE;
//   - random UUID message IDs (36 bytes), a 16-byte business key on one
//     record in five, a source of the form kafka:payments/P/offset.
//
// Then VACUUM ANALYZE, autovacuum off on the table for the run (so that the
// figures do not depend on when it starts; the VACUUM after the purge is
// timed instead), and:
//
//  1. ingest alone for IDEMQ_PURGE_SCALE_WINDOW (default 60s):
//     IDEMQ_PURGE_SCALE_LANES goroutines (default 4), each calling
//     Store.ProcessBatchSet with 100 new messages (random UUID IDs, a
//     business key on one in five) and a BatchHandler inserting their
//     payment rows with one unnest statement, as fast as they go;
//  2. the same ingest while Store.RunMaintenance (the production loop: its
//     own pool and leader connection, MaintenanceConfig with Batch
//     IDEMQ_PURGE_SCALE_BATCH, default 1000, and the default Pause of 10ms)
//     runs its first pass, which deletes the whole expired backlog, then its
//     second pass (the steady state: nothing new has expired, the walk reads
//     the records kept before the frontier, past the index entries of the
//     deleted ones, and stops);
//  3. n_dead_tup, a timed VACUUM (the ingest and the loop go on beside it,
//     as beside autovacuum), a pass that began after it, then the sizes and
//     the checks: every expired loaded record gone, every FAILED_FINAL,
//     FAILED_RETRYABLE and live one kept (counts per class), the purged
//     count equal to the expired one, every ingested record and payment
//     row there.
//
// It logs one table of figures (rows, backlog and its age before and after,
// ingest msgs/s alone and during the purge with batch p50/p95/p99, purge
// rows/s from the maintenance metrics, purge ÷ ingest and purge ÷ 10,000,
// the steady passes before and after VACUUM, heap and index sizes,
// n_dead_tup, VACUUM time, WAL written, load average).
// MaintenanceMetrics has no backlog-age metric; the age of the oldest
// expired record is read with SQL. The schema is dropped at the end.
//
//	make bench-purge                      (10 M rows: about 30 minutes on 2 busy cores)
//	PURGE_ROWS=200000 make bench-purge    (a quick check of the benchmark itself)
func BenchmarkPurgeAtScale(b *testing.B) {
	rows := scaleEnvInt(b, "IDEMQ_PURGE_SCALE_ROWS", 10_000_000, 10_000)
	lanes := scaleEnvInt(b, "IDEMQ_PURGE_SCALE_LANES", 4, 1)
	batch := scaleEnvInt(b, "IDEMQ_PURGE_SCALE_BATCH", pgstore.DefaultPurgeBatch, 1)
	window := 60 * time.Second
	if v := os.Getenv("IDEMQ_PURGE_SCALE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			b.Fatalf("IDEMQ_PURGE_SCALE_WINDOW=%q: want a duration of at least 1s", v)
		}
		window = d
	}
	for range b.N {
		runPurgeAtScale(b, rows, lanes, batch, window)
	}
}

func scaleEnvInt(b *testing.B, name string, def, least int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(strings.ReplaceAll(v, "_", ""))
	if err != nil || n < least {
		b.Fatalf("%s=%q: want a whole number, at least %d", name, v, least)
	}
	return n
}

// scaleFigures are the measurements of one run, in the order printed.
type scaleFigures struct {
	rows, lanes, batch                int
	loadSecs, vacuumLoadSecs          float64
	expired0, expired1                int
	age0, age1                        string
	aloneMsgs, aloneSecs              float64
	alone                             latencyStats
	purgeMsgs, purgeSecs              float64
	during                            latencyStats
	purged                            float64
	pass2Secs, pass3Secs              float64
	heap0, idx0, heap1, idx1          float64
	heap2, idx2                       float64
	dead1, dead2                      int64
	rowsAfter, ingested               int
	vacuumSecs                        float64
	walPurgeMB                        float64
	loadAvgStart, loadAvgPurge, loadE string
}

type latencyStats struct{ p50, p95, p99 float64 }

func runPurgeAtScale(b *testing.B, rows, lanes, batch int, window time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Minute)
	defer cancel()
	p := testPool(b)
	schema := randomName("purge_scale_")
	fp := testFingerprinter(b)
	st, err := pgstore.New(p, pgstore.Config{Schema: schema, Fingerprinter: fp})
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if _, err := p.Exec(ctx, "drop schema if exists "+pgx.Identifier{schema}.Sanitize()+" cascade"); err != nil {
			b.Errorf("drop schema %s: %v", schema, err)
		}
	})
	e := &env{t: b, ctx: ctx, pool: p, schema: schema, store: st}
	records := e.table("consumption_records")
	payments := e.table("payments")
	e.exec(`create table ` + payments + ` (payment_id text primary key, amount bigint not null)`)
	e.exec(`alter table ` + records + ` set (autovacuum_enabled = false)`)

	f := scaleFigures{rows: rows, lanes: lanes, batch: batch, loadAvgStart: loadAvg()}
	b.Logf("purge at scale: %d rows, %d ingest lanes, purge batch %d, window %s; load average %s", rows, lanes, batch, window, f.loadAvgStart)

	// The load: chunks of INSERT … SELECT, each its own transaction.
	start := time.Now()
	const chunk = 500_000
	for from := 1; from <= rows; from += chunk {
		to := min(from+chunk-1, rows)
		e.exec(scaleLoadSQL(records), from, to, rows)
		if to%2_000_000 == 0 || to == rows {
			b.Logf("loaded %d rows in %s (load average %s)", to, time.Since(start).Round(time.Second), loadAvg())
		}
	}
	f.loadSecs = time.Since(start).Seconds()
	start = time.Now()
	e.exec(`vacuum analyze ` + records)
	f.vacuumLoadSecs = time.Since(start).Seconds()

	// What must go and what must stay, by class, on the loaded records.
	classes := scaleClasses(b, e, records)
	f.expired0, f.age0 = scaleBacklog(b, e, records)
	if f.expired0 != classes["expired"] {
		b.Fatalf("backlog %d, classes %v", f.expired0, classes)
	}
	f.heap0, f.idx0 = purgeBenchSizes(b, e, records)
	b.Logf("load %.0f s, vacuum analyze %.0f s; classes %v; heap %.0f MB, indexes %.0f MB", f.loadSecs, f.vacuumLoadSecs, classes, f.heap0, f.idx0)

	// The ingest: its own pool and store.
	cfg := p.Config()
	cfg.MaxConns = int32(lanes) + 2 //nolint:gosec // a handful of lanes
	ingestPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer ingestPool.Close()
	ist, err := pgstore.New(ingestPool, pgstore.Config{Schema: schema, Fingerprinter: fp})
	if err != nil {
		b.Fatal(err)
	}
	ing := &scaleIngest{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, lanes)
	for range lanes {
		wg.Go(func() { errs <- ing.run(ctx, ist, payments, stop) })
	}
	stopIngest := func() {
		select {
		case <-stop:
		default:
			close(stop)
			wg.Wait()
		}
	}
	defer stopIngest()
	checkIngest := func() {
		select {
		case err := <-errs:
			if err != nil {
				b.Fatalf("ingest: %v", err)
			}
		default:
		}
	}

	// 1. Ingest alone.
	ing.take()
	time.Sleep(window)
	checkIngest()
	f.aloneMsgs, f.aloneSecs, f.alone = ing.take()

	// 2. The same ingest while RunMaintenance runs two passes.
	mcfg := p.Config()
	mcfg.MaxConns = 2
	maintPool, err := pgxpool.NewWithConfig(ctx, mcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer maintPool.Close()
	mst, err := pgstore.New(maintPool, pgstore.Config{Schema: schema, Fingerprinter: fp})
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	metrics, err := pgstore.NewMaintenanceMetrics(reg)
	if err != nil {
		b.Fatal(err)
	}
	var wal0 string
	if err := p.QueryRow(ctx, `select pg_current_wal_lsn()::text`).Scan(&wal0); err != nil {
		b.Fatal(err)
	}
	mctx, mcancel := context.WithCancel(ctx)
	defer mcancel()
	maintDone := make(chan error, 1)
	go func() {
		maintDone <- mst.RunMaintenance(mctx, pgstore.MaintenanceConfig{
			Interval: 5 * time.Second, Batch: batch, LockRetry: time.Second, Metrics: metrics,
		})
	}()
	waitPasses := func(n uint64) (passes uint64, secs float64) {
		for {
			select {
			case err := <-maintDone:
				b.Fatalf("RunMaintenance returned early: %v", err)
			default:
			}
			checkIngest()
			passes, secs = scaleGatherHistogram(b, reg, "idemq_maintenance_pass_duration_seconds")
			if passes >= n {
				return passes, secs
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	_, pass1 := waitPasses(1)
	f.purgeMsgs, f.purgeSecs, f.during = ing.take()
	f.loadAvgPurge = loadAvg()
	f.purged = scaleGatherCounter(b, reg, "idemq_maintenance_purged_rows_total", "records")
	if err := p.QueryRow(ctx, `select (pg_current_wal_lsn() - $1::pg_lsn) / 1048576.0`, wal0).Scan(&f.walPurgeMB); err != nil {
		b.Fatal(err)
	}
	f.expired1, f.age1 = scaleBacklog(b, e, records)
	_, both := waitPasses(2)
	f.pass2Secs = both - pass1

	// 3. Statistics, a VACUUM (timed; the ingest and the loop go on, as
	// beside autovacuum), then a third pass on the vacuumed table.
	f.heap1, f.idx1 = purgeBenchSizes(b, e, records)
	f.dead1 = scaleDeadTuples(b, e, records, int64(f.purged))
	start = time.Now()
	e.exec(`vacuum ` + records)
	f.vacuumSecs = time.Since(start).Seconds()
	f.dead2 = scaleDeadTuples(b, e, records, -1)
	// Pass c+1 may have begun before the VACUUM ended; pass c+2 began after.
	c, _ := scaleGatherHistogram(b, reg, "idemq_maintenance_pass_duration_seconds")
	_, sum1 := waitPasses(c + 1)
	_, sum2 := waitPasses(c + 2)
	f.pass3Secs = sum2 - sum1
	mcancel()
	if err := <-maintDone; err != nil {
		b.Fatalf("RunMaintenance: %v", err)
	}
	stopIngest()
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatalf("ingest: %v", err)
		}
	}
	ingestPool.Close()
	maintPool.Close()
	f.loadE = loadAvg()
	f.heap2, f.idx2 = purgeBenchSizes(b, e, records)

	after := scaleClasses(b, e, records)
	if after["expired"] != 0 {
		b.Fatalf("%d expired loaded records left after the purge", after["expired"])
	}
	for _, c := range []string{"failed_final", "failed_retryable", "live", "kept_old"} {
		if after[c] != classes[c] {
			b.Fatalf("%s: %d loaded records after the purge, want the %d loaded", c, after[c], classes[c])
		}
	}
	if int(f.purged) != classes["expired"] {
		b.Fatalf("the maintenance loop purged %.0f records, want the %d expired", f.purged, classes["expired"])
	}
	if n, want := e.count(`select count(*) from `+records+` where scope = 'ingest'`), ing.total(); n != want {
		b.Fatalf("%d ingested records in the table, want %d", n, want)
	}
	if n, want := e.count(`select count(*) from `+payments), ing.total(); n != want {
		b.Fatalf("%d payment rows, want %d", n, want)
	}
	f.rowsAfter, f.ingested = e.count(`select count(*) from `+records), ing.total()
	scaleReport(b, f, pass1, classes)
}

// scaleLoadSQL inserts the records $1 to $2 of $3 (see
// BenchmarkPurgeAtScale for the shape).
func scaleLoadSQL(records string) string {
	return `insert into ` + records + ` (scope, message_id, business_key, fingerprint, fingerprint_key_id, status,
	    attempts, last_error, last_error_class, source, created_at, updated_at, expires_at)
		select 'load', md5(g::text)::uuid::text,
		  case when g % 5 = 0 then 'order-' || lpad(to_hex(g), 10, '0') else '' end,
		  decode(md5('f' || g) || md5('p' || g), 'hex'), 'k1', s.status,
		  case s.status when 'SUCCEEDED' then 1 else 3 end,
		  case when s.status <> 'SUCCEEDED' then 'payment service: 503 Service Unavailable' end,
		  case when s.status <> 'SUCCEEDED' then 'transient' end,
		  'kafka:payments/' || (g % 12) || '/' || (g / 12), c.t, c.t,
		  case s.status when 'SUCCEEDED' then c.t + interval '7 days' when 'FAILED_FINAL' then c.t + interval '30 days' end
		from generate_series($1::int, $2::int) g,
		  lateral (select case when g <= $3::int * 3 / 10
		    then now() - interval '10 days' + (g::float8 / ($3::int * 3 / 10)) * (interval '3 days' - interval '1 hour')
		    else now() - interval '7 days' + interval '2 hours'
		      + ((g - $3::int * 3 / 10)::float8 / ($3::int - $3::int * 3 / 10)) * (interval '7 days' - interval '2 hours' - interval '1 minute')
		    end as t) c,
		  lateral (select case when g % 100 = 0 then 'FAILED_FINAL' when g % 1000 = 1 then 'FAILED_RETRYABLE' else 'SUCCEEDED' end as status) s`
}

// scaleClasses counts the loaded records by what the purge must do with
// them: expired (deleted), failed_final, failed_retryable, live (kept).
func scaleClasses(b *testing.B, e *env, records string) map[string]int {
	b.Helper()
	out := map[string]int{}
	var expired, final, retryable, live, keptOld int
	err := e.pool.QueryRow(e.ctx, `select
		  count(*) filter (where expires_at < now()),
		  count(*) filter (where status = 'FAILED_FINAL' and expires_at >= now()),
		  count(*) filter (where status = 'FAILED_RETRYABLE'),
		  count(*) filter (where status = 'SUCCEEDED' and expires_at >= now()),
		  count(*) filter (where created_at < now() - interval '7 days' and (expires_at is null or expires_at >= now()))
		from `+records+` where scope = 'load'`).Scan(&expired, &final, &retryable, &live, &keptOld)
	if err != nil {
		b.Fatal(err)
	}
	out["expired"], out["failed_final"], out["failed_retryable"], out["live"] = expired, final, retryable, live
	out["kept_old"] = keptOld
	return out
}

// scaleBacklog returns the expired records of the table and the age of the
// oldest one's expiry.
func scaleBacklog(b *testing.B, e *env, records string) (int, string) {
	b.Helper()
	var n int
	var age *time.Duration
	if err := e.pool.QueryRow(e.ctx, `select count(*), now() - min(expires_at) from `+records+` where expires_at < now()`).Scan(&n, &age); err != nil {
		b.Fatal(err)
	}
	if age == nil {
		return n, "none"
	}
	return n, age.Round(time.Minute).String()
}

// scaleDeadTuples returns the table's n_dead_tup once it has reached
// atLeast (statistics arrive after the backends that counted them hand
// them over) or 30 seconds have passed; atLeast < 0: at once.
func scaleDeadTuples(b *testing.B, e *env, records string, atLeast int64) int64 {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var dead int64
		if err := e.pool.QueryRow(e.ctx, `select n_dead_tup from pg_stat_user_tables where relid = $1::regclass`, records).Scan(&dead); err != nil {
			b.Fatal(err)
		}
		if atLeast < 0 || dead >= atLeast || time.Now().After(deadline) {
			return dead
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func scaleGatherHistogram(b *testing.B, reg *prometheus.Registry, name string) (count uint64, sum float64) {
	b.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				count += m.GetHistogram().GetSampleCount()
				sum += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return count, sum
}

func scaleGatherCounter(b *testing.B, reg *prometheus.Registry, name, kind string) float64 {
	b.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	b.Fatalf("no %s{kind=%q}", name, kind)
	return 0
}

// loadAvg is the 1, 5 and 15 minute load averages of the machine.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	if f := strings.Fields(string(data)); len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// scaleIngest counts the ingested messages and the batches' durations.
type scaleIngest struct {
	mu    sync.Mutex
	n     int // messages since the last take
	all   int
	since time.Time
	ms    []float64 // batch durations since the last take
}

// take returns the messages, seconds and batch latencies since the
// previous take.
func (s *scaleIngest) take() (msgs, secs float64, l latencyStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if !s.since.IsZero() {
		msgs, secs = float64(s.n), now.Sub(s.since).Seconds()
	}
	ms := s.ms
	s.n, s.since, s.ms = 0, now, nil
	slices.Sort(ms)
	if len(ms) > 0 {
		l = latencyStats{ms[len(ms)/2], ms[len(ms)*95/100], ms[len(ms)*99/100]}
	}
	return msgs, secs, l
}

func (s *scaleIngest) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.all
}

func (s *scaleIngest) add(n int, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n += n
	s.all += n
	s.ms = append(s.ms, float64(d.Microseconds())/1000)
}

// run ingests batches of 100 new messages through Store.ProcessBatchSet,
// one payment row each, until stop closes.
func (s *scaleIngest) run(ctx context.Context, st *pgstore.Store, payments string, stop <-chan struct{}) error {
	const size = 100
	insert := `insert into ` + payments + ` (payment_id, amount) select unnest($1::text[]), 100`
	bh := func(ctx context.Context, tx pgx.Tx, msgs []*dedup.Message) error {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.Identity.MessageID
		}
		_, err := tx.Exec(ctx, insert, ids)
		return err
	}
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		batch := make([]*dedup.Message, size)
		for j := range batch {
			id := uuid.NewString()
			key := ""
			if j%5 == 0 { // a business key on one message in five
				key = "order-" + id
			}
			ident, err := dedup.NewIdentity("ingest", id, key, "")
			if err != nil {
				return err
			}
			batch[j] = &dedup.Message{Identity: ident, Payload: []byte(`{"amount":100}`), Topic: "payments",
				Source: fmt.Sprintf("kafka:payments/%d/%d", j%12, j)}
		}
		t0 := time.Now()
		res, err := st.ProcessBatchSet(ctx, batch, bh)
		if err != nil {
			return err
		}
		for _, r := range res {
			if r.Outcome != dedup.OutcomeProcessed {
				return fmt.Errorf("batch: %+v", r)
			}
		}
		s.add(size, time.Since(t0))
	}
}

// scaleReport logs the run's figures as one table (and as benchmark
// metrics).
func scaleReport(b *testing.B, f scaleFigures, pass1 float64, classes map[string]int) {
	b.Helper()
	alone := f.aloneMsgs / f.aloneSecs
	during := f.purgeMsgs / f.purgeSecs
	purgeRate := f.purged / pass1
	total := float64(f.rows)
	var sb strings.Builder
	row := func(k, v string, args ...any) { fmt.Fprintf(&sb, "| %s | %s |\n", k, fmt.Sprintf(v, args...)) }
	sb.WriteString("\n| figure | value |\n| --- | --- |\n")
	row("records loaded", "%d (%d expired, %d FAILED_FINAL, %d FAILED_RETRYABLE, %d live SUCCEEDED) in %.0f s, VACUUM ANALYZE %.0f s",
		f.rows, classes["expired"], classes["failed_final"], classes["failed_retryable"], classes["live"], f.loadSecs, f.vacuumLoadSecs)
	row("expired backlog before / after", "%d (oldest expired %s ago) / %d (%s)", f.expired0, f.age0, f.expired1, f.age1)
	row("ingest alone", "%.0f msgs/s over %.0f s, %d lanes × 100/tx; batch p50 %.1f ms, p95 %.1f ms, p99 %.1f ms",
		alone, f.aloneSecs, f.lanes, f.alone.p50, f.alone.p95, f.alone.p99)
	row("ingest during the purge", "%.0f msgs/s over %.0f s (%.0f%% of alone); batch p50 %.1f ms, p95 %.1f ms, p99 %.1f ms",
		during, f.purgeSecs, 100*during/alone, f.during.p50, f.during.p95, f.during.p99)
	row("purge (RunMaintenance pass 1)", "%.0f records in %.1f s: **%.0f rows/s** (Batch %d, Pause 10ms)", f.purged, pass1, purgeRate, f.batch)
	keeps := "yes"
	if purgeRate < during {
		keeps = "NO"
	}
	row("purge ÷ ingest during it", "**%.2f** (keeps up: %s)", purgeRate/during, keeps)
	keeps = "yes"
	if purgeRate < 10000 {
		keeps = "NO"
	}
	row("purge ÷ 10,000 msg/s", "**%.2f** (keeps up with 10,000 msg/s: %s)", purgeRate/10000, keeps)
	row("steady pass before VACUUM (pass 2: nothing new expired)", "%.2f s, walking the %d records kept before the frontier past the %d dead ones",
		f.pass2Secs, classes["kept_old"], classes["expired"])
	row("steady pass after VACUUM", "%.2f s", f.pass3Secs)
	row("WAL written during pass 1 (with the ingest)", "%.0f MB", f.walPurgeMB)
	row("heap / indexes after load", "%.0f MB / %.0f MB: %.0f + %.0f = %.0f bytes per record", f.heap0, f.idx0,
		f.heap0*1048576/total, f.idx0*1048576/total, (f.heap0+f.idx0)*1048576/total)
	row("heap / indexes after the purge", "%.0f MB / %.0f MB; n_dead_tup %d", f.heap1, f.idx1, f.dead1)
	row("VACUUM after the purge", "%.0f s (manual, no cost delay, beside the ingest and the loop); n_dead_tup after it %d", f.vacuumSecs, f.dead2)
	row("heap / indexes at the end", "%.0f MB / %.0f MB (%d records, %d of them ingested during the run)", f.heap2, f.idx2, f.rowsAfter, f.ingested)
	row("load average (1/5/15 min)", "start %s; end of pass 1 %s; end %s (2 cores)", f.loadAvgStart, f.loadAvgPurge, f.loadE)
	b.Log(sb.String())
	b.ReportMetric(alone, "alone-msgs/s")
	b.ReportMetric(during, "ingest-msgs/s")
	b.ReportMetric(purgeRate, "purge-rows/s")
	b.ReportMetric(purgeRate/during, "purge/ingest")
	b.ReportMetric(f.during.p99, "batch-p99-ms")
}
