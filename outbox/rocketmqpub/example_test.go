package rocketmqpub_test

import (
	"fmt"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/rocketmqpub"
	"github.com/idemq/idemq/wire"
)

// Message is what a row becomes: the message ID as a user property, the row
// key as Keys and sharding key (same key, same queue).
func ExampleMessage() {
	m := rocketmqpub.Message(outbox.Envelope{
		Topic:   "order_confirmed",
		Key:     []byte("order-42"),
		Headers: map[string]string{wire.MessageIDHeader: "0190a5c4-5d2e-7b3a-8c1d-2e3f4a5b6c7d"},
		Payload: []byte(`{"order":"order-42"}`),
	})
	fmt.Println(m.Topic, string(m.Body))
	fmt.Println(m.GetProperty(wire.MessageIDHeader))
	fmt.Println(m.GetKeys(), m.GetShardingKey())
	// Output:
	// order_confirmed {"order":"order-42"}
	// 0190a5c4-5d2e-7b3a-8c1d-2e3f4a5b6c7d
	// order-42 order-42
}
