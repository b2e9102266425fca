package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgOutbox returns a migrated Outbox in a schema of its own on the Postgres
// of TEST_POSTGRES_DSN, dropped when the test ends. Without the variable the
// test is skipped, except under CI=true, where it fails.
func pgOutbox(t *testing.T) (*Outbox, context.Context) {
	t.Helper()
	dsn := os.Getenv("TEST_POSTGRES_DSN")
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("TEST_POSTGRES_DSN is not set (CI=true): start the services (scripts/services.sh up) and export their endpoints")
		}
		t.Skip("TEST_POSTGRES_DSN not set: start Postgres (scripts/services.sh up) to run the outbox's Postgres tests")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "obtest_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `drop schema if exists `+schema+` cascade`)
		pool.Close()
	})
	ob, err := New(pool, Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return ob, ctx
}

// addRows commits n keyless rows in one transaction.
func addRows(t *testing.T, ctx context.Context, ob *Outbox, n int) {
	t.Helper()
	tx, err := ob.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{Topic: "t", Payload: []byte(fmt.Sprint(i))}
	}
	if _, err := ob.AddBatch(ctx, tx, msgs); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// listenBackends returns the pids of the backends LISTENing on ob's channel
// (the channel names the test's own schema, so no other test's backend
// matches).
func listenBackends(t *testing.T, ctx context.Context, ob *Outbox) []int32 {
	t.Helper()
	rows, err := ob.pool.Query(ctx, `select pid from pg_stat_activity
where datname = current_database() and backend_type = 'client backend' and query = $1 and pid <> pg_backend_pid()`, ob.q.listenSQL)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

func published(t *testing.T, ctx context.Context, ob *Outbox) int64 {
	t.Helper()
	s, err := ob.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s.Published
}

// waitFor polls cond every 20ms until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		<-tick.C
	}
}

// logLines records "LEVEL message" per log record.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, r.Level.String()+" "+r.Message)
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

func (l *logLines) matching(level slog.Level, text string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.lines {
		if strings.HasPrefix(s, level.String()+" ") && strings.Contains(s, text) {
			out = append(out, s)
		}
	}
	return out
}

// The relay's LISTEN connection is lost (its backend terminated with
// pg_terminate_backend, only that one): the relay falls back to polling at
// once, every FallbackPollInterval, although its PollInterval is an hour,
// and reconnects in the background (two reconnects fail, the third is held
// by the test through testSignals.beforeListen); once LISTEN is back,
// notifications wake it again. One warning for the loss, one info line for
// the return. The publisher is a stand-in: this is about waking, and every
// assertion reads the rows' published state in Postgres.
func TestRelayListenLostFallsBackToPolling(t *testing.T) {
	t.Parallel()
	ob, ctx := pgOutbox(t)
	var attempts atomic.Int32
	holding := make(chan struct{}, 1)
	release := make(chan struct{})
	logs := &logLines{}
	pub := PublisherFunc(func(context.Context, []Envelope) error { return nil })
	r, err := NewRelay(ob, pub, RelayConfig{Name: "listen-lost", PollInterval: time.Hour, FallbackPollInterval: 100 * time.Millisecond,
		Logger: slog.New(logs), ShutdownGrace: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r.testSignals.beforeListen = func(ctx context.Context) error {
		switch attempts.Add(1) {
		case 1:
			return nil
		case 2, 3:
			return errors.New("connection refused (simulated failed reconnect)")
		}
		// Later reconnects wait until the test lets them: the LISTEN
		// connection stays down meanwhile.
		select {
		case holding <- struct{}{}:
		default:
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	waitFor(t, 30*time.Second, "the relay's LISTEN connection", func() bool { return len(listenBackends(t, ctx, ob)) == 1 })
	addRows(t, ctx, ob, 5)
	waitFor(t, 30*time.Second, "rows published through NOTIFY", func() bool { return published(t, ctx, ob) == 5 })

	pids := listenBackends(t, ctx, ob)
	if len(pids) != 1 {
		t.Fatalf("LISTEN backends %v, want the relay's one", pids)
	}
	var ok bool
	if err := ob.pool.QueryRow(ctx, `select pg_terminate_backend($1)`, pids[0]).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pids[0], ok, err)
	}
	select {
	case <-holding: // the relay saw the loss and is reconnecting
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not try to reconnect 30s after its LISTEN backend was terminated")
	}
	addRows(t, ctx, ob, 5)
	waitFor(t, 30*time.Second, "rows published by the fallback polling while LISTEN is down (PollInterval is 1h)",
		func() bool { return published(t, ctx, ob) == 10 })
	if n := len(listenBackends(t, ctx, ob)); n != 0 {
		t.Fatalf("%d LISTEN backends while the reconnect is held, want 0", n)
	}

	close(release)
	waitFor(t, 30*time.Second, "the LISTEN connection back", func() bool { return len(listenBackends(t, ctx, ob)) == 1 })
	addRows(t, ctx, ob, 5)
	waitFor(t, 30*time.Second, "rows published through NOTIFY after the reconnect", func() bool { return published(t, ctx, ob) == 15 })
	// One loss, however many reconnects failed during it: one warning, one
	// info line.
	if st := r.Stats(); st.ListenLost != 1 || attempts.Load() != 4 {
		t.Fatalf("relay stats %+v after %d connect attempts, want 1 LISTEN connection lost after 4", st, attempts.Load())
	}
	if w, i := logs.matching(slog.LevelWarn, "LISTEN"), logs.matching(slog.LevelInfo, "LISTEN"); len(w) != 1 || len(i) != 1 {
		t.Fatalf("LISTEN log lines: warnings %q, info %q; want one each", w, i)
	}
}
