// Package rocketmqpub is an outbox.Publisher for RocketMQ 5.x on
// github.com/apache/rocketmq-client-go/v2 (remoting protocol: point it at the
// NameServer, not the gRPC proxy).
//
// # Sending
//
// Every envelope is sent alone with SendSync (a multi-message SendSync stamps
// no UNIQ_KEY) and counts as published only on SEND_OK. The envelope's
// headers, including the message-id header the outbox sets
// (outbox.Config.MessageIDHeader), become user properties; the row key becomes
// the message Keys (searchable in the console) and the sharding key, and a
// hash queue selector sends every row of one key to one queue, in order.
// Publisher implements outbox.ChainPublisher: the rows of one key are sent
// one after the other, stopping at the first failure, and different keys in
// parallel (Config.Concurrency).
//
// # Identity downstream
//
// An idemq RocketMQ consumer takes the message ID from the message-id
// property when present, else from UNIQ_KEY. A republished row gets a new
// UNIQ_KEY (it is a new send) but the same message-id property, so the
// consumer's dedup absorbs it.
//
// # Client settings
//
// The producer uses a passthrough NameServer resolver (the client's default
// resolver is an HTTP lookup) and its own instance name (clients sharing one
// share one internal client, and closing one breaks the others). Topics must
// exist, or the broker must auto-create them (autoCreateTopicEnable).
//
// Header names that are RocketMQ system property names (KEYS, TAGS,
// UNIQ_KEY, DELAY, …) act as those properties; avoid them. Properties with
// empty values are not sent.
package rocketmqpub
