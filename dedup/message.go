package dedup

import "time"

// Message is one broker delivery as a handler sees it. Broker adapters fill
// the broker fields; the consumer runtime fills Identity and Attempt before the
// handler runs. Handlers must treat a Message as read-only.
type Message struct {
	// Identity is the normalized dedup identity of this delivery.
	Identity Identity
	// Topic is the topic the message was produced to. For a RocketMQ copy read
	// from %RETRY%<group> it is the original topic (the client restores it).
	Topic string
	// Key is the broker record key (Kafka) or the message Keys (RocketMQ).
	// It is a partitioning key, not an idempotency key: idemq never uses it as
	// the business key unless the user's extractor says so.
	Key []byte
	// Payload is the message body, unchanged.
	Payload []byte
	// Headers are the Kafka headers or RocketMQ user properties. When a key
	// repeats, the last value wins.
	Headers map[string]string
	// Source is the broker position for audit, e.g.
	// "kafka:payments/2/1041" or "rocketmq:%RETRY%billing/broker-a/1/17".
	Source string
	// Partition is the Kafka partition or the RocketMQ queue ID.
	Partition int
	// Offset is the Kafka offset or the RocketMQ queue offset of this copy.
	Offset int64
	// ReconsumeTimes is RocketMQ's redelivery counter for this copy (0 for
	// Kafka). It is recorded, never trusted to bound attempts.
	ReconsumeTimes int32
	// Time is the broker timestamp of the message (zero if unknown).
	Time time.Time
	// Attempt is the 1-based number of this handler execution for the
	// consumption record (the record's attempts column after the claim).
	Attempt int
}

// Header returns the value of header name, or "" when absent.
func (m *Message) Header(name string) string {
	if m == nil || m.Headers == nil {
		return ""
	}
	return m.Headers[name]
}
