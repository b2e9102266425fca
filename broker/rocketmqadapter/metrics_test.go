package rocketmqadapter

import (
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestQueueSeenClassifiesDeliveries(t *testing.T) {
	s := queueSeen{m: map[string]*seenOffsets{}}
	steps := []struct {
		what      string
		queue     string
		offset    int64
		reconsume int32
		outcome   dedup.Outcome
		want      queueCount
	}{
		{"first delivery", "q0", 5, 0, dedup.OutcomeProcessed, queueCount{}},
		{"an attempt retried in place", "q0", 6, 0, dedup.OutcomeRetry, queueCount{}},
		{"its next attempt is no redelivery", "q0", 6, 0, dedup.OutcomeProcessed, queueCount{}},
		{"offset read again after a rebalance", "q0", 5, 0, dedup.OutcomeDuplicate, queueCount{redelivery: true, duplicate: true}},
		{"same offset on another queue", "q1", 5, 0, dedup.OutcomeProcessed, queueCount{}},
		{"another process's work read behind", "q1", 3, 0, dedup.OutcomeDuplicate, queueCount{duplicate: true}},
		{"a copy sent back", "retry", 0, 1, dedup.OutcomeProcessed, queueCount{redelivery: true}},
		{"a fenced outcome marks nothing", "q2", 1, 0, dedup.OutcomeFenced, queueCount{}},
		{"so its next copy is no redelivery", "q2", 1, 0, dedup.OutcomeProcessed, queueCount{}},
	}
	for _, st := range steps {
		if got := s.observe(st.queue, st.offset, st.reconsume, st.outcome); got != st.want {
			t.Errorf("%s: got %+v, want %+v", st.what, got, st.want)
		}
	}
}

func TestQueueSeenForgetsBelowWindow(t *testing.T) {
	s := queueSeen{m: map[string]*seenOffsets{}}
	for o := range int64(3*seenWindow + 1) {
		s.observe("q", o, 0, dedup.OutcomeProcessed)
	}
	if n := len(s.m["q"].offs); n > 2*seenWindow+1 {
		t.Fatalf("remembers %d offsets, want at most %d", n, 2*seenWindow+1)
	}
	if c := s.observe("q", 3*seenWindow, 0, dedup.OutcomeDuplicate); !c.redelivery {
		t.Fatal("a recent offset read again is not a redelivery")
	}
	if c := s.observe("q", 0, 0, dedup.OutcomeDuplicate); c.redelivery || !c.duplicate {
		t.Fatalf("an offset beyond the window: %+v, want a duplicate only", c)
	}
}

func TestQueueOf(t *testing.T) {
	for _, tc := range []struct {
		msg          dedup.Message
		topic, queue string
		offset       int64
	}{
		{dedup.Message{Source: Position("orders", "broker-a", 3, 41)}, "orders", "broker-a/3", 41},
		{dedup.Message{Topic: "orders", Source: Position("%RETRY%g", "broker-b", 0, 7)}, "%RETRY%g", "broker-b/0", 7},
		{dedup.Message{Topic: "t", Partition: 2, Offset: 9, Source: "elsewhere"}, "t", "/2", 9},
	} {
		topic, queue, off := queueOf(&tc.msg)
		if topic != tc.topic || queue != tc.queue || off != tc.offset {
			t.Errorf("queueOf(%q) = %q %q %d, want %q %q %d", tc.msg.Source, topic, queue, off, tc.topic, tc.queue, tc.offset)
		}
	}
}

func TestQueueMetricsCountsPerQueue(t *testing.T) {
	reg := prometheus.NewRegistry()
	var next consumer.Counters
	m, err := NewQueueMetrics(reg, &next)
	if err != nil {
		t.Fatal(err)
	}
	var _ consumer.MessageObserver = m
	deliver := func(queue int, offset int64, outcome dedup.Outcome) {
		m.Delivery("s", outcome, "")
		m.ObserveMessage("s", &dedup.Message{Source: Position("orders", "broker-a", queue, offset)}, dedup.Result{Outcome: outcome})
	}
	deliver(0, 1, dedup.OutcomeProcessed)
	deliver(0, 2, dedup.OutcomeProcessed)
	deliver(0, 1, dedup.OutcomeDuplicate) // read again
	deliver(1, 1, dedup.OutcomeProcessed)
	if got := testutil.ToFloat64(m.deliveries.WithLabelValues("s", "orders", "broker-a/0")); got != 3 {
		t.Errorf("deliveries on queue 0 = %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.redeliveries.WithLabelValues("s", "orders", "broker-a/0")); got != 1 {
		t.Errorf("redeliveries on queue 0 = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.duplicates.WithLabelValues("s", "orders", "broker-a/0")); got != 1 {
		t.Errorf("duplicates on queue 0 = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.redeliveries.WithLabelValues("s", "orders", "broker-a/1")); got != 0 {
		t.Errorf("redeliveries on queue 1 = %v, want 0", got)
	}
	if next.Get("processed") != 3 || next.Get("duplicate") != 1 {
		t.Errorf("Next got %v, want 3 processed and 1 duplicate", next.Snapshot())
	}
	if _, err := NewQueueMetrics(reg, nil); err == nil {
		t.Error("registering twice succeeded")
	}
}
