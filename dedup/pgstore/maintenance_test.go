package pgstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// maintLoop is one RunMaintenance of a test, with its own metrics.
type maintLoop struct {
	metrics *MaintenanceMetrics
	cancel  context.CancelFunc
	done    chan error
}

func startMaintenance(t *testing.T, e *storeEnv, st *Store, cfg MaintenanceConfig) *maintLoop {
	t.Helper()
	m, err := NewMaintenanceMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Metrics = m
	ctx, cancel := context.WithCancel(e.ctx)
	l := &maintLoop{metrics: m, cancel: cancel, done: make(chan error, 1)}
	go func() { l.done <- st.RunMaintenance(ctx, cfg) }()
	t.Cleanup(func() { l.stop(t) })
	return l
}

var stopOnce sync.Map

func (l *maintLoop) stop(t *testing.T) {
	if _, done := stopOnce.LoadOrStore(l, true); done {
		return
	}
	l.cancel()
	select {
	case err := <-l.done:
		if err != nil {
			t.Errorf("RunMaintenance = %v, want nil after ctx ended", err)
		}
	case <-time.After(time.Minute):
		t.Error("RunMaintenance did not return after ctx ended")
	}
}

func (l *maintLoop) leader() bool { return testutil.ToFloat64(l.metrics.leader) == 1 }

// lockHolders are the backends holding the advisory lock key.
func (e *storeEnv) lockHolders(key int64) []int {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx, `select pid from pg_locks where locktype = 'advisory' and granted
		and database = (select oid from pg_database where datname = current_database())
		and ((classid::bigint << 32) | objid::bigint) = $1 and objsubid = 1`, key)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			e.t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return pids
}

func waitMaint(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Two maintenance loops on one table elect one leader through the advisory
// lock; only it purges (records and old dead letters). When the leader's
// connection is killed, it stops leading and the other instance takes the
// lock and purges what expires next.
func TestMaintenanceLeaderElectionAndTakeover(t *testing.T) {
	e := newOwnSchemaEnv(t, nil)
	key := MaintenanceLockKey(e.schema, "consumption_records")
	expired := func(prefix string, n int) {
		t.Helper()
		e.exec(`insert into `+e.records()+` (scope, message_id, fingerprint, fingerprint_key_id, status, created_at, expires_at)
			select $1, $2 || g, '\x00', 'k1', 'SUCCEEDED', now() - interval '8 days', now() - interval '1 day'
			from generate_series(1, $3::int) g`, e.scope, prefix, n)
	}
	left := func() int { return e.count(`select count(*) from ` + e.records() + ` where expires_at < now()`) }
	expired("a-", 50)
	e.exec(`insert into `+e.schema+`.dead_letters (scope, message_id, reason, created_at)
		select $1, 'dl-' || g, 'failed', now() - interval '40 days' from generate_series(1, 5) g`, e.scope)

	// A leads (its LockRetry is long: once it loses the lock it does not
	// take it back within the test); B waits.
	a := startMaintenance(t, e, e.store, MaintenanceConfig{Interval: 100 * time.Millisecond, LockRetry: time.Hour, Batch: 7})
	waitMaint(t, "A to lead", a.leader)
	waitMaint(t, "A's first pass", func() bool { return testutil.ToFloat64(a.metrics.lastSuccess) > 0 })
	if n := left(); n != 0 {
		t.Fatalf("%d expired records left after a pass", n)
	}
	if n := e.count(`select count(*) from ` + e.schema + `.dead_letters`); n != 0 {
		t.Fatalf("%d old dead letters left", n)
	}
	if got := testutil.ToFloat64(a.metrics.purged.WithLabelValues("records")); got != 50 {
		t.Fatalf("A purged_rows{records} = %v, want 50", got)
	}
	if got := testutil.ToFloat64(a.metrics.purged.WithLabelValues("dead_letters")); got != 5 {
		t.Fatalf("A purged_rows{dead_letters} = %v, want 5", got)
	}

	b := startMaintenance(t, e, e.newStore(e.pool, nil), MaintenanceConfig{Interval: 100 * time.Millisecond, LockRetry: 100 * time.Millisecond})
	holders := e.lockHolders(key)
	if len(holders) != 1 {
		t.Fatalf("lock holders %v, want one", holders)
	}
	// B keeps trying for a while and never leads while A holds the lock.
	expired("b-", 20)
	waitMaint(t, "A purging again", func() bool { return left() == 0 })
	time.Sleep(500 * time.Millisecond) // several of B's LockRetry periods
	if b.leader() || testutil.ToFloat64(b.metrics.purged.WithLabelValues("records")) != 0 {
		t.Fatal("B led or purged while A held the lock")
	}

	// Kill A's lock connection: B takes over and purges; A stops leading.
	e.exec(`select pg_terminate_backend($1)`, holders[0])
	waitMaint(t, "B to lead", b.leader)
	waitMaint(t, "A to notice", func() bool { return !a.leader() })
	expired("c-", 30)
	waitMaint(t, "B's purge", func() bool { return left() == 0 })
	waitMaint(t, "B's count", func() bool { return testutil.ToFloat64(b.metrics.purged.WithLabelValues("records")) >= 30 })
	if got := testutil.ToFloat64(b.metrics.purged.WithLabelValues("records")); got != 30 {
		t.Fatalf("B purged_rows{records} = %v, want 30", got)
	}
	if h := e.lockHolders(key); len(h) != 1 || h[0] == holders[0] {
		t.Fatalf("lock holders %v after the kill of %d, want B's backend alone", h, holders[0])
	}

	// B's shutdown releases the lock.
	b.stop(t)
	waitMaint(t, "the lock released", func() bool { return len(e.lockHolders(key)) == 0 })
}

// Validate names the field out of range.
func TestMaintenanceConfigValidate(t *testing.T) {
	e := newEnv(t, nil)
	for _, c := range []struct {
		cfg  MaintenanceConfig
		name string
	}{
		{MaintenanceConfig{Interval: time.Millisecond}, "Interval"},
		{MaintenanceConfig{Batch: -1}, "Batch"},
		{MaintenanceConfig{LockRetry: time.Millisecond}, "LockRetry"},
		{MaintenanceConfig{DeadLetterRetention: 24 * time.Hour}, "DeadLetterRetention"},
	} {
		err := c.cfg.Validate(e.store)
		if !errors.Is(err, dedup.ErrInvalidConfig) || !strings.Contains(err.Error(), "MaintenanceConfig."+c.name) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig naming %s", c.cfg, err, c.name)
		}
		if err := e.store.RunMaintenance(e.ctx, c.cfg); !errors.Is(err, dedup.ErrInvalidConfig) {
			t.Errorf("RunMaintenance(%+v) = %v", c.cfg, err)
		}
	}
	if err := (MaintenanceConfig{DeadLetterRetention: -1}).Validate(e.store); err != nil {
		t.Errorf("a negative DeadLetterRetention (never) = %v", err)
	}
}
