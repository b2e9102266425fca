package pgstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/pooler"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultDeadLetterRetention is how long dead letters are kept when
// MaintenanceConfig.DeadLetterRetention is 0, and the default of
// `idemq purge --dead-letters --older-than`: 30 days, the default
// Config.FailedFinalRetention.
const DefaultDeadLetterRetention = 30 * 24 * time.Hour

// MaintenanceConfig configures Store.RunMaintenance. The zero value is
// valid: every field has a default.
type MaintenanceConfig struct {
	// Interval is the pause between the end of one pass and the start of
	// the next. Default 5m; at least 100ms.
	Interval time.Duration
	// Batch is how many rows one purge statement reads (and so at most
	// deletes). Default DefaultPurgeBatch (1000); 1 to 100000.
	Batch int
	// Pause is the sleep between two statements of a pass, so that a long
	// backlog is deleted at a bounded rate. Default 10ms; negative: none.
	Pause time.Duration
	// DeadLetterRetention is how long dead letters are kept (from their
	// creation, re-driven or not; see Store.PurgeDeadLetters). Default
	// DefaultDeadLetterRetention (30 days); at least the store's
	// Config.FailedFinalRetention, so that a FAILED_FINAL record never
	// outlives its dead letter; negative: dead letters are never purged.
	DeadLetterRetention time.Duration
	// LockRetry is how often an instance that is not the leader tries to
	// take the advisory lock. Default 30s; at least 100ms.
	LockRetry time.Duration
	// LockKey is the key of the session-level advisory lock
	// (pg_try_advisory_lock) that elects the one instance purging the
	// tables. Default 0: derived from the schema and the records table
	// name (MaintenanceLockKey), so stores of different tables elect
	// their leaders apart.
	LockKey int64
	// Metrics receives the loop's measurements. Default nil: none. Build
	// it with NewMaintenanceMetrics.
	Metrics *MaintenanceMetrics
	// Logger receives a line per pass (debug), leadership changes (info)
	// and failed passes (warning). Default the store's Config.Logger.
	Logger *slog.Logger
}

func (c MaintenanceConfig) withDefaults(s *Store) MaintenanceConfig {
	if c.Interval == 0 {
		c.Interval = 5 * time.Minute
	}
	if c.Batch == 0 {
		c.Batch = DefaultPurgeBatch
	}
	if c.Pause == 0 {
		c.Pause = 10 * time.Millisecond
	}
	if c.DeadLetterRetention == 0 {
		c.DeadLetterRetention = DefaultDeadLetterRetention
	}
	if c.LockRetry == 0 {
		c.LockRetry = 30 * time.Second
	}
	if c.LockKey == 0 {
		c.LockKey = MaintenanceLockKey(s.cfg.Schema, s.cfg.RecordsTable)
	}
	if c.Logger == nil {
		c.Logger = s.cfg.Logger
	}
	return c
}

// Validate returns an error wrapping dedup.ErrInvalidConfig that names the
// first field out of range, after the defaults are applied, for a loop on
// s (DeadLetterRetention is checked against s's FailedFinalRetention).
func (c MaintenanceConfig) Validate(s *Store) error {
	d := c.withDefaults(s)
	switch {
	case d.Interval < 100*time.Millisecond:
		return fmt.Errorf("%w: MaintenanceConfig.Interval %s must be at least 100ms", dedup.ErrInvalidConfig, d.Interval)
	case d.Batch < 1 || d.Batch > 100000:
		return fmt.Errorf("%w: MaintenanceConfig.Batch %d must be 1 to 100000", dedup.ErrInvalidConfig, d.Batch)
	case d.LockRetry < 100*time.Millisecond:
		return fmt.Errorf("%w: MaintenanceConfig.LockRetry %s must be at least 100ms", dedup.ErrInvalidConfig, d.LockRetry)
	case d.DeadLetterRetention > 0 && d.DeadLetterRetention < s.cfg.FailedFinalRetention:
		return fmt.Errorf("%w: MaintenanceConfig.DeadLetterRetention %s is shorter than FailedFinalRetention %s: a FAILED_FINAL record would outlive its dead letter",
			dedup.ErrInvalidConfig, d.DeadLetterRetention, s.cfg.FailedFinalRetention)
	}
	return nil
}

// MaintenanceLockKey is the default advisory-lock key of RunMaintenance for
// the records table schema.table: the FNV-64a hash of
// "idemq maintenance <schema>.<table>".
func MaintenanceLockKey(schema, recordsTable string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("idemq maintenance " + schema + "." + recordsTable))
	return int64(h.Sum64()) //nolint:gosec // a lock key: any 64 bits will do
}

// MaintenanceMetrics are the Prometheus metrics of RunMaintenance:
//
//   - idemq_maintenance_purged_rows_total{kind="records|dead_letters"}
//     (counter): rows deleted by this instance;
//   - idemq_maintenance_pass_duration_seconds (histogram): passes that
//     completed, in seconds;
//   - idemq_maintenance_last_success_timestamp_seconds (gauge): Unix time
//     of the end of this instance's last complete pass (alert when every
//     instance's is older than a few Intervals);
//   - idemq_maintenance_leader (gauge): 1 while this instance holds the
//     advisory lock, else 0.
//
// Two loops in one process need two registries (or
// prometheus.WrapRegistererWith a label of their own).
type MaintenanceMetrics struct {
	purged      *prometheus.CounterVec
	passSeconds prometheus.Histogram
	lastSuccess prometheus.Gauge
	leader      prometheus.Gauge
}

// NewMaintenanceMetrics creates the metrics and registers them on reg
// (nil: prometheus.DefaultRegisterer). It returns the registration error
// (e.g. prometheus.AlreadyRegisteredError).
func NewMaintenanceMetrics(reg prometheus.Registerer) (*MaintenanceMetrics, error) {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	m := &MaintenanceMetrics{
		purged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idemq_maintenance_purged_rows_total",
			Help: "Rows deleted by the maintenance loop, by kind (records, dead_letters)."}, []string{"kind"}),
		passSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "idemq_maintenance_pass_duration_seconds",
			Help: "Duration of the maintenance loop's complete passes.", Buckets: prometheus.ExponentialBuckets(0.01, 4, 10)}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "idemq_maintenance_last_success_timestamp_seconds",
			Help: "Unix time of the end of the last complete maintenance pass of this instance."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "idemq_maintenance_leader",
			Help: "1 while this instance holds the maintenance advisory lock."}),
	}
	for _, c := range []prometheus.Collector{m.purged, m.passSeconds, m.lastSuccess, m.leader} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("idemq: maintenance metrics: %w", err)
		}
	}
	m.purged.WithLabelValues("records")
	m.purged.WithLabelValues("dead_letters")
	return m, nil
}

// RunMaintenance purges expired records and old dead letters until ctx
// ends, then returns nil (or at once an error wrapping
// dedup.ErrInvalidConfig for an invalid cfg). Run it in every instance:
// they elect one leader with a session-level advisory lock
// (pg_try_advisory_lock(cfg.LockKey)) held on a connection of the store's
// pool taken for the purpose, and only the leader purges; the others try
// the lock every cfg.LockRetry. The leader runs every purge statement on
// that connection, so when it is lost (the backend killed, the network
// cut, the process gone) Postgres releases the lock, the leader's next
// statement fails and it stops purging, and another instance takes the
// lock at its next try.
//
// A pass is PurgeRecords and then PurgeDeadLetters (with
// cfg.DeadLetterRetention, unless negative), cfg.Batch rows per statement
// and cfg.Pause between statements; passes start cfg.Interval after the
// previous one ended. A failed pass is logged and retried at the next
// Interval. The pool must allow one connection more than the rest of the
// process uses (the leader holds one). With Config.TransactionPooler set it
// returns at once an error wrapping ErrNeedsSession: the leader's lock is a
// session lock, which a transaction pooler would leave on a server
// connection it hands to other clients.
func (s *Store) RunMaintenance(ctx context.Context, cfg MaintenanceConfig) error {
	if s.cfg.TransactionPooler {
		return pooler.NeedsSession("idemq: maintenance", "pgstore.Config.TransactionPooler",
			"run RunMaintenance on a Store built on a direct pool to Postgres (same Config, TransactionPooler false)")
	}
	if err := cfg.Validate(s); err != nil {
		return err
	}
	cfg = cfg.withDefaults(s)
	m, err := s.maintQueries()
	if err != nil {
		return err
	}
	for {
		conn, err := s.tryLead(ctx, cfg)
		if err != nil && ctx.Err() == nil {
			cfg.Logger.WarnContext(ctx, "idemq: maintenance: lock", "err", err)
		}
		if conn != nil {
			cfg.Logger.InfoContext(ctx, "idemq: maintenance: leading", "lock_key", cfg.LockKey)
			cfg.Metrics.setLeader(true)
			err := s.lead(ctx, conn, m, cfg)
			cfg.Metrics.setLeader(false)
			s.releaseLead(conn, cfg, err)
			if ctx.Err() == nil {
				cfg.Logger.WarnContext(ctx, "idemq: maintenance: lost the lead", "err", err)
			}
		}
		if !sleep(ctx, cfg.LockRetry) {
			return nil
		}
	}
}

// tryLead acquires a connection and the advisory lock on it: the
// connection, or nil (lock held elsewhere, or an error).
func (s *Store) tryLead(ctx context.Context, cfg MaintenanceConfig) (*pgxpool.Conn, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	var got bool
	if err := conn.QueryRow(ctx, "select pg_try_advisory_lock($1)", cfg.LockKey).Scan(&got); err != nil {
		conn.Release()
		return nil, err
	}
	if !got {
		conn.Release()
		return nil, nil
	}
	return conn, nil
}

// releaseLead gives up the lead: the lock is unlocked when the connection
// still works, else the connection is closed (which releases it).
func (s *Store) releaseLead(conn *pgxpool.Conn, cfg MaintenanceConfig, leadErr error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if leadErr == nil || errors.Is(leadErr, context.Canceled) {
		if _, err := conn.Exec(ctx, "select pg_advisory_unlock($1)", cfg.LockKey); err == nil {
			conn.Release()
			return
		}
	}
	_ = conn.Conn().Close(ctx) // a session lock must never go back to the pool
	conn.Release()
}

// lead runs passes on conn until ctx ends (nil) or a statement fails on
// conn (its error: the lock may be gone).
func (s *Store) lead(ctx context.Context, conn *pgxpool.Conn, m maintQueries, cfg MaintenanceConfig) error {
	for {
		start := time.Now()
		err := s.pass(ctx, conn, m, cfg)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			// Is the lock still ours? A dead connection fails this too.
			var held bool
			if qerr := conn.QueryRow(ctx, "select pg_try_advisory_lock($1)", cfg.LockKey).Scan(&held); qerr != nil {
				return fmt.Errorf("%w (lock connection: %w)", err, qerr)
			}
			if held { // re-entrant: drop the extra hold
				_, _ = conn.Exec(ctx, "select pg_advisory_unlock($1)", cfg.LockKey)
			}
			cfg.Logger.WarnContext(ctx, "idemq: maintenance: pass failed", "err", err)
		} else {
			cfg.Metrics.passDone(time.Since(start))
		}
		if !sleep(ctx, cfg.Interval) {
			return nil
		}
	}
}

// pass purges records, then dead letters, on conn.
func (s *Store) pass(ctx context.Context, conn *pgxpool.Conn, m maintQueries, cfg MaintenanceConfig) error {
	records, err := walkPurge(ctx, conn, "purge", s.q.purgeBoundSQL, s.q.purgeSQL, cfg.Batch, s.cfg.SucceededRetention, cfg.Pause, nil)
	cfg.Metrics.purgedRows("records", records)
	if err != nil {
		return err
	}
	var dls int64
	if cfg.DeadLetterRetention > 0 {
		dls, err = walkPurge(ctx, conn, "purge dead letters", m.deadLettersPurgeBoundSQL, m.deadLettersPurgeSQL, cfg.Batch, cfg.DeadLetterRetention, cfg.Pause, nil)
		cfg.Metrics.purgedRows("dead_letters", dls)
	}
	cfg.Logger.DebugContext(ctx, "idemq: maintenance: pass", "records", records, "dead_letters", dls, "err", err)
	return err
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (m *MaintenanceMetrics) setLeader(on bool) {
	if m == nil {
		return
	}
	if on {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
}

func (m *MaintenanceMetrics) passDone(d time.Duration) {
	if m == nil {
		return
	}
	m.passSeconds.Observe(d.Seconds())
	m.lastSuccess.SetToCurrentTime()
}

func (m *MaintenanceMetrics) purgedRows(kind string, n int64) {
	if m == nil || n == 0 {
		return
	}
	m.purged.WithLabelValues(kind).Add(float64(n))
}
