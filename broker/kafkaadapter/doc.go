// Package kafkaadapter connects idemq to Kafka through
// github.com/segmentio/kafka-go.
//
// # Identity
//
// The message ID is the value of the message-id header (wire.MessageIDHeader,
// [Config.MessageIDHeader]), as set by idemq's outbox relay or any producer that
// stamps one. A message without it, or whose value is blank ("", " ", "\t",
// any white space: wire.IsBlank), gets the position identity
// "kafka:<topic>/<partition>/<offset>", stable across consumer redelivery but
// not across producer retries: give producers a message-id header or a
// business key (consumer.Config.BusinessKey) to catch those. The record key
// is never the business key by default.
//
// # Offsets
//
// [Source] never commits by reading (no ReadMessage, no auto-commit). It
// commits only what the consumer runtime reports done: per partition, the
// contiguous completed prefix, never backwards, batched by the runtime and
// flushed when the runtime stops. Kafka has no per-message redelivery, so a
// retryable failure is retried in place by the runtime.
//
// # Consumer groups and generations
//
// Source runs on kafka-go's ConsumerGroup and Generation API
// (kafka.NewConsumerGroup, ConsumerGroup.Next, Generation.Start,
// Generation.CommitOffsets), with one partition reader (a kafka.Reader without
// group, from the assigned offset) per partition of the generation. Each
// partition this member is assigned is a claim of that generation:
//
//   - Commits carry the generation in which this member owns the partition
//     now; the broker refuses a generation that has ended (illegal
//     generation, unknown member, rebalance in progress), and a commit never
//     goes below the offset committed for the partition.
//   - When a generation ends (a rebalance: a member joins, leaves or times
//     out; or a lost coordinator connection), its claims are revoked: the
//     partition readers stop and what they buffered is dropped; the runtime
//     ([consumer.Revocable]) drops the deliveries waiting in the partitions'
//     lanes, stops retrying the ones in hand, and commits what it completed
//     at once, with the ending generation (this flush is bounded by a third
//     of Reader.SessionTimeout or Reader.RebalanceTimeout, whichever is
//     shorter, so the member rejoins in time). Then the generation is given
//     up and kafka-go rejoins the group.
//   - A delivery completed after that is not committed unless this member
//     owns its partition again; then it is committed with the current
//     generation if it lies above the partition's committed offset, and
//     the new claim reads on after the offsets this member completed already.
//
// So the committed offset of a partition never decreases, across members too:
// a commit with generation N lands before any member of generation N+1 reads
// the committed offsets, and a member commits only partitions it owns. After
// a rebalance the partition's next owner replays at most what the previous
// owner had in hand.
//
// The old kafka-go Reader-based adapter could not do this: the Reader has no
// revoke hook and commits buffered messages of a revoked partition with the
// new generation (segmentio/kafka-go#1398).
//
// Each partition reader handles its own transient errors (a broker down, a
// leader moving): it logs them and backs off without holding up the
// member's other partitions, and it fetches again as soon as kafka-go
// reads a message for it (Source.Fetch, Config.FetchRetryMax).
//
// Partitions added to a consumed topic end the generation too, unless
// Config.IgnorePartitionChanges: every member asks for the topics'
// partition count every Reader.PartitionWatchInterval
// (DefaultPartitionWatchInterval, 5s) and ends its generation when it
// differs from the count read before the member joined (so a partition
// added while the group was assigning is not missed). kafka-go's own
// watch (WatchPartitionChanges) is not used: it ends every generation at
// once while a consumed topic does not exist. The new generation assigns
// the added partitions; without a committed offset they are read from
// Reader.StartOffset, kafka.FirstOffset by default, so what was written to
// them before the rebalance is consumed too.
//
// # Secured brokers
//
// Set Config.Reader.Dialer to a dialer with TLS and SASL (build it with
// broker/kafkasec, kafkasec.Config.Dialer). Every connection of the Source
// uses it: the consumer group, the partition readers and the redelivery
// horizon check (Source.RedeliveryHorizon, a DescribeConfigs request sent
// through kafkasec.TransportFromDialer of that Dialer). The admin helpers
// take the same settings as a kafka.RoundTripper: EnsureTopicsWith,
// GroupLagWith, TopicRetentionWith (EnsureTopics, GroupLag and
// TopicRetention are their PLAINTEXT shorthands). A refused SASL login or a
// security-protocol mismatch fails with an error wrapping
// kafkasec.ErrAuthentication or kafkasec.ErrSecurityMismatch instead of
// kafka-go's "Broker Not Available" or EOF.
//
// The horizon check needs the DescribeConfigs ACL on the consumed topics.
// Without it the check fails with ErrHorizonCheckDenied; set
// Config.RedeliveryHorizon (at least the topics' retention.ms) to state the
// horizon instead: the risk of a value that is too short is in that field's
// comment and in docs/operations.md ("Secured Kafka").
//
// # Lag
//
// Source.Collector exports idemq_consumer_lag_messages{topic, partition,
// consumer_group}: per owned partition, the high watermark carried by the
// newest fetched message minus the committed offset, at no extra request.
// GroupLag asks the broker for the group's whole lag on a topic.
package kafkaadapter
