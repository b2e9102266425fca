package kafkapub_test

import (
	"fmt"

	"github.com/google/uuid"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/idemq/idemq/wire"
	"github.com/segmentio/kafka-go"
)

// New applies the defaults; it does not connect. The Publisher is a
// ChainPublisher: a relay hands it whole batches.
func ExampleNew() {
	p, err := kafkapub.New(kafkapub.Config{Brokers: []string{"127.0.0.1:9092"}})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	c := p.Config()
	_, chains := any(p).(outbox.ChainPublisher)
	fmt.Println(c.BatchBytes, c.WriteTimeout, c.CreateTopics, c.Balancer == kafka.Murmur2Balancer{}, chains)
	// Output: 1000000 10s false true true
}

// Message is the exact record a row becomes: headers sorted by name, so a
// republish is byte-identical.
func ExampleMessage() {
	m := kafkapub.Message(outbox.Envelope{
		ID:      uuid.MustParse("0190a5c4-5d2e-7b3a-8c1d-2e3f4a5b6c7d"),
		Topic:   "order.confirmed",
		Key:     []byte("order-42"),
		Headers: map[string]string{wire.MessageIDHeader: "0190a5c4-5d2e-7b3a-8c1d-2e3f4a5b6c7d", "content-type": "application/json"},
		Payload: []byte(`{"order":"order-42"}`),
	})
	fmt.Println(m.Topic, string(m.Key), string(m.Value))
	for _, h := range m.Headers {
		fmt.Printf("%s=%s\n", h.Key, h.Value)
	}
	// Output:
	// order.confirmed order-42 {"order":"order-42"}
	// content-type=application/json
	// message-id=0190a5c4-5d2e-7b3a-8c1d-2e3f4a5b6c7d
}
