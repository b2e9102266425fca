package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/wire"
	"github.com/segmentio/kafka-go"
)

// S30: a topic grows while a consumer built as the README shows reads it.
// The partitions added are consumed, exactly once, from their first offset
// (the messages are produced before the group can have seen the new
// partitions), and their offsets are committed, within the bound the docs
// state: kafkaadapter.DefaultPartitionWatchInterval plus one rebalance
// (bounded by Reader.RebalanceTimeout).

// growthMargin is what the tests allow beyond the documented bound for the
// rebalance itself (rejoin, sync, the first fetch) on a loaded machine.
const growthMargin = 2 * time.Minute

// produceTo writes one message with message ID id to partition p of topic,
// retrying while the partition's leader is not ready yet (right after
// CreatePartitions).
func produceTo(t testing.TB, topic string, p int, id string) {
	t.Helper()
	produceWith(t, &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second}, topic, p, id)
}

// produceWith is produceTo through cl (its brokers and transport).
func produceWith(t testing.TB, cl *kafka.Client, topic string, p int, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := cl.Produce(context.Background(), &kafka.ProduceRequest{Topic: topic, Partition: p, RequiredAcks: kafka.RequireAll,
			Records: kafka.NewRecordReader(kafka.Record{Value: kafka.NewBytes([]byte(id)),
				Headers: []kafka.Header{{Key: wire.MessageIDHeader, Value: []byte(id)}}})})
		if err == nil && res.Error != nil {
			err = res.Error
		}
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("produce %s to %s/%d: %v (for 30s)", id, topic, p, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// addPartitions raises topic's partition count to count through cl.
func addPartitions(t testing.TB, cl *kafka.Client, topic string, count int) {
	t.Helper()
	res, err := cl.CreatePartitions(context.Background(), &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: topic, Count: int32(count)}}}) //nolint:gosec // a test's partition count, a handful
	if err != nil {
		t.Fatalf("create partitions of %s: %v", topic, err)
	}
	if err := res.Errors[topic]; err != nil {
		t.Fatalf("create partitions of %s: %v", topic, err)
	}
}

// rmqBrokerName returns the broker name of topic's queues (one broker).
func rmqBrokerName(t testing.TB, topic string) string {
	t.Helper()
	ns, _ := rmqEndpoints(t)
	pc, err := rocketmq.NewPullConsumer(rmqconsumer.WithGroupName(randomName("it-route-")),
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver(ns)),
		rmqconsumer.WithInstance(rocketmqadapter.InstanceName("it-route")))
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Assign(topic, nil); err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pc.Shutdown() }()
	mqs, err := pc.GetTopicRouteInfo(topic)
	if err != nil || len(mqs) == 0 {
		t.Fatalf("route of %s: %v %v", topic, mqs, err)
	}
	return mqs[0].BrokerName
}

// rmqSendTo writes one message with message ID id to queue q of topic on
// brokerName, through p (a producer with a manual queue selector).
func rmqSendTo(t testing.TB, p rocketmq.Producer, topic, brokerName string, q int, id string) {
	t.Helper()
	m := primitive.NewMessage(topic, []byte(id))
	m.WithProperty(wire.MessageIDHeader, id)
	m.Queue = &primitive.MessageQueue{Topic: topic, BrokerName: brokerName, QueueId: q}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := p.SendSync(ctx, m)
	if err != nil {
		t.Fatalf("send %s to queue %d: %v", id, q, err)
	}
	if res.Status != primitive.SendOK || res.MessageQueue == nil || res.MessageQueue.QueueId != q {
		t.Fatalf("send %s to queue %d: %+v", id, q, res)
	}
}

// rmqManualProducer is a producer that writes each message to its
// Message.Queue.
func rmqManualProducer(t testing.TB) rocketmq.Producer {
	t.Helper()
	ns, _ := rmqEndpoints(t)
	p, err := rocketmq.NewProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(ns)),
		producer.WithInstanceName(rocketmqadapter.InstanceName("it-manual-producer")),
		producer.WithGroupName(randomName("it-producer-")),
		producer.WithQueueSelector(producer.NewManualQueueSelector()),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

func TestS30KafkaPartitionsAddedWhileConsuming(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	tbl := e.appliesTable()
	a := newApplier(tbl)
	topic, group := newTopic(t, 1), randomName("shipments-")

	// The consumer exactly as the README builds it.
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: kafka.ReaderConfig{
		Brokers: kafkaBrokers(t), GroupID: group, Topic: topic}})
	if err != nil {
		t.Fatal(err)
	}
	startConsumer(t, consumer.Config{Scope: group, Store: e.store, Handler: a.handler()}, src)

	produceTo(t, topic, 0, "shipment-0")
	eventually(t, 90*time.Second, "shipment-0 on partition 0 to be committed", func() bool {
		return committedOffsets(t, group, topic, 1)[0] == 1
	})

	addPartitions(t, &kafka.Client{Addr: kafka.TCP(kafkaBrokers(t)...), Timeout: 10 * time.Second}, topic, 3)
	produceTo(t, topic, 1, "shipment-1")
	produceTo(t, topic, 2, "shipment-2")

	// The documented bound: the watch interval plus one rebalance, itself
	// bounded by Reader.RebalanceTimeout (default 30s).
	bound := kafkaadapter.DefaultPartitionWatchInterval + 30*time.Second
	eventually(t, bound+growthMargin, "the messages on the added partitions 1 and 2 to be handled and committed "+
		"(the docs: within Reader.PartitionWatchInterval, default 5s, plus one rebalance)", func() bool {
		offs := committedOffsets(t, group, topic, 3)
		return offs[1] == 1 && offs[2] == 1
	})

	for _, id := range []string{"shipment-0", "shipment-1", "shipment-2"} {
		if n := a.callsFor(id); n != 1 {
			t.Errorf("handler calls of %s = %d, want 1", id, n)
		}
		if n := e.count(`select count(*) from `+tbl+` where message_id = $1`, id); n != 1 {
			t.Errorf("effects of %s = %d, want 1", id, n)
		}
		if r := e.record(group, id); r.Status != dedup.StatusSucceeded || r.Attempts != 1 {
			t.Errorf("record of %s = %s after %d attempts, want SUCCEEDED after 1", id, r.Status, r.Attempts)
		}
	}
	if n := e.count(`select count(*) from ` + e.table("consumption_records")); n != 3 {
		t.Errorf("consumption records = %d, want 3", n)
	}
	if got := committedOffsets(t, group, topic, 3); got[0] != 1 || got[1] != 1 || got[2] != 1 {
		t.Errorf("committed offsets = %v, want 1 on each of partitions 0, 1, 2", got)
	}
}

// S30 on RocketMQ: a topic's read and write queues are raised from 4 to 8
// while a Source (pull) and a push consumer, each built as the README shows,
// consume it. The messages written to the new queues 4…7 are handled,
// exactly once per group, within the bound the docs state.
func TestS30RocketMQQueuesAddedWhileConsuming(t *testing.T) {
	t.Parallel()
	ns, broker := rmqEndpoints(t)
	e := setup(t, nil)
	tbl := e.appliesTable()
	pullGroup, pushGroup := randomName("shipments-pull-"), randomName("shipments-push-")
	topic := rmqTopic(t, "it-growth-", pullGroup, pushGroup)
	pulled, pushed := newApplier(tbl), newApplier(tbl)

	// Both consumers as the README builds them, but starting from the first
	// offset: a new group under the client's default (CONSUME_FROM_LAST_OFFSET)
	// whose first rebalance comes after shipment-q0 is stored starts behind
	// it. Busy runs saw that happen to the Source once and to the push
	// consumer once; it is the client's rule for new groups, not the added
	// queues this test is about.
	fromFirst := []rmqconsumer.Option{rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset)}
	src, err := rocketmqadapter.NewSource(rocketmqadapter.SourceConfig{NameServers: ns, Group: pullGroup, Topic: topic, ClientOptions: fromFirst})
	if err != nil {
		t.Fatal(err)
	}
	run := startConsumer(t, consumer.Config{Scope: pullGroup, Store: e.store, Handler: pulled.handler()}, src)
	c, err := consumer.New(consumer.Config{Scope: pushGroup, Store: e.store, Handler: pushed.handler()})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := rocketmqadapter.NewPushConsumer(c, rocketmqadapter.Config{NameServers: ns, Group: pushGroup, Topic: topic, ClientOptions: fromFirst})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pc.Shutdown(); err != nil {
			t.Errorf("push consumer shutdown: %v", err)
		}
	})

	p := rmqManualProducer(t)
	// The first message goes through a producer with the default selector
	// (any of queues 0…3), which also names the broker of the queues.
	first := primitive.NewMessage(topic, []byte("shipment-q0"))
	first.WithProperty(wire.MessageIDHeader, "shipment-q0")
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	res, err := rmqProducer(t).SendSync(sctx, first)
	scancel()
	if err != nil || res.Status != primitive.SendOK || res.MessageQueue == nil {
		t.Fatalf("send shipment-q0: %+v, %v", res, err)
	}
	brokerName := res.MessageQueue.BrokerName
	// Both consumers' first rebalance (every 20s in the client) must come
	// first; a busy machine slows the brokers and the client, so the wait is
	// generous (it ends as soon as both handled it).
	// Done means durable: a SUCCEEDED record in each group (a handler call
	// alone may still roll back or be committing).
	succeeded := func(id string) bool {
		return e.count(`select count(*) from `+e.table("consumption_records")+` where message_id = $1 and status = 'SUCCEEDED'`, id) == 2
	}
	eventuallyExplained(t, 3*time.Minute, "shipment-q0 to be handled by the Source (pull group) and the push consumer", func() bool {
		return succeeded("shipment-q0")
	}, func() string {
		var recs []string
		for _, g := range []string{pullGroup, pushGroup} {
			r, err := e.store.Lookup(e.ctx, g, "shipment-q0")
			recs = append(recs, fmt.Sprintf("%s: %s after %d attempts (err %v)", g, r.Status, r.Attempts, err))
		}
		return fmt.Sprintf("sent to %s; handler calls: Source %d, push consumer %d; records %v; Source offsets %v; %s",
			res.MessageQueue, pulled.callsFor("shipment-q0"), pushed.callsFor("shipment-q0"), recs, src.Offsets(), run.state())
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rocketmqadapter.EnsureTopic(ctx, ns, broker, topic, 8); err != nil { // updateTopic: 8 read and write queues
		t.Fatal(err)
	}
	ids := []string{"shipment-q4", "shipment-q5", "shipment-q6", "shipment-q7"}
	for i, id := range ids {
		rmqSendTo(t, p, topic, brokerName, 4+i, id)
	}

	eventually(t, rocketmqadapter.AddedQueueBound+growthMargin, "the messages on the added queues 4…7 to be handled by the "+
		"Source and the push consumer (the docs: within rocketmqadapter.AddedQueueBound, the client's route refresh plus its rebalance interval)", func() bool {
		for _, id := range ids {
			if !succeeded(id) {
				return false
			}
		}
		return true
	})
	// The Source commits the new queues' offsets: one message each.
	eventually(t, 30*time.Second, "the Source to commit offset 1 on queues 4…7", func() bool {
		n := 0
		for mq, off := range src.Offsets() {
			if mq.Topic == topic && mq.QueueId >= 4 && off == 1 {
				n++
			}
		}
		return n == 4
	})
	for _, id := range append(ids, "shipment-q0") {
		if n, m := pulled.callsFor(id), pushed.callsFor(id); n != 1 || m != 1 {
			t.Errorf("handler calls of %s = %d (Source), %d (push consumer), want 1 each", id, n, m)
		}
		if n := e.count(`select count(*) from `+tbl+` where message_id = $1`, id); n != 2 {
			t.Errorf("effects of %s = %d, want 2 (one per group)", id, n)
		}
		for _, g := range []string{pullGroup, pushGroup} {
			if r := e.record(g, id); r.Status != dedup.StatusSucceeded || r.Attempts != 1 {
				t.Errorf("record of %s in %s = %s after %d attempts, want SUCCEEDED after 1", id, g, r.Status, r.Attempts)
			}
		}
	}
}
