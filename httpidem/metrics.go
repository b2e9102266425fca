package httpidem

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcome is what the middleware did with one request that required an
// Idempotency-Key; its string is the "outcome" label of
// idemq_http_requests_total.
type Outcome string

const (
	// OutcomeExecuted means the handler ran and its final response committed
	// with the record (a new key, or a retry after a retryable failure).
	OutcomeExecuted Outcome = "executed"
	// OutcomeReplayed means the key's record had finished with the same
	// fingerprint; the stored response was replayed, the handler not
	// called.
	OutcomeReplayed Outcome = "replayed"
	// OutcomeConflict means the key was used with another request; answered
	// Config.ConflictStatus.
	OutcomeConflict Outcome = "conflict"
	// OutcomeInFlight means another request with the key was running; answered
	// 409 with Retry-After.
	OutcomeInFlight Outcome = "in_flight"
	// OutcomeTooManyUnfinished means the principal's unfinished keys reached
	// Config.MaxUnfinished; answered 429.
	OutcomeTooManyUnfinished Outcome = "too_many_unfinished"
	// OutcomeFailed means the handler ran and failed retryably (a non-final
	// status, a panic, a refused COMMIT); the record is retryable.
	OutcomeFailed Outcome = "failed"
	// OutcomeExhausted means the key's record is FAILED_FINAL; answered 409.
	OutcomeExhausted Outcome = "exhausted"
	// OutcomeRejected means the request was refused before any record was
	// touched (missing or invalid key, body too large or malformed, an
	// extractor failed, a blank tenant or principal).
	OutcomeRejected Outcome = "rejected"
	// OutcomeUnavailable means the store failed or the outcome is unknown;
	// answered 503.
	OutcomeUnavailable Outcome = "unavailable"
)

// Metrics counts the middleware's outcomes for Prometheus. It is a
// prometheus.Collector exporting
//
//   - idemq_http_requests_total{outcome}: counter per Outcome (every
//     outcome is exported from the start, at 0).
//
// Build one per Middleware with NewMetrics; several may be registered in
// one registry when their const labels differ (e.g. {"api": "payments"}).
// Safe for concurrent use.
type Metrics struct {
	desc   *prometheus.Desc
	counts [len(outcomesArray)]atomic.Uint64
}

// outcomesArray fixes the counter array's length at compile time.
var outcomesArray = [...]Outcome{OutcomeExecuted, OutcomeReplayed, OutcomeConflict, OutcomeInFlight, OutcomeTooManyUnfinished,
	OutcomeFailed, OutcomeExhausted, OutcomeRejected, OutcomeUnavailable}

// NewMetrics returns a Metrics whose series carry constLabels (nil for
// none).
func NewMetrics(constLabels prometheus.Labels) *Metrics {
	return &Metrics{desc: prometheus.NewDesc("idemq_http_requests_total",
		"Requests that required an Idempotency-Key, by what the middleware did: executed, replayed, conflict, in_flight (409), too_many_unfinished (429), failed (retryable), exhausted, rejected (400/401/413), unavailable (503).",
		[]string{"outcome"}, constLabels)}
}

// Count returns how many requests had outcome o so far.
func (m *Metrics) Count(o Outcome) uint64 {
	if i := outcomeIndex(o); i >= 0 {
		return m.counts[i].Load()
	}
	return 0
}

func (m *Metrics) inc(o Outcome) {
	if m == nil {
		return
	}
	if i := outcomeIndex(o); i >= 0 {
		m.counts[i].Add(1)
	}
}

func outcomeIndex(o Outcome) int {
	for i, x := range outcomesArray {
		if x == o {
			return i
		}
	}
	return -1
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.desc }

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for i, o := range outcomesArray {
		ch <- prometheus.MustNewConstMetric(m.desc, prometheus.CounterValue, float64(m.counts[i].Load()), string(o))
	}
}
