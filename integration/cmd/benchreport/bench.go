package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"
)

// scope is the consumption-record scope of every workload.
const scope = "bench"

// payload is every message's payload (one fingerprint for all: duplicates
// match their records).
var payload = []byte(`{"amount":100,"currency":"EUR","pad":"0123456789abcdef0123456789abcdef"}`)

// bench is one run's services, schemas and stores.
type bench struct {
	cfg     config
	log     *slog.Logger
	dsn     string
	pool    *pgxpool.Pool
	rdb     *redis.Client
	brokers []string

	tag      string // random, in every schema, topic, group and key of the run
	pgbSch   string // pgbench's scratch schema
	idemqSch string // idemq's schema: records, dead letters, outbox, business table
	store    *pgstore.Store
	fast     *pgstore.Store // the same tables with the Redis fast path
	fastPfx  string
	ob       *outbox.Outbox
	pub      *kafkapub.Publisher
	pgbench  string // the pgbench binary
	pgMajor  int

	mu     sync.Mutex
	topics []string
	seq    int
	done   map[string]bool
}

// once reports whether the setup step named name has not run yet in this
// run, and marks it run.
func (b *bench) once(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done[name] {
		return false
	}
	if b.done == nil {
		b.done = map[string]bool{}
	}
	b.done[name] = true
	return true
}

func randomTag() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newBench connects to the TEST_* services and creates the run's schemas.
func newBench(ctx context.Context, cfg config, log *slog.Logger) (*bench, error) {
	b := &bench{cfg: cfg, log: log, tag: randomTag()}
	b.dsn = os.Getenv("TEST_POSTGRES_DSN")
	redisAddr := os.Getenv("TEST_REDIS_ADDR")
	brokers := os.Getenv("TEST_KAFKA_BROKERS")
	if b.dsn == "" || redisAddr == "" || brokers == "" {
		return nil, errors.New("TEST_POSTGRES_DSN, TEST_REDIS_ADDR and TEST_KAFKA_BROKERS must be set: " +
			"`make services-up`, then eval \"$(scripts/services.sh env)\" (make bench does both)")
	}
	b.brokers = strings.Split(brokers, ",")
	pc, err := pgxpool.ParseConfig(b.dsn)
	if err != nil {
		return nil, fmt.Errorf("TEST_POSTGRES_DSN: %w", err)
	}
	pc.MaxConns = 40 // 32 lanes, the baselines' reads and the relay
	if b.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, err
	}
	if err := b.pool.QueryRow(ctx, `select current_setting('server_version_num')::int / 10000`).Scan(&b.pgMajor); err != nil {
		return nil, fmt.Errorf("postgres at TEST_POSTGRES_DSN: %w", err)
	}
	if b.pgbench, err = findPGTool("pgbench", b.pgMajor); err != nil {
		return nil, err
	}
	b.rdb = redis.NewClient(redisfast.ClientOptions(redisAddr))

	b.pgbSch, b.idemqSch = "bench_"+b.tag+"_pgbench", "bench_"+b.tag+"_idemq"
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("benchreport-secret-0123456789abcdef")})
	if err != nil {
		return nil, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// pgbench's scratch schema: idemq's own migrations (same columns and
	// indexes as the records table) and the business table.
	scratch, err := pgstore.New(b.pool, pgstore.Config{Schema: b.pgbSch, Fingerprinter: fp, Logger: quiet})
	if err != nil {
		return nil, err
	}
	if b.store, err = pgstore.New(b.pool, pgstore.Config{Schema: b.idemqSch, Fingerprinter: fp, Logger: quiet}); err != nil {
		return nil, err
	}
	b.fastPfx = "idemq-bench-" + b.tag
	fast, err := redisfast.New(redisfast.Config{Client: b.rdb, Prefix: b.fastPfx, Timeout: time.Second, Logger: quiet})
	if err != nil {
		return nil, err
	}
	if b.fast, err = pgstore.New(b.pool, pgstore.Config{Schema: b.idemqSch, Fingerprinter: fp, FastPath: fast, Logger: quiet}); err != nil {
		return nil, err
	}
	for _, st := range []*pgstore.Store{scratch, b.store} {
		if err := st.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	for _, s := range []string{b.pgbSch, b.idemqSch} {
		if _, err := b.pool.Exec(ctx, `create table `+pgx.Identifier{s, "payments"}.Sanitize()+
			` (payment_id text primary key, amount bigint not null)`); err != nil {
			return nil, err
		}
	}
	if b.ob, err = outbox.New(b.pool, outbox.Config{Schema: b.idemqSch}); err != nil {
		return nil, err
	}
	if err := b.ob.Migrate(ctx); err != nil {
		return nil, err
	}
	if b.pub, err = kafkapub.New(kafkapub.Config{Brokers: b.brokers}); err != nil {
		return nil, err
	}
	return b, nil
}

// close drops what the run created: schemas, topics, Redis keys.
func (b *bench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if b.pub != nil {
		_ = b.pub.Close()
	}
	if b.pool != nil {
		for _, s := range []string{b.pgbSch, b.idemqSch} {
			if s != "" {
				if _, err := b.pool.Exec(ctx, `drop schema if exists `+pgx.Identifier{s}.Sanitize()+` cascade`); err != nil {
					b.log.Warn("drop schema", "schema", s, "err", err)
				}
			}
		}
		b.pool.Close()
	}
	if b.rdb != nil {
		iter := b.rdb.Scan(ctx, 0, b.fastPfx+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		for i := 0; i < len(keys); i += 1000 {
			_ = b.rdb.Del(ctx, keys[i:min(i+1000, len(keys))]...).Err()
		}
		_ = b.rdb.Close()
	}
	b.mu.Lock()
	topics := b.topics
	b.mu.Unlock()
	if len(topics) > 0 {
		cl := &kafka.Client{Addr: kafka.TCP(b.brokers...), Timeout: 30 * time.Second}
		if _, err := cl.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics}); err != nil {
			b.log.Warn("delete topics", "err", err)
		}
	}
}

// table is a quoted table of schema s.
func table(s, name string) string { return pgx.Identifier{s, name}.Sanitize() }

// runTag is a new prefix for the keys of one run.
func (b *bench) runTag(kind string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	return fmt.Sprintf("%s-%s-%d", kind, b.tag, b.seq)
}

// msg is a message of scope "bench" with the shared payload.
func msg(id string) (*dedup.Message, error) {
	ident, err := dedup.NewIdentity(scope, id, "", "")
	if err != nil {
		return nil, err
	}
	return &dedup.Message{Identity: ident, Payload: payload, Topic: "bench"}, nil
}

// wal snapshots pg_stat_wal (Postgres 14 and later; OK false before).
func (b *bench) wal(ctx context.Context) (walDelta, error) {
	if b.pgMajor < 14 {
		return walDelta{}, nil
	}
	w := walDelta{OK: true}
	err := b.pool.QueryRow(ctx, `select wal_sync, wal_records, wal_bytes::int8 from pg_stat_wal`).Scan(&w.Syncs, &w.Records, &w.Bytes)
	return w, err
}

func (w walDelta) sub(before walDelta) walDelta {
	if !w.OK || !before.OK {
		return walDelta{}
	}
	return walDelta{OK: true, Syncs: w.Syncs - before.Syncs, Records: w.Records - before.Records, Bytes: w.Bytes - before.Bytes}
}

// walReportDelay is how long a run's connections may keep WAL counts
// unreported once idle (PGSTAT_MIN_INTERVAL, 1s, and a margin).
const walReportDelay = 1100 * time.Millisecond

// flushStats makes the pool's connections report their WAL counts to
// pg_stat_wal, so that a run's snapshot holds all of it and the next run's
// nothing of it. A backend reports when it goes idle, at most once per
// second, unless pg_stat_force_next_flush() (PostgreSQL 15) asked it to at
// once; on older servers, or when the function is refused, this waits the
// second out.
func (b *bench) flushStats(ctx context.Context) error {
	if b.pgMajor >= 15 {
		conns := b.pool.AcquireAllIdle(ctx)
		var err error
		for _, c := range conns {
			if err == nil {
				_, err = c.Exec(ctx, `select pg_stat_force_next_flush()`)
			}
			c.Release()
		}
		if err == nil {
			return nil
		}
		b.log.Debug("pg_stat_force_next_flush", "err", err)
	}
	select {
	case <-time.After(walReportDelay):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// meter takes the WAL and allocation counts around a timed part.
type meter struct {
	b     *bench
	wal   walDelta
	mem   runtime.MemStats
	start time.Time
}

func (b *bench) startMeter(ctx context.Context) (*meter, error) {
	m := &meter{b: b}
	var err error
	if m.wal, err = b.wal(ctx); err != nil {
		return nil, err
	}
	runtime.ReadMemStats(&m.mem)
	m.start = time.Now()
	return m, nil
}

// stop ends the timed part: elapsed from start (or from since, when not
// zero) to now.
func (m *meter) stop(ctx context.Context, msgs int64, since time.Time) (sample, error) {
	end := time.Now()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	if m.wal.OK {
		if err := m.b.flushStats(ctx); err != nil {
			return sample{}, err
		}
	}
	w, err := m.b.wal(ctx)
	if err != nil {
		return sample{}, err
	}
	if since.IsZero() {
		since = m.start
	}
	return sample{Msgs: msgs, Elapsed: end.Sub(since), WAL: w.sub(m.wal), Mallocs: mem.Mallocs - m.mem.Mallocs}, nil
}

// call is one call of a lane operation: Key is unique in the run, Lane and
// Seq number the lane and its calls.
type call struct {
	Key       string
	Lane, Seq int
}

// laneOp is one call of a lane workload; it returns the messages it did.
type laneOp func(ctx context.Context, c call) (int, error)

// drive runs op on lanes goroutines for d and measures the run: messages,
// WAL, allocations and the latency of every call.
func (b *bench) drive(ctx context.Context, kind string, lanes int, d time.Duration, op laneOp) (sample, error) {
	tag := b.runTag(kind)
	m, err := b.startMeter(ctx)
	if err != nil {
		return sample{}, err
	}
	deadline := m.start.Add(d)
	lats := make([][]time.Duration, lanes)
	counts := make([]int64, lanes)
	g, gctx := errgroup.WithContext(ctx)
	for l := range lanes {
		g.Go(func() error {
			lat := make([]time.Duration, 0, 4096)
			for seq := 0; ; seq++ {
				t := time.Now()
				if !t.Before(deadline) {
					break
				}
				n, err := op(gctx, call{Key: tag + "-" + strconv.Itoa(l) + "-" + strconv.Itoa(seq), Lane: l, Seq: seq})
				if err != nil {
					return err
				}
				lat = append(lat, time.Since(t))
				counts[l] += int64(n)
			}
			lats[l] = lat
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return sample{}, err
	}
	var n int64
	var all []time.Duration
	for l := range lanes {
		n += counts[l]
		all = append(all, lats[l]...)
	}
	s, err := m.stop(ctx, n, time.Time{})
	s.Lat = all
	return s, err
}

// ---------------------------------------------------------------------------
// Tools.

// findPGTool finds a PostgreSQL client tool: /usr/lib/postgresql/<major>/bin
// of the server's major version, else the newest there, else PATH.
func findPGTool(name string, major int) (string, error) {
	p := filepath.Join("/usr/lib/postgresql", strconv.Itoa(major), "bin", name)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	found, _ := filepath.Glob(filepath.Join("/usr/lib/postgresql", "*", "bin", name))
	sort.Slice(found, func(i, j int) bool { return pgDirMajor(found[i]) > pgDirMajor(found[j]) })
	if len(found) > 0 {
		return found[0], nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found in /usr/lib/postgresql/*/bin nor PATH: install postgresql-client (make services-up installs postgresql)", name)
}

func pgDirMajor(p string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
	return n
}

// runTool runs a program and returns its stdout; stderr goes into the error.
func runTool(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...) // #nosec G204 -- the benchmark's own tools (pgbench, pg_test_fsync, go) with its own arguments
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, lastLines(errb.String()+out.String(), 10))
	}
	return out.String(), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// fsyncRate runs pg_test_fsync for short on the filesystem of the server's
// data directory (in a directory of ours on the same device, found by
// stat; the data directory itself is the server's), and returns the ops/s of
// the server's wal_sync_method and where it wrote.
func (b *bench) fsyncRate(ctx context.Context, repo string) (float64, string, error) {
	tool, err := findPGTool("pg_test_fsync", b.pgMajor)
	if err != nil {
		return 0, "", err
	}
	var method, dataDir string
	if err := b.pool.QueryRow(ctx, `select current_setting('wal_sync_method')`).Scan(&method); err != nil {
		return 0, "", err
	}
	// data_directory is readable by superusers and pg_read_all_settings only.
	_ = b.pool.QueryRow(ctx, `select current_setting('data_directory', true)`).Scan(&dataDir)
	dir, where := os.TempDir(), "in "+os.TempDir()+": not known to be the data directory's filesystem"
	var ds syscall.Stat_t
	if dataDir != "" && syscall.Stat(dataDir, &ds) == nil {
		for _, cand := range []string{filepath.Join(repo, ".cache"), os.TempDir()} {
			var cs syscall.Stat_t
			if syscall.Stat(cand, &cs) == nil && cs.Dev == ds.Dev {
				dir, where = cand, "on the data directory's filesystem"
				break
			}
		}
	}
	f, err := os.CreateTemp(dir, "pg_test_fsync-*")
	if err != nil {
		return 0, "", err
	}
	name := f.Name()
	_ = f.Close()
	defer func() { _ = os.Remove(name) }()
	out, err := runTool(ctx, "", tool, "-s", "1", "-f", name)
	if err != nil {
		return 0, "", err
	}
	v, err := parseFsync(out, method)
	return v, method + ", " + where, err
}

// pgSetup reads the server version and the settings not at their default
// (pg_settings where source <> 'default'), leaving out the session's own
// (sources client, session, override: the connection's, and paths
// the server was started with).
func (b *bench) pgSetup(ctx context.Context) (string, []string, error) {
	var version string
	if err := b.pool.QueryRow(ctx, `show server_version`).Scan(&version); err != nil {
		return "", nil, err
	}
	rows, err := b.pool.Query(ctx, `select name || '=' || current_setting(name) from pg_settings
		where source <> 'default' and source not in ('client', 'session', 'override')
		   or name in ('fsync', 'synchronous_commit', 'wal_sync_method', 'full_page_writes', 'wal_level')
		order by name`)
	if err != nil {
		return "", nil, err
	}
	settings, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return version, settings, err
}

// cpuModel is /proc/cpuinfo's model name ("unknown" elsewhere).
func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// newTopic creates a topic of the run (deleted by close).
func (b *bench) newTopic(ctx context.Context, partitions int) (string, error) {
	topic := "idemq-bench-" + b.runTag("t")
	if err := kafkaadapter.EnsureTopics(ctx, b.brokers, partitions, topic); err != nil {
		return "", err
	}
	b.mu.Lock()
	b.topics = append(b.topics, topic)
	b.mu.Unlock()
	return topic, nil
}
