package outbox

import (
	"github.com/idemq/idemq/promx"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector returns a prometheus.Collector exporting r's counters (Stats)
// on each scrape, labelled relay=RelayConfig.Name:
//
//   - idemq_relay_published_total: rows published and marked;
//   - idemq_relay_failed_total: failed publishes recorded on rows (row
//     errors; each schedules a retry or parks the row);
//   - idemq_relay_unavailable_total: publishes failed because the broker
//     was unavailable (not attempts);
//   - idemq_relay_parked_total: rows this relay parked;
//   - idemq_relay_purged_total: published rows deleted by retention;
//   - idemq_relay_db_errors_total: batches lost to a database error;
//   - idemq_relay_breaker_open: gauge, 1 while publishing is paused because
//     the broker is unavailable, 0 otherwise;
//   - idemq_relay_outages_total: times the breaker opened.
//
// Counters start at 0 with NewRelay. opts add const labels
// (promx.ConstLabels); relays of different names already differ by their
// relay label.
func (r *Relay) Collector(opts ...promx.Option) prometheus.Collector {
	po := promx.Apply(opts)
	d := func(name, help string) *prometheus.Desc { return po.NewDesc(name, help, []string{"relay"}) }
	return &relayCollector{r: r,
		published:   d("idemq_relay_published_total", "Outbox rows published and marked by this relay."),
		failed:      d("idemq_relay_failed_total", "Failed publishes recorded on rows (row errors: each schedules a retry or parks the row)."),
		unavailable: d("idemq_relay_unavailable_total", "Publishes that failed because the broker was unavailable (not counted as attempts)."),
		parked:      d("idemq_relay_parked_total", "Outbox rows this relay parked."),
		purged:      d("idemq_relay_purged_total", "Published outbox rows deleted by retention."),
		dbErrors:    d("idemq_relay_db_errors_total", "Relay batches lost to a database error (published again later)."),
		breakerOpen: d("idemq_relay_breaker_open", "1 while the relay pauses publishing because the broker is unavailable."),
		outages:     d("idemq_relay_outages_total", "Times the relay's broker breaker opened (publishing paused)."),
	}
}

type relayCollector struct {
	r                                                                              *Relay
	published, failed, unavailable, parked, purged, dbErrors, breakerOpen, outages *prometheus.Desc
}

func (c *relayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.published, c.failed, c.unavailable, c.parked, c.purged, c.dbErrors, c.breakerOpen, c.outages} {
		ch <- d
	}
}

func (c *relayCollector) Collect(ch chan<- prometheus.Metric) {
	s, name := c.r.Stats(), c.r.cfg.Name
	open := 0.0
	if s.BreakerOpen {
		open = 1
	}
	for _, m := range []struct {
		d *prometheus.Desc
		t prometheus.ValueType
		v float64
	}{
		{c.published, prometheus.CounterValue, float64(s.Published)},
		{c.failed, prometheus.CounterValue, float64(s.Failed)},
		{c.unavailable, prometheus.CounterValue, float64(s.Unavailable)},
		{c.parked, prometheus.CounterValue, float64(s.Parked)},
		{c.purged, prometheus.CounterValue, float64(s.Purged)},
		{c.dbErrors, prometheus.CounterValue, float64(s.DBErrors)},
		{c.breakerOpen, prometheus.GaugeValue, open},
		{c.outages, prometheus.CounterValue, float64(s.Outages)},
	} {
		ch <- prometheus.MustNewConstMetric(m.d, m.t, m.v, name)
	}
}
