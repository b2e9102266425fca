package rocketmqadapter_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A %RETRY% copy keeps the identity of the original: its UNIQ_KEY, not its
// OffsetMsgId, and its original topic.
func ExampleToDelivery() {
	m := &primitive.MessageExt{
		Message:        primitive.Message{Topic: "%RETRY%billing", Body: []byte(`{"invoice":"invoice-9"}`)},
		MsgId:          "U1",
		OffsetMsgId:    "7F00000100002A9F0000000000000BB8",
		QueueOffset:    17,
		ReconsumeTimes: 1,
	}
	m.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, "U1")
	m.WithProperty(primitive.PropertyRetryTopic, "billing")
	m.WithProperty(primitive.PropertyKeys, "invoice-9")
	m.Queue = &primitive.MessageQueue{Topic: "%RETRY%billing", BrokerName: "broker-a", QueueId: 0}

	d := rocketmqadapter.ToDelivery(m, "")
	bk, _ := rocketmqadapter.BusinessKeyFromKeys(d.Message)
	fmt.Println("message ID:", d.MessageID)
	fmt.Println("business key:", bk)
	fmt.Println("topic:", d.Message.Topic)
	fmt.Println("source:", d.Position)
	fmt.Println("reconsume times:", d.Message.ReconsumeTimes)
	fmt.Println("horizon of the default delay levels:", rocketmqadapter.RedeliveryHorizon(rocketmqadapter.DefaultDelayLevels(), 16))
	// Output:
	// message ID: U1
	// business key: invoice-9
	// topic: billing
	// source: rocketmq:%RETRY%billing/broker-a/0/17
	// reconsume times: 1
	// horizon of the default delay levels: 4h45m40s
}

// Wrap an order handler as the listener of a push consumer. It needs
// Postgres and RocketMQ, so it is compiled but not run.
func ExampleNewPushConsumer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://idemq:idemq@127.0.0.1:5432/idemq?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("a-secret-from-your-secret-store")})
	store, err := pgstore.New(pool, pgstore.Config{Fingerprinter: fp, MaxAttempts: 5})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	ns := []string{"127.0.0.1:9876"}
	if err := rocketmqadapter.EnsureTopic(ctx, ns, "127.0.0.1:10911", "orders", 4); err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Scope: "order-svc", // the consumer group
		Store: store,
		Handler: func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
			_, err := tx.Exec(ctx, `insert into orders (order_id, body) values ($1, $2)`, msg.Identity.BusinessKey, msg.Payload)
			return err
		},
		BusinessKey:        rocketmqadapter.BusinessKeyFromKeys, // producers put the order ID in Keys
		MaxHandlerDuration: 30 * time.Second,                    // × BatchMaxSize must stay under ConsumeTimeout
	})
	if err != nil {
		log.Fatal(err)
	}
	pc, err := rocketmqadapter.NewPushConsumer(c, rocketmqadapter.Config{
		NameServers: ns,
		Group:       "order-svc",
		Topic:       "orders",
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = pc.Shutdown() }()
	<-ctx.Done()
}
