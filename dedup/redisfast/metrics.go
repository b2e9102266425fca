package redisfast

import (
	"github.com/idemq/idemq/promx"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the circuit breaker of f (BreakerStats) for Prometheus:
//
//   - idemq_fastpath_breaker_state: gauge, 0 closed, 1 half-open, 2 open
//     (BreakerState);
//   - idemq_fastpath_breaker_transitions_total{from, to}: counter per
//     transition, from and to among closed, half_open, open (closed→open:
//     an outage began; half_open→open: a probe failed; half_open→closed:
//     the outage ended);
//   - idemq_fastpath_breaker_skipped_total: counter of calls skipped while
//     open.
//
// Register it beside consumer.StoreCollector (which counts
// idemq_fastpath_total): prometheus.MustRegister(fast.Collector()). One
// FastPath per registry unless opts give each its own const labels
// (promx.ConstLabels), or the registerer is wrapped
// (prometheus.WrapRegistererWith).
func (f *FastPath) Collector(opts ...promx.Option) prometheus.Collector {
	po := promx.Apply(opts)
	return collector{f: f,
		breakerStateDesc: po.NewDesc("idemq_fastpath_breaker_state",
			"State of the Redis fast path's circuit breaker: 0 closed (Redis used), 1 half-open (probing), 2 open (Redis skipped).", nil),
		breakerTransitionsDesc: po.NewDesc("idemq_fastpath_breaker_transitions_total",
			"State changes of the Redis fast path's circuit breaker; from=closed,to=open is an outage beginning, from=half_open,to=closed its end.",
			[]string{"from", "to"}),
		breakerSkippedDesc: po.NewDesc("idemq_fastpath_breaker_skipped_total",
			"Fast-path calls answered without Redis because the circuit breaker was open (also counted in idemq_fastpath_total{result=\"error\"}).", nil),
	}
}

type collector struct {
	f                                                            *FastPath
	breakerStateDesc, breakerTransitionsDesc, breakerSkippedDesc *prometheus.Desc
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.breakerStateDesc
	ch <- c.breakerTransitionsDesc
	ch <- c.breakerSkippedDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.f.BreakerStats()
	ch <- prometheus.MustNewConstMetric(c.breakerStateDesc, prometheus.GaugeValue, float64(s.State))
	for _, t := range []struct {
		from, to BreakerState
		n        int64
	}{
		{BreakerClosed, BreakerOpen, s.Opened},
		{BreakerOpen, BreakerHalfOpen, s.Probed},
		{BreakerHalfOpen, BreakerOpen, s.ProbesFailed},
		{BreakerHalfOpen, BreakerClosed, s.Closed},
	} {
		ch <- prometheus.MustNewConstMetric(c.breakerTransitionsDesc, prometheus.CounterValue, float64(t.n), t.from.String(), t.to.String())
	}
	ch <- prometheus.MustNewConstMetric(c.breakerSkippedDesc, prometheus.CounterValue, float64(s.Skipped))
}
