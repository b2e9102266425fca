package consumer

import (
	"strings"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestReasonObserver(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewPrometheusMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var _ ReasonObserver = m
	m.ObserveReason("payments", dedup.OutcomeConflict, dedup.ReasonMessageIDCollision)
	m.ObserveReason("payments", dedup.OutcomeConflict, dedup.ReasonPayloadConflict)
	m.ObserveReason("payments", dedup.OutcomeConflict, dedup.ReasonPayloadConflict)
	want := `
# HELP idemq_dead_lettered_total Deliveries that ended as conflict or dead_letter, by dead-letter reason (message_id_collision, payload_conflict, attempts_exhausted, permanent_error, bad_input).
# TYPE idemq_dead_lettered_total counter
idemq_dead_lettered_total{outcome="conflict",reason="message_id_collision",scope="payments"} 1
idemq_dead_lettered_total{outcome="conflict",reason="payload_conflict",scope="payments"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idemq_dead_lettered_total"); err != nil {
		t.Fatal(err)
	}
	var c Counters
	var _ ReasonObserver = &c
	c.ObserveReason("payments", dedup.OutcomeConflict, dedup.ReasonMessageIDCollision)
	if c.Get("conflict:message_id_collision") != 1 {
		t.Fatalf("counters = %v", c.Snapshot())
	}
}
