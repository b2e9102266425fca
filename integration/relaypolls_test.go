package integration

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// relayPolls is a pgx tracer on a relay's own pool that counts the relay's
// polls: claim transactions (a transaction that ran the heads statement,
// "... for update of o skip locked") that have ended, by commit or rollback.
// A test waits on it instead of sleeping "long enough" for the relay to have
// looked at the table: after n more polls every row that was committed
// before the wait began has been seen by a claim at least once. It also
// notes when the relay's LISTEN statement has completed, to tell a poll
// begun after it (the relay idle and listening) from one begun before.
type relayPolls struct {
	mu          sync.Mutex
	listening   bool
	open        map[*pgx.Conn]bool // connections in a claim transaction → claim begun after LISTEN
	done        int64              // claim transactions ended
	afterListen int64              // of those, claims begun after LISTEN completed
}

// sqlKey carries a statement's text from TraceQueryStart to TraceQueryEnd.
type sqlKey struct{}

func (p *relayPolls) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "skip locked") {
		p.mu.Lock()
		if _, ok := p.open[conn]; !ok {
			p.open[conn] = p.listening
		}
		p.mu.Unlock()
	}
	return context.WithValue(ctx, sqlKey{}, d.SQL)
}

func (p *relayPolls) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(sqlKey{}).(string)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case strings.HasPrefix(strings.ToLower(strings.TrimSpace(sql)), "listen ") && d.Err == nil:
		p.listening = true
	case sql == "commit" || sql == "rollback":
		if after, ok := p.open[conn]; ok {
			delete(p.open, conn)
			p.done++
			if after {
				p.afterListen++
			}
		}
	}
}

func (p *relayPolls) counts() (done, afterListen int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done, p.afterListen
}

// waitMore waits until n more polls than now have ended. With n greater
// than the relay's Workers (1 in fastRelay) the last of them began after
// this call (at most one poll per worker is under way at the call), so it
// saw every row committed before the call.
func (p *relayPolls) waitMore(t testing.TB, n int64, what string) {
	t.Helper()
	done, _ := p.counts()
	eventually(t, 60*time.Second, what, func() bool {
		d, _ := p.counts()
		return d >= done+n
	})
}

// waitIdleListening waits until the relay listens and a poll begun after its
// LISTEN completed has ended: the relay's workers have seen the table since
// the LISTEN (the wake-up the relay gives itself once it listens included),
// so with a long PollInterval only a notification, or a later poll, makes
// them look again.
func (p *relayPolls) waitIdleListening(t testing.TB) {
	t.Helper()
	eventually(t, 60*time.Second, "the relay to listen and finish a poll begun after its LISTEN", func() bool {
		_, after := p.counts()
		return after >= 1
	})
}

// polledOutbox returns an Outbox on the test's outbox table through a pool
// of its own whose polls the returned relayPolls counts. Build the relay on
// it (o.startRelayOn).
func (o *obEnv) polledOutbox(t testing.TB) (*outbox.Outbox, *relayPolls) {
	t.Helper()
	polls := &relayPolls{open: map[*pgx.Conn]bool{}}
	cfg, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = polls
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(o.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := outbox.New(pool, o.ob.Config())
	if err != nil {
		t.Fatal(err)
	}
	return ob, polls
}
