// Package kafkaadmin holds the Kafka topic administration that both the
// consumer side (broker/kafkaadapter, which re-exports EnsureTopics) and the
// outbox side (outbox/kafkapub, Config.CreateTopics) need, so that the relay
// does not link the consumer runtime to create a topic. It depends on
// kafka-go only.
package kafkaadmin
