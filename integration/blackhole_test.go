package integration

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// blackHole is a toxiproxy proxy (run in the test's process) between a pool
// and the test Postgres, whose hole makes the connection half-open: bytes
// are accepted and dropped both ways, no RST, no FIN, as when a server
// freezes or a network path dies without telling anyone.
type blackHole struct {
	proxy *toxiproxy.Proxy
	pool  *pgxpool.Pool // through the proxy
}

func newBlackHole(t testing.TB) *blackHole {
	t.Helper()
	u, err := url.Parse(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	proxy := toxiproxy.NewProxy(srv, "postgres", "127.0.0.1:0", u.Host)
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Stop)
	via := *u
	via.Host = proxy.Listen
	cfg, err := pgxpool.ParseConfig(via.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &blackHole{proxy: proxy, pool: pool}
}

// open makes the hole: what the pool's connections send from now on is
// dropped, and nothing comes back.
func (b *blackHole) open(t testing.TB) {
	t.Helper()
	for _, j := range []string{
		`{"name":"hole_down","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`,
		`{"name":"hole_up","type":"timeout","stream":"upstream","attributes":{"timeout":0}}`,
	} {
		if _, err := b.proxy.Toxics.AddToxicJson(strings.NewReader(j)); err != nil {
			t.Fatal(err)
		}
	}
}

// close ends the hole; the connections that sent into it stay dead.
func (b *blackHole) close() { b.proxy.Toxics.ResetToxics(context.Background()) }

// returns runs step (which gets no deadline of its own) while the hole is
// open and fails t unless it returns an error: idemq must detect the dead
// connection itself. The guard only ends a hang (it stops the proxy, which
// closes every connection) so that the failure is reported.
func (b *blackHole) returns(t testing.TB, what string, step func() error) error {
	t.Helper()
	b.open(t)
	done := make(chan error, 1)
	go func() { done <- step() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		b.proxy.Stop()
		err = <-done
		t.Fatalf("%s still waited on the black-holed connection 2 minutes later: nothing bounds it (after the proxy stopped: %v)", what, err)
	}
	b.close()
	if err == nil {
		t.Fatalf("%s through the black hole returned nil, want an error", what)
	}
	return err
}

// A Postgres connection that stops answering is detected within
// pgstore.Config.StatementTimeout (and outbox.RelayConfig.StatementTimeout),
// as docs/configuration.md states, on a caller's context without a deadline
// (the consumer's and the relay's): the claim of atomic, batched and lease
// mode and of the relay fails instead of waiting for ever, nothing is
// marked, and the same message run again once the network is back takes
// effect once (issue 21, the partition drill's black hole).
func TestBlackHoledPostgresIsDetected(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	bh := newBlackHole(t)
	cfg := e.store.Config()
	cfg.StatementTimeout = time.Second
	st, err := pgstore.New(bh.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background() // no deadline: only StatementTimeout can end a step
	var calls atomic.Int64
	h := func(context.Context, pgx.Tx, *dedup.Message) error { calls.Add(1); return nil }
	lh := func(context.Context, *dedup.Message) error { calls.Add(1); return nil }
	warm := func() { // every connection of the pool open before the hole
		t.Helper()
		if err := bh.pool.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	modes := []struct {
		name string
		run  func(m *dedup.Message) (dedup.Result, error)
	}{
		{"atomic", func(m *dedup.Message) (dedup.Result, error) { return st.Process(ctx, m, h) }},
		{"batched", func(m *dedup.Message) (dedup.Result, error) {
			res, err := st.ProcessBatch(ctx, []*dedup.Message{m}, h)
			if len(res) == 1 {
				return res[0], err
			}
			return dedup.Result{}, err
		}},
		{"lease", func(m *dedup.Message) (dedup.Result, error) {
			return st.ProcessLeased(ctx, m, lh, dedup.LeaseOptions{})
		}},
	}
	for _, mode := range modes {
		calls.Store(0)
		warm()
		m := msg(t, "blackhole-"+mode.name, "m-1", "", `{"amount":1}`)
		err := bh.returns(t, mode.name+" Process", func() error { _, err := mode.run(m); return err })
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, dedup.ErrOutcomeUnknown) {
			t.Errorf("%s: error through the black hole = %v, want one wrapping context.DeadlineExceeded or ErrOutcomeUnknown", mode.name, err)
		}
		if n := calls.Load(); n != 0 {
			t.Errorf("%s: handler ran %d times although its claim was lost in the hole", mode.name, n)
		}
		res, err := mode.run(m)
		if err != nil || res.Outcome != dedup.OutcomeProcessed {
			t.Fatalf("%s: after the hole: %+v, %v; want processed", mode.name, res, err)
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("%s: handler calls = %d, want 1", mode.name, n)
		}
		if r := e.record(m.Identity.Scope, "m-1"); r.Status != dedup.StatusSucceeded || r.Attempts != 1 {
			t.Errorf("%s: record %s after %d attempts, want SUCCEEDED after 1 (the lost claim counted nothing)", mode.name, r.Status, r.Attempts)
		}
	}

	// The relay's claim.
	ob := e.outboxWith(outbox.Message{Topic: "t", Key: []byte("k"), Payload: []byte("x")})
	viaHole, err := outbox.New(bh.pool, ob.Config())
	if err != nil {
		t.Fatal(err)
	}
	var published atomic.Int64
	pub := outbox.PublisherFunc(func(_ context.Context, batch []outbox.Envelope) error {
		published.Add(int64(len(batch)))
		return nil
	})
	r, err := outbox.NewRelay(viaHole, pub, outbox.RelayConfig{Name: "blackhole", StatementTimeout: time.Second, DisablePurge: true, DisableListen: true})
	if err != nil {
		t.Fatal(err)
	}
	warm()
	if err := bh.returns(t, "relay RunOnce", func() error { _, err := r.RunOnce(ctx); return err }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("relay RunOnce through the black hole: %v, want an error wrapping context.DeadlineExceeded", err)
	}
	if n := published.Load(); n != 0 {
		t.Errorf("relay published %d rows although its claim was lost in the hole", n)
	}
	if res, err := r.RunOnce(ctx); err != nil || res.Published != 1 {
		t.Fatalf("relay after the hole: %+v, %v; want 1 published", res, err)
	}
	if n := e.count(`select count(*) from ` + e.table("outbox") + ` where published_at is not null`); n != 1 || published.Load() != 1 {
		t.Errorf("outbox rows marked published = %d, publishes = %d; want 1 and 1", n, published.Load())
	}
}
