package rocketmqadapter_test

import (
	"context"
	"errors"
	"fmt"
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
// offsets. Scope is required; every error is checked.
func runOrders(ctx context.Context, store *pgstore.Store) error { // store: from pgstore.New
	c, err := consumer.New(consumer.Config{Scope: "order-svc", Store: store, Handler: createOrder,
		BusinessKey: rocketmqadapter.BusinessKeyFromKeys})
	if err != nil {
		return err
	}
	src, err := rocketmqadapter.NewSource(rocketmqadapter.SourceConfig{
		NameServers: []string{"127.0.0.1:9876"}, Group: "order-svc", Topic: "orders"})
	if err != nil {
		return err
	}
	return c.Run(ctx, src) // until ctx ends; commits completed offsets, then closes
}

// Example_readmeSource runs the pull-mode snippet without a store: New
// refuses it with an error instead of a nil consumer that would panic.
func Example_readmeSource() {
	err := runOrders(context.Background(), nil)
	fmt.Println(err)
	// Output: idemq/consumer: invalid config: Store is a nil *pgstore.Store (did the store's constructor fail? check its error)
}

// The README's push-listener snippet: an existing push consumer's listener
// replaced by the consumer's push entry point. Every error is checked.
func runPushListener(ctx context.Context, store *pgstore.Store) error { // store: from pgstore.New
	c, err := consumer.New(consumer.Config{Scope: "order-svc", Store: store, Handler: createOrder,
		BusinessKey:        rocketmqadapter.BusinessKeyFromKeys, // producers put the order ID in Keys
		MaxHandlerDuration: 30 * time.Second,                    // validated: × batch size must stay under ConsumeTimeout
	})
	if err != nil {
		return err
	}
	pc, err := rocketmqadapter.NewPushConsumer(c, rocketmqadapter.Config{ // broker settings only
		NameServers: []string{"127.0.0.1:9876"}, Group: "order-svc", Topic: "orders",
	})
	if err != nil {
		return err
	}
	if err := pc.Start(); err != nil { // topic must exist: rocketmqadapter.EnsureTopic
		return err
	}
	<-ctx.Done()         // until SIGTERM
	return pc.Shutdown() // waits for in-flight handlers
}

// Example_readmePushConsumer runs the push-listener snippet without a store:
// the configuration error comes back before anything connects.
func Example_readmePushConsumer() {
	err := runPushListener(context.Background(), nil)
	fmt.Println(errors.Is(err, consumer.ErrInvalidConfig))
	// Output: true
}
