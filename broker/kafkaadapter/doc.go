// Package kafkaadapter connects idemq to Kafka through
// github.com/segmentio/kafka-go.
//
// # Identity
//
// The message ID is the value of the "message-id" header
// ([Config.MessageIDHeader]), as set by idemq's outbox relay or any producer that
// stamps one. A message without it, or whose value is blank ("", " ", "\t",
// any white space: dedup.IsBlank), gets the position identity
// "kafka:<topic>/<partition>/<offset>", stable across consumer redelivery but
// not across producer retries: give producers a message-id header or a
// business key (consumer.Config.BusinessKey) to catch those. The record key
// is never the business key by default.
//
// # Offsets
//
// Source reads with Reader.FetchMessage only (ReadMessage commits before the
// handler runs, so a crash would lose the message) and commits with
// Reader.CommitMessages only what the consumer runtime reports done: per
// partition, the contiguous completed prefix, never backwards. The Reader's
// own CommitInterval must be 0 (synchronous commits); the runtime batches.
// kafka-go does not redeliver a message whose commit was skipped until a
// rebalance or a new Reader, so a retryable failure is retried in place by
// the runtime.
package kafkaadapter
