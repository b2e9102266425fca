// Package broker holds idemq's broker adapters, one sub-package per client
// library, named so they do not shadow the client packages users import
// beside them:
//
//   - kafkaadapter: Kafka on github.com/segmentio/kafka-go (>= v0.4.48, which
//     Kafka 4.x requires). A consumer.Source over a consumer-group Reader.
//   - rocketmqadapter: RocketMQ on github.com/apache/rocketmq-client-go/v2.
//
// Every adapter turns a broker delivery into a consumer.Delivery with a stable
// message ID and acknowledges only after the outcome is durable in Postgres.
package broker
