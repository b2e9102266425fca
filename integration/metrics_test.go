package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The Prometheus collectors read real state: fast-path counters of a store
// on Redis, and the outbox lag from Postgres.
func TestPrometheusCollectors(t *testing.T) {
	t.Parallel()
	e, _ := setupFast(t, redisClient(t))
	s := &spy{table: e.paymentsTable()}
	for range 3 {
		if _, err := e.store.Process(e.ctx, msg(t, "payments", "m-prom", "", "x"), s.handle); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP idemq_fastpath_total Dedup fast-path lookups by result (hit, miss, error).
# TYPE idemq_fastpath_total counter
idemq_fastpath_total{result="error"} 0
idemq_fastpath_total{result="hit"} 2
idemq_fastpath_total{result="miss"} 1
`
	if err := testutil.CollectAndCompare(consumer.StoreCollector(e.store), strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}

	o := setupOutbox(t)
	o.addRows(t, "lag-topic", 5, 2, "lag")
	eventually(t, 30*time.Second, "the oldest pending row to be 1s old in database time", func() bool {
		st, err := o.ob.Stats(e.ctx)
		return err == nil && st.OldestPending >= time.Second
	})
	c := o.ob.Collector(0)
	if n := testutil.CollectAndCount(c, "idemq_outbox_rows"); n != 3 {
		t.Fatalf("idemq_outbox_rows series = %d, want 3", n)
	}
	wantRows := `
# HELP idemq_outbox_rows Outbox rows by state (pending, parked, published and not yet purged).
# TYPE idemq_outbox_rows gauge
idemq_outbox_rows{state="parked"} 0
idemq_outbox_rows{state="pending"} 5
idemq_outbox_rows{state="published"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(wantRows), "idemq_outbox_rows"); err != nil {
		t.Fatal(err)
	}
	st, err := o.ob.Stats(e.ctx)
	if err != nil || st.OldestPending < time.Second {
		t.Fatalf("outbox lag = %v (%v), want at least 1s", st.OldestPending, err)
	}
}
