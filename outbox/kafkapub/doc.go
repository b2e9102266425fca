// Package kafkapub is an outbox.Publisher for Kafka on
// github.com/segmentio/kafka-go (>= v0.4.48, which Kafka 4.x requires).
//
// # Atomic appends per partition
//
// A relay publishes several rows of one key per batch only if a later row can
// never be stored while an earlier row of its key is not (or consumers would
// see the later one first). The kafka-go Writer cannot promise that: it
// splits a call's messages into batches by count and size and retries each
// batch on its own, so batch 1 may fail while batch 2 succeeds. This package
// therefore produces with kafka.Client.Produce, the request the Writer itself
// sends: one produce request per partition holding all of the call's records
// for that partition, in order, as one record batch, which Kafka appends
// atomically (all or nothing). When the records exceed Config.BatchBytes they
// go in several requests, sent one after the other, and a key's rows stop at
// its first failed request. So Publisher implements outbox.ChainPublisher, and
// a relay publishes a whole batch in about one round trip per partition.
//
// # Broker settings
//
// Every request uses acks=all (kafka.RequireAll: kafka-go's Writer default is
// acks=0, which would mark rows published that the broker never stored).
// Topics are not created on a produce (kafka-go's AllowAutoTopicCreation
// default, false): create them first, or set Config.CreateTopics. Keys are
// mapped to partitions with kafka.Murmur2Balancer (the Java client's
// partitioner) over the topic's partition count, so a key lands where Java
// producers put it and every row of a key goes to one partition. There is no
// batching delay (the Writer's BatchTimeout, 1s by default, does not apply):
// the relay's batches are the batches.
//
// # Errors: the broker's or the row's
//
// A publish that fails because the cluster cannot take the write (connection
// refused or reset, timeouts, LeaderNotAvailable, NotLeaderForPartition,
// NotEnoughReplicas, BrokerNotAvailable, KafkaStorageError, throttling)
// satisfies outbox.IsUnavailable: the relay pauses publishing and counts no
// attempt. So does a refused SASL login or a TLS/SASL mismatch with the
// listener (kafkasec.ErrAuthentication, kafkasec.ErrSecurityMismatch): the
// Publisher's Config.Transport is to blame, not a row, so the rows wait
// until an operator fixes it. Errors about the row (ErrTooLarge, MessageSizeTooLarge,
// InvalidTopic, UnknownTopicOrPartition, TopicAuthorizationFailed) are not
// wrapped: they count toward RelayConfig.MaxAttempts and park the row.
// Since a record batch is appended all or nothing, a refused record fails
// the whole request it travels in; such a request is sent again one chain
// (one key) at a time, so only the refused row's key fails, and the other
// keys of its partition are published and charged nothing.
//
// # Secured brokers
//
// Config.Transport carries TLS and SASL (PLAIN, SCRAM-SHA-256/512): build it
// with broker/kafkasec (kafkasec.Config.Transport). Every connection of the
// Publisher goes through it: produce requests, the partition lookups
// (metadata) and the topic creation of Config.CreateTopics. The relay's
// principal needs Write and Describe on its topics, plus Create (topic or
// cluster) with CreateTopics; see docs/operations.md, "Secured Kafka".
//
// # Message ID
//
// Every envelope's headers, including the message-id header the outbox sets
// (outbox.Config.MessageIDHeader), become Kafka headers, sorted by name, so a
// republished row carries byte-identical key, value and headers.
// broker/kafkaadapter reads the same header, so an idemq consumer dedups relay
// republishes with no configuration.
package kafkapub
