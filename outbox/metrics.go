package outbox

import (
	"context"
	"time"

	"github.com/idemq/idemq/promx"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector returns a prometheus.Collector exporting the outbox lag on each
// scrape: idemq_outbox_rows{state="pending|parked|published"},
// idemq_outbox_failing_rows (Stats.Failing) and idemq_outbox_lag_seconds,
// from Stats (one query over the table, bounded by
// timeout; default 5s when timeout is 0). A failed query exports
// idemq_outbox_scrape_error 1 instead of failing the scrape. opts add
// const labels (promx.ConstLabels), so that several outboxes' collectors
// can share a registry.
func (o *Outbox) Collector(timeout time.Duration, opts ...promx.Option) prometheus.Collector {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	po := promx.Apply(opts)
	return &collector{o: o, timeout: timeout,
		rowsDesc: po.NewDesc("idemq_outbox_rows",
			"Outbox rows by state (pending, parked, published and not yet purged).", []string{"state"}),
		failingDesc: po.NewDesc("idemq_outbox_failing_rows",
			"Pending outbox rows whose last publish attempt failed (failing now, waiting for a retry).", nil),
		lagDesc: po.NewDesc("idemq_outbox_lag_seconds",
			"Age of the oldest pending outbox row in database time: the relay lag (0 when nothing is pending).", nil),
		scrapeErrDesc: po.NewDesc("idemq_outbox_scrape_error",
			"1 when the last outbox scrape failed to query Postgres.", nil),
	}
}

type collector struct {
	o                                             *Outbox
	timeout                                       time.Duration
	rowsDesc, failingDesc, lagDesc, scrapeErrDesc *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rowsDesc
	ch <- c.failingDesc
	ch <- c.lagDesc
	ch <- c.scrapeErrDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	st, err := c.o.Stats(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.scrapeErrDesc, prometheus.GaugeValue, 1)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.scrapeErrDesc, prometheus.GaugeValue, 0)
	ch <- prometheus.MustNewConstMetric(c.rowsDesc, prometheus.GaugeValue, float64(st.Pending), "pending")
	ch <- prometheus.MustNewConstMetric(c.rowsDesc, prometheus.GaugeValue, float64(st.Parked), "parked")
	ch <- prometheus.MustNewConstMetric(c.rowsDesc, prometheus.GaugeValue, float64(st.Published), "published")
	ch <- prometheus.MustNewConstMetric(c.failingDesc, prometheus.GaugeValue, float64(st.Failing))
	ch <- prometheus.MustNewConstMetric(c.lagDesc, prometheus.GaugeValue, st.OldestPending.Seconds())
}
