package pgstore

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// FailoverOptions configure WatchFailover.
type FailoverOptions struct {
	// Logger receives one Warn line per change of server. Default
	// slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the counter
	// idemq_postgres_server_changes_total: how many times a new connection
	// of the pool reached another server than the connection before it.
	// Nil: no metric (the count is still in FailoverWatch.Changes).
	Registerer prometheus.Registerer
}

// FailoverWatch reports a Postgres failover as the pool sees it: a new
// connection that reaches another server (host and port) than the one
// before it. Make it with WatchFailover.
type FailoverWatch struct {
	logger  *slog.Logger
	counter prometheus.Counter
	mu      sync.Mutex
	server  string
	changes int64
}

// WatchFailover chains a hook onto cfg.AfterConnect (an AfterConnect
// already set runs first; its error still refuses the connection) that
// notes the server every new connection of the pool reached. When it is
// another server than the last one, the watch logs
// "postgres: new connections reach another server" with both addresses and
// counts it.
//
// It adds no round trip: the address is the connection's own. pgxpool
// already reconnects by itself: connections to a server that went away
// fail and are dropped, and new ones follow the DSN. With a multi-host DSN
// and target_session_attrs=read-write (see docs/operations.md, "Postgres
// failover"), only a writable server is accepted, so a change of server is
// a failover (or a switchover). Behind a DNS name or virtual IP that moves
// with the primary, the address does not change and nothing is reported.
//
// It returns an error only when the metric cannot be registered (for
// example prometheus.AlreadyRegisteredError).
func WatchFailover(cfg *pgxpool.Config, opt FailoverOptions) (*FailoverWatch, error) {
	w := &FailoverWatch{logger: opt.Logger}
	if w.logger == nil {
		w.logger = slog.Default()
	}
	if opt.Registerer != nil {
		w.counter = prometheus.NewCounter(prometheus.CounterOpts{Name: "idemq_postgres_server_changes_total",
			Help: "New pool connections that reached another Postgres server than the connection before them (a failover or switchover)."})
		if err := opt.Registerer.Register(w.counter); err != nil {
			return nil, fmt.Errorf("idemq: failover metric: %w", err)
		}
	}
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if prev != nil {
			if err := prev(ctx, conn); err != nil {
				return err
			}
		}
		w.observe(serverOf(conn))
		return nil
	}
	return w, nil
}

// serverOf is the host:port a connection reached, as the driver connected
// to it (the DSN's host for one in a multi-host list).
func serverOf(conn *pgx.Conn) string {
	pc := conn.PgConn()
	if nc := pc.Conn(); nc != nil && nc.RemoteAddr() != nil {
		return nc.RemoteAddr().String()
	}
	return fmt.Sprintf("%s:%d", conn.Config().Host, conn.Config().Port)
}

func (w *FailoverWatch) observe(server string) {
	w.mu.Lock()
	from := w.server
	w.server = server
	changed := from != "" && from != server
	if changed {
		w.changes++
	}
	w.mu.Unlock()
	if !changed {
		return
	}
	if w.counter != nil {
		w.counter.Inc()
	}
	w.logger.Warn("postgres: new connections reach another server (failover or switchover)",
		slog.String("from", from), slog.String("to", server))
}

// Server is the server (host:port) the pool's last new connection reached;
// "" before the first.
func (w *FailoverWatch) Server() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.server
}

// Changes is how many times a new connection reached another server than
// the one before it.
func (w *FailoverWatch) Changes() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changes
}
