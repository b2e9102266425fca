package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/admin"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/rocketmqpub"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
)

// obRocketTopic creates a RocketMQ topic and waits for its route.
func obRocketTopic(t testing.TB, nameServers []string) string {
	t.Helper()
	brokerAddr := os.Getenv("TEST_ROCKETMQ_BROKER")
	if brokerAddr == "" {
		brokerAddr = "127.0.0.1:10911"
	}
	topic := randomName("idemq_ob_")
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(nameServers)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = adm.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := adm.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(brokerAddr),
		admin.WithReadQueueNums(4), admin.WithWriteQueueNums(4)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a route for "+topic, func() bool {
		mqs, err := adm.FetchPublishMessageQueues(ctx, topic)
		return err == nil && len(mqs) > 0
	})
	return topic
}

// The relay publishes to RocketMQ: a batch whose mark is lost is republished
// and the idemq consumer's dedup absorbs every copy. (How rocketmqpub stores an
// envelope, the message-id property, Keys and the body, byte for byte on every
// copy, is TestPublisherConformanceRocketMQ's.)
func TestRelayRocketMQ(t *testing.T) {
	t.Parallel()
	rlog.SetLogLevel("error")
	ns := []string{rocketmqNamesrv(t)}
	o := setupOutbox(t)
	topic := obRocketTopic(t, ns)

	eff := o.table("rmq_effects")
	o.exec(`create table ` + eff + ` (message_id text not null, key text not null, body text not null)`)
	var mu sync.Mutex
	calls := map[string]int{}
	metrics := &consumer.Counters{}
	group := randomName("ob_rmq_")
	c, err := consumer.New(consumer.Config{Scope: group, Store: o.store, Metrics: metrics,
		Handler: func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
			mu.Lock()
			calls[m.Identity.MessageID]++
			mu.Unlock()
			_, err := tx.Exec(ctx, `insert into `+eff+` values ($1, $2, $3)`, m.Identity.MessageID, string(m.Key), string(m.Payload))
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := rocketmq.NewPushConsumer(
		rmqconsumer.WithGroupName(group),
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver(ns)),
		rmqconsumer.WithInstance(randomName("ob-rmq-consumer-")),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
	)
	if err != nil {
		t.Fatal(err)
	}
	err = pc.Subscribe(topic, rmqconsumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		for _, m := range msgs {
			id := m.GetProperty(wire.MessageIDHeader)
			pos := fmt.Sprintf("rocketmq:%s/%s/%d/%d", m.Topic, m.Queue.BrokerName, m.Queue.QueueId, m.QueueOffset)
			d := consumer.Delivery{
				Message: &dedup.Message{Topic: m.Topic, Key: []byte(m.GetKeys()), Payload: m.Body,
					Headers: m.GetProperties(), Partition: m.Queue.QueueId, Offset: m.QueueOffset, ReconsumeTimes: m.ReconsumeTimes},
				MessageID: id, Position: pos, Lane: strconv.Itoa(m.Queue.QueueId), Offset: m.QueueOffset,
			}
			res, err := c.Handle(context.Background(), d)
			if err != nil || !res.Outcome.Acked() {
				return rmqconsumer.ConsumeRetryLater, nil
			}
		}
		return rmqconsumer.ConsumeSuccess, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shutdownRocketPush(pc) })

	pub, err := rocketmqpub.New(rocketmqpub.Config{NameServers: ns, InstanceName: randomName("ob-rmq-relay-")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })

	// 40 rows over 4 keys.
	tx, err := o.pool.Begin(o.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []outbox.Message
	for i := range 40 {
		k := fmt.Sprintf("order-%d", i%4)
		msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte(k), Payload: []byte(fmt.Sprintf(`{"order":%q,"n":%d}`, k, i))})
	}
	ids, err := o.ob.AddBatch(o.ctx, tx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(o.ctx); err != nil {
		t.Fatal(err)
	}

	// The relay's first batch is published and its mark is lost (its claim
	// transaction's backend terminated), as after a crash there.
	var fired atomic.Int32
	cfg := fastRelay("relay-rmq")
	cfg.BatchSize, cfg.MaxKeys = 10, 4
	app := randomName("relay-rmq-")
	ml := &markLoss{o: o, app: app, fired: &fired}
	rr := o.startRelayOn(t, o.relayOutbox(t, app), ml.wrap(pub), cfg)
	eventually(t, 60*time.Second, "40 rows marked", func() bool { return o.stats(t).Published == 40 })
	ml.check(t)
	lost := &ml.acked
	eventually(t, 90*time.Second, "40 effects", func() bool { return o.count(`select count(*) from `+eff) >= 40 })
	eventually(t, 90*time.Second, "the republished copies of the rows whose mark was lost absorbed downstream",
		func() bool { return lost.Load() > 0 && metrics.Get("duplicate") >= lost.Load() })
	rr.stop(t)

	if n := o.count(`select count(distinct message_id) from ` + eff); n != 40 || o.count(`select count(*) from `+eff) != 40 {
		t.Fatalf("effects: %d distinct, want 40 exactly once", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, id := range ids {
		if calls[id.String()] != 1 {
			t.Fatalf("row %d (%s): handler calls %d, want 1", i, id, calls[id.String()])
		}
	}
	if lost.Load() == 0 || metrics.Get("duplicate") < lost.Load() {
		t.Fatalf("lost mark of %d rows: %d duplicates absorbed, want at least as many", lost.Load(), metrics.Get("duplicate"))
	}
	t.Logf("mark lost for %d rows; duplicates absorbed %d", lost.Load(), metrics.Get("duplicate"))
}
