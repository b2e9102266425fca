package rocketmqadapter_test

import (
	"context"
	"time"

	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
)

// createOrder is the example's handler: it writes the order through the
// consumption record's transaction.
func createOrder(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
	_, err := tx.Exec(ctx, `insert into orders (order_id, body) values ($1, $2)`, m.Identity.BusinessKey, m.Payload)
	return err
}

// The README's RocketMQ pull-mode snippet (internal/docscheck checks that it
// is copied from here): the recommended mode, in which idemq owns the queue
// offsets.
func Example_readmeSource() {
	ctx := context.Background()
	var store *pgstore.Store // from pgstore.New

	c, _ := consumer.New(consumer.Config{Store: store, Handler: createOrder,
		BusinessKey: rocketmqadapter.BusinessKeyFromKeys})
	src, _ := rocketmqadapter.NewSource(rocketmqadapter.SourceConfig{
		NameServers: []string{"127.0.0.1:9876"}, Group: "order-svc", Topic: "orders"})
	_ = c.Run(ctx, src) // until ctx ends; commits completed offsets, then closes
}

// The README's push-listener snippet: an existing push consumer's listener
// replaced by the consumer's push entry point.
func Example_readmePushConsumer() {
	ctx := context.Background()
	var store *pgstore.Store // from pgstore.New

	c, _ := consumer.New(consumer.Config{Scope: "order-svc", Store: store, Handler: createOrder,
		BusinessKey:        rocketmqadapter.BusinessKeyFromKeys, // producers put the order ID in Keys
		MaxHandlerDuration: 30 * time.Second,                    // validated: × batch size must stay under ConsumeTimeout
	})
	pc, _ := rocketmqadapter.NewPushConsumer(c, rocketmqadapter.Config{ // broker settings only
		NameServers: []string{"127.0.0.1:9876"}, Group: "order-svc", Topic: "orders",
	})
	_ = pc.Start()    // topic must exist: rocketmqadapter.EnsureTopic
	<-ctx.Done()      // until SIGTERM
	_ = pc.Shutdown() // waits for in-flight handlers
	_ = time.Second
}
