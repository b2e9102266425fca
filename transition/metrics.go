package transition

import (
	"sort"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

type counts struct {
	applied, alreadyApplied, illegal, stale, notFound atomic.Int64
}

// Counts are a Machine's Apply outcomes for one target status since New.
type Counts struct {
	// Applied counts calls that changed the row.
	Applied int64
	// AlreadyApplied counts calls that found the row in the target status
	// already (retries), or in a status that has passed it (late
	// requests, Machine.Passed).
	AlreadyApplied int64
	// Illegal counts ErrIllegalTransition.
	Illegal int64
	// StaleVersion counts ErrStaleVersion.
	StaleVersion int64
	// NotFound counts ErrNotFound.
	NotFound int64
}

// Stats returns the outcome counts per target status, for every status a
// rule leads to.
func (m *Machine) Stats() map[string]Counts {
	out := make(map[string]Counts, len(m.counts))
	for to, c := range m.counts {
		out[to] = Counts{
			Applied: c.applied.Load(), AlreadyApplied: c.alreadyApplied.Load(),
			Illegal: c.illegal.Load(), StaleVersion: c.stale.Load(), NotFound: c.notFound.Load(),
		}
	}
	return out
}

// Collector exports the Machine's Stats for Prometheus as
// idemq_transitions_total{entity, to, result}: a counter, entity
// Config.Entity (a constant label), to each status a rule leads to, result
// among applied, already_applied, illegal, stale_version, not_found.
// result="illegal" counts illegal transitions. Machines of different
// entities register with one registry; each call returns a new collector
// reading the same counters, so a Machine registers with several
// registries too.
func (m *Machine) Collector() prometheus.Collector {
	return collector{m: m, desc: prometheus.NewDesc("idemq_transitions_total",
		"transition.Machine.Apply calls by target status and result: applied (changed the row), already_applied (a retry, or a late request for a status the row has passed), illegal (ErrIllegalTransition), stale_version (ErrStaleVersion), not_found.",
		[]string{"to", "result"}, prometheus.Labels{"entity": m.cfg.Entity})}
}

type collector struct {
	m    *Machine
	desc *prometheus.Desc
}

func (c collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	stats := c.m.Stats()
	tos := make([]string, 0, len(stats))
	for to := range stats {
		tos = append(tos, to)
	}
	sort.Strings(tos)
	for _, to := range tos {
		s := stats[to]
		for _, r := range []struct {
			name string
			n    int64
		}{{"applied", s.Applied}, {"already_applied", s.AlreadyApplied}, {"illegal", s.Illegal},
			{"stale_version", s.StaleVersion}, {"not_found", s.NotFound}} {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(r.n), to, r.name)
		}
	}
}
