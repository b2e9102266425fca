package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/promx"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The Kafka source's lag gauge follows the group's committed offset against
// the partition's high watermark on a real broker: 20 messages produced and
// the handler stuck on the 9th (8 committed) shows 12; 5 more produced while
// it is stuck show 17; released, the group catches up and the gauge shows 0,
// which the broker's own GroupLag confirms. Two Sources with different const
// labels register in one registry.
func TestKafkaConsumerLagMetric(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	topic, group := newTopic(t, 1), randomName("g-")
	var first []kmsg
	for i := range 20 {
		first = append(first, kmsg{id: fmt.Sprintf("lag-%d", i), payload: "x"})
	}
	produce(t, topic, first...)

	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: readerConfig(t, group, topic)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(src.Collector(promx.ConstLabels(prometheus.Labels{"source": "a"}))); err != nil {
		t.Fatal(err)
	}
	other, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: readerConfig(t, randomName("g-"), topic)})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := reg.Register(other.Collector(promx.ConstLabels(prometheus.Labels{"source": "b"}))); err != nil {
		t.Fatalf("a second Source's collector with other const labels: %v", err)
	}

	stuck, release := make(chan struct{}), make(chan struct{})
	handler := func(ctx context.Context, _ pgx.Tx, m *dedup.Message) error {
		if m.Identity.MessageID == "lag-8" {
			select {
			case <-stuck:
			default:
				close(stuck)
			}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: handler}, src)

	lagIs := func(want int) func() bool {
		exp := fmt.Sprintf(`# HELP idemq_consumer_lag_messages Kafka consumer-group lag per owned partition: high watermark of the newest fetched message minus the committed offset, in messages.
# TYPE idemq_consumer_lag_messages gauge
idemq_consumer_lag_messages{consumer_group=%q,partition="0",source="a",topic=%q} %d
`, group, topic, want)
		return func() bool {
			return testutil.GatherAndCompare(reg, strings.NewReader(exp), "idemq_consumer_lag_messages") == nil
		}
	}
	<-stuck
	eventually(t, 60*time.Second, "lag 12 with the handler stuck at offset 8", lagIs(12))
	if off := groupOffset(t, group, topic); off != 8 {
		t.Fatalf("committed offset %d while stuck at offset 8; want 8", off)
	}
	var more []kmsg
	for i := range 5 {
		more = append(more, kmsg{id: fmt.Sprintf("lag-more-%d", i), payload: "x"})
	}
	produce(t, topic, more...)
	eventually(t, 60*time.Second, "lag 17 after 5 more messages", lagIs(17))
	close(release)
	eventually(t, 60*time.Second, "lag 0 once released", lagIs(0))
	waitCaughtUp(t, group, topic)
}
