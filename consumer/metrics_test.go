package consumer

import (
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPrometheusMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewPrometheusMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Delivery("payments", dedup.OutcomeDuplicate, dedup.ByBusinessKey)
	m.Delivery("payments", dedup.OutcomeDuplicate, dedup.ByBusinessKey)
	m.Delivery("payments", dedup.OutcomeFenced, "")
	m.ObserveDuration("payments", dedup.OutcomeProcessed, 3*time.Millisecond)
	want := `
# HELP idemq_deliveries_total Deliveries handled by idemq, by final outcome (processed, duplicate, conflict, retry, dead_letter, fenced).
# TYPE idemq_deliveries_total counter
idemq_deliveries_total{matched_by="",outcome="fenced",scope="payments"} 1
idemq_deliveries_total{matched_by="business_key",outcome="duplicate",scope="payments"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idemq_deliveries_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.duration); n != 1 {
		t.Fatalf("duration series = %d, want 1", n)
	}
	if _, err := NewPrometheusMetrics(reg); err == nil {
		t.Fatal("registering twice must fail")
	}
	var _ DurationObserver = m
}
