package pgstore

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// forwarder is a TCP forwarder to target that can be shut down with its
// connections: the "old primary" of a two-host DSN.
type forwarder struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newForwarder(t *testing.T, target string) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target) //nolint:gosec // the test's own Postgres, from TEST_POSTGRES_DSN
			if err != nil {
				_ = c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, s)
			f.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		}
	}()
	t.Cleanup(f.shutdown)
	return f
}

func (f *forwarder) shutdown() {
	_ = f.ln.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		_ = c.Close()
	}
}

// A pool on a two-host DSN whose first host goes away reconnects to the
// second by itself; WatchFailover logs the change once and counts it.
func TestWatchFailoverReportsAChangeOfServer(t *testing.T) {
	needDB(t)
	dsn := os.Getenv("TEST_POSTGRES_DSN")
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	direct := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	old := newForwarder(t, direct)
	_, oldPort, _ := net.SplitHostPort(old.ln.Addr().String())
	// Hosts in order: the forwarder first (the "primary"), then the server itself.
	two := strings.Replace(dsn, direct, "127.0.0.1:"+oldPort+","+direct, 1)
	if two == dsn {
		t.Fatalf("DSN %q does not name %s", dsn, direct)
	}
	cfg, err = pgxpool.ParseConfig(two)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	w, err := WatchFailover(cfg, FailoverOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	if got := w.Server(); got != old.ln.Addr().String() {
		t.Fatalf("first server %q, want the forwarder %s", got, old.ln.Addr())
	}
	if w.Changes() != 0 || logs.Len() != 0 {
		t.Fatalf("before the failover: %d changes, log %q", w.Changes(), logs.String())
	}

	old.shutdown() // the primary is gone: its connections and its address
	// The pooled connection is dead; the statement on it fails (or pgx
	// notices first). The next ones connect to the second host.
	_, _ = pool.Exec(ctx, "select 1")
	if _, err := pool.Exec(ctx, "select 1"); err != nil {
		t.Fatalf("after the failover: %v", err)
	}
	if got := w.Server(); got != direct {
		t.Fatalf("server after the failover %q, want %s", got, direct)
	}
	if w.Changes() != 1 {
		t.Fatalf("changes = %d, want 1", w.Changes())
	}
	if n, err := testutil.GatherAndCount(reg, "idemq_postgres_server_changes_total"); err != nil || n != 1 {
		t.Fatalf("idemq_postgres_server_changes_total: %d series, %v", n, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idemq_postgres_server_changes_total New pool connections that reached another Postgres server than the connection before them (a failover or switchover).
# TYPE idemq_postgres_server_changes_total counter
idemq_postgres_server_changes_total 1
`)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "new connections reach another server") || !strings.Contains(logs.String(), "to="+direct) {
		t.Fatalf("log %q, want the change from %s to %s", logs.String(), old.ln.Addr(), direct)
	}
	if strings.Count(logs.String(), "another server") != 1 {
		t.Fatalf("log %q: want one line", logs.String())
	}
}

// An AfterConnect set before WatchFailover still runs, and its error still
// refuses the connection.
func TestWatchFailoverKeepsAfterConnect(t *testing.T) {
	needDB(t)
	cfg, err := pgxpool.ParseConfig(os.Getenv("TEST_POSTGRES_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	refuse := io.ErrUnexpectedEOF
	cfg.AfterConnect = func(context.Context, *pgx.Conn) error { return refuse }
	w, err := WatchFailover(cfg, FailoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), "select 1"); err == nil {
		t.Fatal("the earlier AfterConnect's error did not refuse the connection")
	}
	if w.Server() != "" {
		t.Fatalf("a refused connection was noted: %q", w.Server())
	}
}
