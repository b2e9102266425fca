package kafkaadapter

import (
	"strconv"

	"github.com/idemq/idemq/promx"
	"github.com/prometheus/client_golang/prometheus"
)

// lagCollector is Source.Collector's collector.
type lagCollector struct {
	s   *Source
	lag *prometheus.Desc
}

// Collector returns a Prometheus collector of the consumer group's lag on
// the partitions this member owns:
//
//   - idemq_consumer_lag_messages{topic, partition, consumer_group}: the
//     partition's high watermark minus the group's committed offset, in
//     messages (never negative): how far the committed position is behind
//     the newest message. A partition appears once this member fetched from
//     it in the generation in hand, and disappears when its generation ends.
//
// The high watermark is the one the newest fetched message carried (Kafka
// returns it with every fetch response, so reading it costs no request), and
// the committed offset the one this member committed or was assigned (0
// while the group has committed nothing on the partition). While
// the runtime's lane buffers are full (a handler is stuck), fetching pauses,
// so the watermark, and with it the lag, can trail messages produced since:
// GroupLag asks the broker when an exact figure is needed. opts add const
// labels (promx.ConstLabels), to register several Sources in one registry.
func (s *Source) Collector(opts ...promx.Option) prometheus.Collector {
	o := promx.Apply(opts)
	return &lagCollector{s: s, lag: o.NewDesc("idemq_consumer_lag_messages",
		"Kafka consumer-group lag per owned partition: high watermark of the newest fetched message minus the committed offset, in messages.",
		[]string{"topic", "partition", "consumer_group"})}
}

// Describe implements prometheus.Collector.
func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.lag }

// Collect implements prometheus.Collector.
func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.s.lags() {
		ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(l.lag), l.topic, strconv.Itoa(l.partition), c.s.cgc.ID)
	}
}

// partitionLag is one owned partition's lag.
type partitionLag struct {
	topic     string
	partition int
	lag       int64
}

// lags returns the lag of every partition owned in the generation in hand
// that has a known high watermark.
func (s *Source) lags() []partitionLag {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []partitionLag
	for tp, c := range s.owned {
		if c.gen.id != s.genID || c.hwm == 0 {
			continue
		}
		committed := max(c.next, 0)
		out = append(out, partitionLag{topic: tp.topic, partition: tp.partition, lag: max(c.hwm-committed, 0)})
	}
	return out
}
