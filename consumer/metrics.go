package consumer

import (
	"sync"

	"github.com/idemq/idemq/dedup"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics receives delivery outcomes. Implementations must be safe for
// concurrent use. Counters and PrometheusMetrics are the two provided.
type Metrics interface {
	// Delivery is called once per delivery with its final outcome (for a
	// pull consumer retrying in place: once per attempt that failed, then
	// once for the final outcome). by is set for duplicates and conflicts.
	// It is called after the outcome is durable in Postgres and before the
	// delivery is acknowledged (offset handed to the committer, RocketMQ
	// result returned), on the delivery's goroutine.
	Delivery(scope string, outcome dedup.Outcome, by dedup.MatchedBy)
}

type nopMetrics struct{}

func (nopMetrics) Delivery(string, dedup.Outcome, dedup.MatchedBy) {}

// Counters is an in-memory Metrics, for tests, demos and simple status pages.
// The zero value is ready to use.
type Counters struct {
	mu sync.Mutex
	m  map[string]int64
}

// Delivery implements Metrics. It counts under the outcome name, and
// duplicates and conflicts also under "<outcome>:<matched by>".
func (c *Counters) Delivery(_ string, outcome dedup.Outcome, by dedup.MatchedBy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int64{}
	}
	c.m[string(outcome)]++
	if by != "" {
		c.m[string(outcome)+":"+string(by)]++
	}
}

// Get returns one counter, e.g. Get("duplicate") or
// Get("duplicate:business_key").
func (c *Counters) Get(name string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[name]
}

// Snapshot returns a copy of all counters.
func (c *Counters) Snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.m))
	for k, v := range c.m {
		out[k] = v
	}
	return out
}

// PrometheusMetrics exports idemq_deliveries_total{scope, outcome,
// matched_by}: outcome is one of processed, duplicate, conflict, retry,
// dead_letter; matched_by is message_id, business_key or "".
type PrometheusMetrics struct {
	deliveries *prometheus.CounterVec
}

// NewPrometheusMetrics registers idemq_deliveries_total with reg
// (prometheus.DefaultRegisterer when nil) and returns the Metrics. It returns
// the registration error, e.g. when registered twice.
func NewPrometheusMetrics(reg prometheus.Registerer) (*PrometheusMetrics, error) {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	m := &PrometheusMetrics{deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemq_deliveries_total",
		Help: "Deliveries handled by idemq, by final outcome (processed, duplicate, conflict, retry, dead_letter).",
	}, []string{"scope", "outcome", "matched_by"})}
	if err := reg.Register(m.deliveries); err != nil {
		return nil, err
	}
	return m, nil
}

// Delivery implements Metrics.
func (m *PrometheusMetrics) Delivery(scope string, outcome dedup.Outcome, by dedup.MatchedBy) {
	m.deliveries.WithLabelValues(scope, string(outcome), string(by)).Inc()
}
