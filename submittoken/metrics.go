package submittoken

import "github.com/prometheus/client_golang/prometheus"

// Stats are a Store's counters since New.
type Stats struct {
	// Issued counts tokens Issue stored.
	Issued int64
	// Consumed counts Consume and ConsumeFor calls that consumed a token
	// (nil; ConsumeFor's repeats for the same owner included).
	Consumed int64
	// Reused counts Consume and ConsumeFor calls that found the token used: second submits
	// (ErrTokenUsed).
	Reused int64
	// Unknown counts Consume and ConsumeFor calls that found no such token
	// (ErrTokenUnknown: never issued, expired, or malformed).
	Unknown int64
	// Errors counts Consume and ConsumeFor calls that failed on Redis
	// (outcome unknown).
	Errors int64
	// Released counts tokens Release gave back (an attempt that rolled
	// back).
	Released int64
}

// Stats returns the Store's counters.
func (s *Store) Stats() Stats {
	return Stats{
		Issued:   s.stats.issued.Load(),
		Consumed: s.stats.consumed.Load(),
		Reused:   s.stats.reused.Load(),
		Unknown:  s.stats.unknown.Load(),
		Errors:   s.stats.errors.Load(),
		Released: s.stats.released.Load(),
	}
}

var (
	issuedDesc = prometheus.NewDesc("idemq_submit_tokens_issued_total",
		"One-time submit tokens issued (submittoken.Store.Issue).", nil, nil)
	consumesDesc = prometheus.NewDesc("idemq_submit_token_consumes_total",
		"submittoken.Store.Consume calls by result: consumed (first submit), reused (a second submit of a used token), unknown (never issued, expired or malformed), error (Redis failed).",
		[]string{"result"}, nil)
)

// Collector exports the Store's Stats for Prometheus:
//
//   - idemq_submit_tokens_issued_total: counter;
//   - idemq_submit_token_consumes_total{result}: counter, result among
//     consumed, reused, unknown, error. result="reused" is token reuse:
//     second submits.
//
// Each call returns a new collector reading the same counters, so the
// Store can be registered with several registries. One Store per registry
// under these names: to register several Stores with one registry, wrap
// the registerer with a label of your own, e.g.
// prometheus.WrapRegistererWith(prometheus.Labels{"form": "checkout"}, reg).
func (s *Store) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Store }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- issuedDesc
	ch <- consumesDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	ch <- prometheus.MustNewConstMetric(issuedDesc, prometheus.CounterValue, float64(st.Issued))
	for _, r := range []struct {
		name string
		n    int64
	}{{"consumed", st.Consumed}, {"reused", st.Reused}, {"unknown", st.Unknown}, {"error", st.Errors}} {
		ch <- prometheus.MustNewConstMetric(consumesDesc, prometheus.CounterValue, float64(r.n), r.name)
	}
}
