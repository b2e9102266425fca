package integration

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
)

// relayOutbox returns an Outbox on the test's outbox table whose connections
// carry the Postgres application_name app, so that a test can find the
// relay's open claim transaction in pg_stat_activity. Build the relay on it
// with outbox.NewRelay.
func (o *obEnv) relayOutbox(t testing.TB, app string) *outbox.Outbox {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
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
	return ob
}

// markLoss breaks a relay between publish and mark, the window the outbox
// must survive: the first time (over every markLoss sharing fired) a
// publish through its Publisher acknowledged the row id (any row when id is
// uuid.Nil), it terminates the backend of the relay's claim transaction
// (the connection of application_name app that is idle in transaction while
// the relay publishes), as a Postgres restart or a crash there would, and
// then returns the publish result: the relay's mark fails, the claim rolls
// back, and the published rows are published again later with the same
// message IDs. fired is 0 before, 1 while, and 2 after the break; acked
// counts the rows acknowledged by the broken call; onFire, if set, runs
// after the backend is gone (e.g. to stop the relay, as if its process died
// there). It finds the backend in pg_stat_activity, not through a relay
// hook, so it works on the public API alone.
type markLoss struct {
	o      *obEnv
	app    string
	id     uuid.UUID
	fired  *atomic.Int32
	acked  atomic.Int64
	err    atomic.Pointer[error]
	onFire func()
}

// wrap returns pub with the break added, keeping its ChainPublisher side.
func (m *markLoss) wrap(pub outbox.Publisher) outbox.Publisher {
	plain := outbox.PublisherFunc(func(ctx context.Context, batch []outbox.Envelope) error {
		err := pub.Publish(ctx, batch)
		var pe outbox.PublishErrors
		var acked []outbox.Envelope
		for i, e := range batch {
			if err == nil || (errors.As(err, &pe) && len(pe) == len(batch) && pe[i] == nil) {
				acked = append(acked, e)
			}
		}
		m.after(ctx, acked)
		return err
	})
	if cp, ok := pub.(outbox.ChainPublisher); ok {
		return markLossChains{PublisherFunc: plain, m: m, inner: cp}
	}
	return plain
}

type markLossChains struct {
	outbox.PublisherFunc
	m     *markLoss
	inner outbox.ChainPublisher
}

// PublishChains implements outbox.ChainPublisher.
func (c markLossChains) PublishChains(ctx context.Context, chains [][]outbox.Envelope) []outbox.ChainResult {
	res := c.inner.PublishChains(ctx, chains)
	var acked []outbox.Envelope
	for i, r := range res {
		acked = append(acked, chains[i][:min(max(r.Acked, 0), len(chains[i]))]...)
	}
	c.m.after(ctx, acked)
	return res
}

func (m *markLoss) after(ctx context.Context, acked []outbox.Envelope) {
	hit := len(acked) > 0 && m.id == uuid.Nil
	for _, e := range acked {
		hit = hit || e.ID == m.id
	}
	if !hit || !m.fired.CompareAndSwap(0, 1) {
		return
	}
	m.acked.Store(int64(len(acked)))
	var n int
	err := m.o.pool.QueryRow(context.WithoutCancel(ctx), `select count(pg_terminate_backend(pid)) from pg_stat_activity
where application_name = $1 and state = 'idle in transaction'`, m.app).Scan(&n)
	if err == nil && n != 1 {
		err = fmt.Errorf("terminated %d backends of %s idle in transaction, want its one claim transaction", n, m.app)
	}
	if err != nil {
		m.err.Store(&err)
	}
	if m.onFire != nil {
		m.onFire()
	}
	m.fired.Store(2)
}

// check fails the test if the break could not find the claim transaction.
func (m *markLoss) check(t testing.TB) {
	t.Helper()
	if p := m.err.Load(); p != nil {
		t.Fatalf("breaking the mark of %s: %v", m.app, *p)
	}
}

// settle waits until the downstream group has committed every message on
// topic (group lag 0): every copy the relays published has been handled,
// duplicates included, so counts of calls and duplicates are final. It
// reads the broker's committed offsets, not a clock.
func (d *downstream) settle(t testing.TB, topic string) {
	t.Helper()
	eventually(t, 120*time.Second, "the downstream group caught up with "+topic, func() bool {
		lag, err := kafkaadapter.GroupLag(context.Background(), kafkaBrokers(t), d.group, topic)
		return err == nil && lag == 0
	})
}
