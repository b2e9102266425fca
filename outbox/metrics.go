package outbox

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	rowsDesc = prometheus.NewDesc("idemq_outbox_rows",
		"Outbox rows by state (pending, parked, published and not yet purged).", []string{"state"}, nil)
	failingDesc = prometheus.NewDesc("idemq_outbox_failing_rows",
		"Pending outbox rows whose last publish attempt failed (failing now, waiting for a retry).", nil, nil)
	lagDesc = prometheus.NewDesc("idemq_outbox_lag_seconds",
		"Age of the oldest pending outbox row in database time: the relay lag (0 when nothing is pending).", nil, nil)
	scrapeErrDesc = prometheus.NewDesc("idemq_outbox_scrape_error",
		"1 when the last outbox scrape failed to query Postgres.", nil, nil)
)

// Collector returns a prometheus.Collector exporting the outbox lag on each
// scrape: idemq_outbox_rows{state="pending|parked|published"},
// idemq_outbox_failing_rows (Stats.Failing) and idemq_outbox_lag_seconds,
// from Stats (one query over the table, bounded by
// timeout; default 5s when timeout is 0). A failed query exports
// idemq_outbox_scrape_error 1 instead of failing the scrape.
func (o *Outbox) Collector(timeout time.Duration) prometheus.Collector {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	return &collector{o: o, timeout: timeout}
}

type collector struct {
	o       *Outbox
	timeout time.Duration
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- rowsDesc
	ch <- failingDesc
	ch <- lagDesc
	ch <- scrapeErrDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	st, err := c.o.Stats(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.GaugeValue, 1)
		return
	}
	ch <- prometheus.MustNewConstMetric(scrapeErrDesc, prometheus.GaugeValue, 0)
	ch <- prometheus.MustNewConstMetric(rowsDesc, prometheus.GaugeValue, float64(st.Pending), "pending")
	ch <- prometheus.MustNewConstMetric(rowsDesc, prometheus.GaugeValue, float64(st.Parked), "parked")
	ch <- prometheus.MustNewConstMetric(rowsDesc, prometheus.GaugeValue, float64(st.Published), "published")
	ch <- prometheus.MustNewConstMetric(failingDesc, prometheus.GaugeValue, float64(st.Failing))
	ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, st.OldestPending.Seconds())
}
