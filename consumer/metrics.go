package consumer

import (
	"sync"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/promx"
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

// DurationObserver is an optional interface of a Metrics: when implemented,
// the consumer also reports how long each delivery took to reach its outcome
// (claim, handler, mark, commit), in seconds of wall time.
type DurationObserver interface {
	ObserveDuration(scope string, outcome dedup.Outcome, d time.Duration)
}

// ReasonObserver is an optional interface of a Metrics: when implemented,
// the consumer also reports the dead-letter reason (dedup.Result.Reason:
// message_id_collision, payload_conflict, attempts_exhausted,
// permanent_error, bad_input) of every delivery whose outcome is
// dedup.OutcomeConflict or dedup.OutcomeDeadLetter, right after Delivery.
// A redelivered copy that finds its identical dead letter counts again.
type ReasonObserver interface {
	ObserveReason(scope string, outcome dedup.Outcome, reason string)
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

// ObserveReason implements ReasonObserver: it counts under
// "<outcome>:<reason>", e.g. "conflict:message_id_collision".
func (c *Counters) ObserveReason(_ string, outcome dedup.Outcome, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int64{}
	}
	c.m[string(outcome)+":"+reason]++
}

// Get returns one counter, e.g. Get("duplicate"),
// Get("duplicate:business_key") or Get("conflict:payload_conflict").
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

// PrometheusMetrics exports:
//
//   - idemq_deliveries_total{scope, outcome, matched_by}: outcome is one of
//     processed, duplicate, conflict, retry, dead_letter, fenced; matched_by
//     is message_id, business_key or "";
//   - idemq_delivery_duration_seconds{scope, outcome}: time from the start of
//     the claim to the durable outcome (handler included), a histogram with
//     buckets from 1ms to 10s;
//   - idemq_dead_lettered_total{scope, outcome, reason}: deliveries that
//     ended as conflict or dead_letter, by dead-letter reason
//     (message_id_collision, payload_conflict, attempts_exhausted,
//     permanent_error, bad_input); see ReasonObserver.
type PrometheusMetrics struct {
	deliveries *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	reasons    *prometheus.CounterVec
}

// NewPrometheusMetrics registers the metrics with reg
// (prometheus.DefaultRegisterer when nil) and returns the Metrics. It returns
// the registration error, e.g. when registered twice with the same const
// labels; opts add const labels (promx.ConstLabels), so that several
// consumers' metrics can share a registry.
func NewPrometheusMetrics(reg prometheus.Registerer, opts ...promx.Option) (*PrometheusMetrics, error) {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	if cl := promx.Apply(opts).ConstLabels; len(cl) > 0 {
		reg = prometheus.WrapRegistererWith(cl, reg)
	}
	m := &PrometheusMetrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemq_deliveries_total",
			Help: "Deliveries handled by idemq, by final outcome (processed, duplicate, conflict, retry, dead_letter, fenced).",
		}, []string{"scope", "outcome", "matched_by"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemq_delivery_duration_seconds",
			Help:    "Time from claim to durable outcome per delivery, handler included.",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 10, 12),
		}, []string{"scope", "outcome"}),
		reasons: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemq_dead_lettered_total",
			Help: "Deliveries that ended as conflict or dead_letter, by dead-letter reason (message_id_collision, payload_conflict, attempts_exhausted, permanent_error, bad_input).",
		}, []string{"scope", "outcome", "reason"}),
	}
	for _, c := range []prometheus.Collector{m.deliveries, m.duration, m.reasons} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Delivery implements Metrics.
func (m *PrometheusMetrics) Delivery(scope string, outcome dedup.Outcome, by dedup.MatchedBy) {
	m.deliveries.WithLabelValues(scope, string(outcome), string(by)).Inc()
}

// ObserveReason implements ReasonObserver.
func (m *PrometheusMetrics) ObserveReason(scope string, outcome dedup.Outcome, reason string) {
	m.reasons.WithLabelValues(scope, string(outcome), reason).Inc()
}

// ObserveDuration implements DurationObserver.
func (m *PrometheusMetrics) ObserveDuration(scope string, outcome dedup.Outcome, d time.Duration) {
	m.duration.WithLabelValues(scope, string(outcome)).Observe(d.Seconds())
}

// FastPathStatser is a store that counts its dedup fast-path lookups since it
// was made; *pgstore.Store implements it.
type FastPathStatser interface {
	// FastPathStats reports hits (duplicates answered without Postgres),
	// misses (fell through) and errors (fell through after a fast-path
	// error or skip).
	FastPathStats() (hits, misses, errors int64)
}

// StoreCollector exports a store's fast-path counters (a *pgstore.Store) as
// idemq_fastpath_total{result="hit|miss|error"} (hits answered duplicates
// without Postgres; errors fell through to Postgres, e.g. Redis down,
// including calls skipped by the fast path's open circuit breaker).
// Register it with prometheus.Register(consumer.StoreCollector(store)); the
// breaker's own metrics come from redisfast.FastPath.Collector.
// opts add const labels (promx.ConstLabels), so that several stores'
// collectors can share a registry.
func StoreCollector(st FastPathStatser, opts ...promx.Option) prometheus.Collector {
	return storeCollector{st: st, fastPathDesc: promx.Apply(opts).NewDesc("idemq_fastpath_total",
		"Dedup fast-path lookups by result (hit, miss, error).", []string{"result"})}
}

type storeCollector struct {
	st           FastPathStatser
	fastPathDesc *prometheus.Desc
}

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.fastPathDesc }

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	hits, misses, errs := c.st.FastPathStats()
	ch <- prometheus.MustNewConstMetric(c.fastPathDesc, prometheus.CounterValue, float64(hits), "hit")
	ch <- prometheus.MustNewConstMetric(c.fastPathDesc, prometheus.CounterValue, float64(misses), "miss")
	ch <- prometheus.MustNewConstMetric(c.fastPathDesc, prometheus.CounterValue, float64(errs), "error")
}
