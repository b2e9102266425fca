// Package promx holds the options of idemq's Prometheus collectors
// (consumer.StoreCollector, consumer.NewPrometheusMetrics,
// redisfast.FastPath.Collector, outbox.Outbox.Collector,
// outbox.Relay.Collector).
//
// Every idemq collector exports fixed metric names. Registering two of one
// kind in one registry (two stores, two outboxes, two relays) fails with
// "duplicate metrics collector registration attempted" unless they differ
// in their const labels: give each ConstLabels, e.g.
// ConstLabels(prometheus.Labels{"store": "payments"}). Wrapping the
// registerer (prometheus.WrapRegistererWith) does the same from outside.
package promx

import "github.com/prometheus/client_golang/prometheus"

// Option configures an idemq collector.
type Option func(*Options)

// Options are the applied options; the zero value is the default.
type Options struct {
	// ConstLabels are added to every metric of the collector. Default none.
	// Label names must be valid Prometheus label names and must not clash
	// with the collector's variable labels; Describe/registration fails
	// otherwise (prometheus.NewDesc's error).
	ConstLabels prometheus.Labels
}

// ConstLabels adds labels (name to value) to every metric the collector
// exports, so that several collectors of one kind can share a registry.
// Several ConstLabels options merge; a later value wins for a repeated
// name.
func ConstLabels(labels prometheus.Labels) Option {
	return func(o *Options) {
		if o.ConstLabels == nil {
			o.ConstLabels = prometheus.Labels{}
		}
		for k, v := range labels {
			o.ConstLabels[k] = v
		}
	}
}

// Apply returns the Options that opts make.
func Apply(opts []Option) Options {
	var o Options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

// NewDesc is prometheus.NewDesc with the Options' const labels.
func (o Options) NewDesc(name, help string, variableLabels []string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, variableLabels, o.ConstLabels)
}
