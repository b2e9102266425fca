package rocketmqadapter

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/prometheus/client_golang/prometheus"
)

// seenWindow is how many offsets below the highest one seen per queue
// QueueMetrics remembers to recognize a redelivery.
const seenWindow = 10000

// QueueMetrics is a consumer.Metrics (give it as consumer.Config.Metrics, to
// a Listener, PushConsumer or Source) that counts per RocketMQ queue, so an
// operator sees a redelivery storm and where it is:
//
//   - idemq_rocketmq_deliveries_total{scope, topic, queue}: deliveries with
//     a durable outcome (attempts retried in place count once each);
//   - idemq_rocketmq_redeliveries_total{scope, topic, queue}: deliveries of
//     a copy the broker sent back (ReconsumeTimes > 0), or of a queue offset
//     this process already saw reach an acknowledgeable outcome (a queue read
//     again after a rebalance, or after an offset was lost);
//   - idemq_rocketmq_duplicates_total{scope, topic, queue}: deliveries whose
//     outcome is dedup.OutcomeDuplicate. This also catches what another
//     process had done already (a new owner of a queue reading behind), which
//     the redelivery count cannot see.
//
// topic is the topic of the queue read (%RETRY%<group> for a retry copy) and
// queue is "<brokerName>/<queueId>". duplicates / deliveries per queue is the
// redelivery cost; it stays near 0 in a healthy group. Each call is passed
// on to Next as well.
type QueueMetrics struct {
	// Next receives every call too (Delivery, and ObserveReason and
	// ObserveDuration when it implements them), e.g. a
	// consumer.PrometheusMetrics. Optional.
	Next consumer.Metrics

	deliveries   *prometheus.CounterVec
	redeliveries *prometheus.CounterVec
	duplicates   *prometheus.CounterVec
	seen         queueSeen
}

// NewQueueMetrics registers the counters with reg
// (prometheus.DefaultRegisterer when nil) and returns the metrics, passing
// every call on to next (nil: none). It returns the registration error, e.g.
// when registered twice.
func NewQueueMetrics(reg prometheus.Registerer, next consumer.Metrics) (*QueueMetrics, error) {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	labels := []string{"scope", "topic", "queue"}
	m := &QueueMetrics{
		Next: next,
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemq_rocketmq_deliveries_total",
			Help: "RocketMQ deliveries with a durable outcome, per queue read (topic: %RETRY%<group> for retry copies; queue: <brokerName>/<queueId>).",
		}, labels),
		redeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemq_rocketmq_redeliveries_total",
			Help: "RocketMQ deliveries of a copy sent back (ReconsumeTimes > 0) or of a queue offset this process had already completed, per queue.",
		}, labels),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemq_rocketmq_duplicates_total",
			Help: "RocketMQ deliveries whose outcome was duplicate (already done, by this or another process), per queue.",
		}, labels),
		seen: queueSeen{m: map[string]*seenOffsets{}},
	}
	for _, c := range []prometheus.Collector{m.deliveries, m.redeliveries, m.duplicates} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Delivery implements consumer.Metrics: it passes the call on to Next.
func (m *QueueMetrics) Delivery(scope string, outcome dedup.Outcome, by dedup.MatchedBy) {
	if m.Next != nil {
		m.Next.Delivery(scope, outcome, by)
	}
}

// ObserveReason implements consumer.ReasonObserver: it passes the call on to
// Next when Next implements it.
func (m *QueueMetrics) ObserveReason(scope string, outcome dedup.Outcome, reason string) {
	if ro, ok := m.Next.(consumer.ReasonObserver); ok {
		ro.ObserveReason(scope, outcome, reason)
	}
}

// ObserveDuration implements consumer.DurationObserver: it passes the call
// on to Next when Next implements it.
func (m *QueueMetrics) ObserveDuration(scope string, outcome dedup.Outcome, d time.Duration) {
	if do, ok := m.Next.(consumer.DurationObserver); ok {
		do.ObserveDuration(scope, outcome, d)
	}
}

// ObserveMessage implements consumer.MessageObserver: it counts msg on its
// queue (see QueueMetrics). A message whose Source is not a RocketMQ
// position is counted under its Topic and queue "/<Partition>". Calls
// passed on to Next when it implements consumer.MessageObserver.
func (m *QueueMetrics) ObserveMessage(scope string, msg *dedup.Message, res dedup.Result) {
	if mo, ok := m.Next.(consumer.MessageObserver); ok {
		mo.ObserveMessage(scope, msg, res)
	}
	if msg == nil || res.Outcome == "" {
		return
	}
	topic, queue, offset := queueOf(msg)
	c := m.seen.observe(scope+"\x00"+topic+"\x00"+queue, offset, msg.ReconsumeTimes, res.Outcome)
	m.deliveries.WithLabelValues(scope, topic, queue).Inc()
	if c.redelivery {
		m.redeliveries.WithLabelValues(scope, topic, queue).Inc()
	}
	if c.duplicate {
		m.duplicates.WithLabelValues(scope, topic, queue).Inc()
	}
}

// queueOf returns the queue msg was read from: the topic read, the queue
// ("<brokerName>/<queueId>") and the offset, parsed from its position
// (rocketmq:<topic>/<brokerName>/<queueId>/<offset>), else from its Topic,
// Partition and Offset.
func queueOf(msg *dedup.Message) (topic, queue string, offset int64) {
	if rest, ok := strings.CutPrefix(msg.Source, "rocketmq:"); ok {
		parts := strings.Split(rest, "/")
		if n := len(parts); n >= 4 {
			if off, err := strconv.ParseInt(parts[n-1], 10, 64); err == nil {
				return strings.Join(parts[:n-3], "/"), parts[n-3] + "/" + parts[n-2], off
			}
		}
	}
	return msg.Topic, "/" + strconv.Itoa(msg.Partition), msg.Offset
}

// queueCount is what one observed delivery counts as.
type queueCount struct {
	redelivery bool
	duplicate  bool
}

// queueSeen remembers, per queue, the offsets that reached an
// acknowledgeable outcome, within seenWindow of the highest one.
type queueSeen struct {
	mu sync.Mutex
	m  map[string]*seenOffsets
}

type seenOffsets struct {
	max  int64
	offs map[int64]struct{}
}

// observe classifies one delivery of queue at offset: a redelivery when the
// broker sent the copy back (reconsume > 0) or when offset reached an
// acknowledgeable outcome before; a duplicate when outcome is duplicate. An
// outcome that is not acknowledgeable (retry, fenced) does not mark the
// offset done, so attempts retried in place are not redeliveries.
func (s *queueSeen) observe(queue string, offset int64, reconsume int32, outcome dedup.Outcome) queueCount {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.m[queue]
	if q == nil {
		q = &seenOffsets{max: -1, offs: map[int64]struct{}{}}
		s.m[queue] = q
	}
	_, again := q.offs[offset]
	c := queueCount{redelivery: again || reconsume > 0, duplicate: outcome == dedup.OutcomeDuplicate}
	if outcome.Acked() && offset > q.max-seenWindow {
		q.offs[offset] = struct{}{}
		if offset > q.max {
			q.max = offset
		}
		if len(q.offs) > 2*seenWindow {
			for o := range q.offs {
				if o <= q.max-seenWindow {
					delete(q.offs, o)
				}
			}
		}
	}
	return c
}

var (
	_ consumer.Metrics          = (*QueueMetrics)(nil)
	_ consumer.MessageObserver  = (*QueueMetrics)(nil)
	_ consumer.ReasonObserver   = (*QueueMetrics)(nil)
	_ consumer.DurationObserver = (*QueueMetrics)(nil)
)
