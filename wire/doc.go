// Package wire is idemq's wire contract: the header and property names that
// producers (the outbox relay and its publishers, `idemq redrive --as-new`,
// any producer of your own) and consumers (the broker adapters) must agree
// on, and the rules a message ID must follow to be deduplicated as given.
//
// It is the one place these names are defined: broker/kafkaadapter,
// broker/rocketmqadapter, outbox, outbox/kafkapub, outbox/rocketmqpub and
// cmd/idemq import it, and a test (internal/archcheck) fails when the
// name appears as a string literal in any other non-test Go file. It imports the
// standard library only, so a producer in another service can depend on it
// without linking a broker client or a database driver.
//
// # Names
//
// On Kafka the names are record headers; on RocketMQ they are user
// properties. Names are case-sensitive on both brokers.
//
//   - [MessageIDHeader] (message-id) carries the message ID the consumer
//     dedups on. The outbox relay writes a row's UUIDv7 there on every
//     publish, so a republish is recognized as a duplicate.
//   - [CausationHeader] (causation-id) carries the dedup identity of the
//     message whose handler wrote an outbox row, for tracing.
//   - [TraceparentHeader] and [TracestateHeader] are the W3C Trace Context
//     headers ("traceparent", "tracestate") that idemq's OpenTelemetry
//     propagation reads on delivery and writes into outbox rows.
//
// # Message IDs
//
// A message ID is any string, used exactly as given: surrounding white space
// is not trimmed, so " m-1" and "m-1" are different IDs. Two rules apply on
// both sides:
//
//   - A blank ID ([IsBlank]: empty, or only white space) is no ID. The
//     consumer falls back to the next source of an ID (RocketMQ: the
//     UNIQ_KEY property) and in the end to the broker position, so
//     blank-ID messages never share an identity.
//   - An ID is stored as given when [CheckMessageID] accepts it: at most
//     [MaxMessageIDBytes] (255) bytes of valid UTF-8, no NUL byte, not
//     starting with [HashedIDPrefix] ("sha256:"). Any other non-blank ID is
//     still deduplicated, by its hashed form "sha256:<64 hex digits>" of
//     its raw bytes, which is what the CLI and the admin API then show and
//     look up. Producers should keep to IDs CheckMessageID accepts; the
//     outbox's UUIDv7 text (36 bytes) always does.
package wire
