package integration

import (
	"strings"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/promx"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Two stores, two outboxes and two relays register in one registry when
// each has its own const labels (no "duplicate metrics collector
// registration attempted"), and the same labels twice still fail; the
// relay's counters report what it did against real Postgres and Kafka.
func TestCollectorsRegisterTwiceWithConstLabels(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	a, b := setupOutbox(t), setupOutbox(t)
	topic := newTopic(t, 1)
	relays := map[string]*outbox.Relay{}
	for name, o := range map[string]*obEnv{"a": a, "b": b} {
		l := promx.ConstLabels(prometheus.Labels{"outbox": name})
		cfg := fastRelay("relay-" + name)
		cfg.DisableListen, cfg.DisablePurge = true, true
		r, err := outbox.NewRelay(o.ob, obKafkaPub(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		relays[name] = r
		for _, c := range []prometheus.Collector{consumer.StoreCollector(o.store, l), o.ob.Collector(0, l), r.Collector(l)} {
			if err := reg.Register(c); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		if _, err := consumer.NewPrometheusMetrics(reg, l); err != nil {
			t.Fatalf("%s: metrics: %v", name, err)
		}
	}
	if err := reg.Register(a.ob.Collector(0, promx.ConstLabels(prometheus.Labels{"outbox": "a"}))); err == nil {
		t.Fatal("the same const labels twice registered")
	}

	if err := pgx.BeginFunc(a.ctx, a.pool, func(tx pgx.Tx) error {
		for _, k := range []string{"k1", "k2", "k3"} {
			if _, err := a.ob.Add(a.ctx, tx, outbox.Message{Topic: topic, Key: []byte(k), Payload: []byte("x")}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if res, err := relays["a"].RunOnce(a.ctx); err != nil || res.Published != 3 {
		t.Fatalf("RunOnce: %+v %v", res, err)
	}
	want := `
# HELP idemq_relay_published_total Outbox rows published and marked by this relay.
# TYPE idemq_relay_published_total counter
idemq_relay_published_total{outbox="a",relay="relay-a"} 3
idemq_relay_published_total{outbox="b",relay="relay-b"} 0
# HELP idemq_relay_breaker_open 1 while the relay pauses publishing because the broker is unavailable.
# TYPE idemq_relay_breaker_open gauge
idemq_relay_breaker_open{outbox="a",relay="relay-a"} 0
idemq_relay_breaker_open{outbox="b",relay="relay-b"} 0
# HELP idemq_outbox_rows Outbox rows by state (pending, parked, published and not yet purged).
# TYPE idemq_outbox_rows gauge
idemq_outbox_rows{outbox="a",state="parked"} 0
idemq_outbox_rows{outbox="a",state="pending"} 0
idemq_outbox_rows{outbox="a",state="published"} 3
idemq_outbox_rows{outbox="b",state="parked"} 0
idemq_outbox_rows{outbox="b",state="pending"} 0
idemq_outbox_rows{outbox="b",state="published"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idemq_relay_published_total", "idemq_relay_breaker_open", "idemq_outbox_rows"); err != nil {
		t.Fatal(err)
	}
}
