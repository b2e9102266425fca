package otelx

import (
	"runtime/debug"
	"strconv"
	"strings"
	"sync"

	"github.com/idemq/idemq/dedup"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// modulePath is the Go module whose version the tracers' instrumentation
// scope carries.
const modulePath = "github.com/idemq/idemq"

// develVersion is the version reported when the build carries none (go
// test, go run inside the module, a replace directive).
const develVersion = "(devel)"

var moduleVersion = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return develVersion
	}
	return versionOf(bi)
})

// versionOf returns the version of modulePath in bi: the main module's when
// idemq is built itself, the dependency's otherwise, develVersion when
// neither says.
func versionOf(bi *debug.BuildInfo) string {
	if bi.Main.Path == modulePath && bi.Main.Version != "" {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path != modulePath {
			continue
		}
		if d.Replace != nil && d.Replace.Version != "" {
			return d.Replace.Version
		}
		if d.Version != "" {
			return d.Version
		}
	}
	return develVersion
}

// ModuleVersion is the version of the idemq module in this binary, read
// once from the build info (runtime/debug.ReadBuildInfo), e.g. "v0.12.0",
// or "(devel)" when the build does not record one.
func ModuleVersion() string { return moduleVersion() }

// TracerOptions are the options of every idemq tracer: the module version
// as the instrumentation version, and the schema URL of the semantic
// conventions whose keys the spans use (semconv v1.43.0).
func TracerOptions() []trace.TracerOption {
	return []trace.TracerOption{trace.WithInstrumentationVersion(ModuleVersion()), trace.WithSchemaURL(semconv.SchemaURL)}
}

// Messaging systems as named by a message's Source prefix ("kafka:…",
// "rocketmq:…"), set by the broker adapters.
const (
	systemKafka    = "kafka"
	systemRocketMQ = "rocketmq"
)

// System returns the messaging system of a message whose Source is source
// ("kafka" or "rocketmq"), or "" when the prefix names neither.
func System(source string) string {
	sys, _, ok := strings.Cut(source, ":")
	if !ok {
		return ""
	}
	switch sys {
	case systemKafka, systemRocketMQ:
		return sys
	}
	return ""
}

// MessageAttrs are the OpenTelemetry messaging attributes of one message
// of destination topic: messaging.system (when system is known),
// messaging.destination.name, messaging.destination.partition.id (the
// Kafka partition or RocketMQ queue ID; omitted, with the offset, when
// partition is negative: not known yet), messaging.kafka.offset (Kafka) or
// messaging.rocketmq.message.keys (RocketMQ, when key is not empty), and
// messaging.message.id (when not empty). attrs are appended to.
func MessageAttrs(attrs []attribute.KeyValue, system, topic string, partition int, offset int64, key []byte, messageID string) []attribute.KeyValue {
	switch system {
	case systemKafka:
		attrs = append(attrs, semconv.MessagingSystemKafka)
	case systemRocketMQ:
		attrs = append(attrs, semconv.MessagingSystemRocketMQ)
	}
	attrs = append(attrs, semconv.MessagingDestinationName(topic))
	if partition >= 0 {
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(partition)))
	}
	switch system {
	case systemKafka:
		if partition >= 0 {
			attrs = append(attrs, semconv.MessagingKafkaOffset(int(offset)))
		}
	case systemRocketMQ:
		if len(key) > 0 {
			attrs = append(attrs, semconv.MessagingRocketMQMessageKeys(strings.Fields(string(key))...))
		}
	}
	if messageID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(messageID))
	}
	return attrs
}

// ProcessAttrs are the attributes of a consumer's "process <topic>" span
// besides MessageAttrs: messaging.operation.type "process",
// messaging.operation.name "process" and messaging.consumer.group.name.
func ProcessAttrs(attrs []attribute.KeyValue, group string) []attribute.KeyValue {
	return append(attrs, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
		semconv.MessagingConsumerGroupName(group))
}

// SendAttrs are the attributes of a producer's "send <topic>" span besides
// MessageAttrs: messaging.operation.type "send" and
// messaging.operation.name "send".
func SendAttrs(attrs []attribute.KeyValue) []attribute.KeyValue {
	return append(attrs, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"))
}

// BatchProcess returns the name and attributes of the span of a batch of
// msgs consumed by group: "process <topic>" with
// messaging.destination.name when all msgs share a topic, "process"
// otherwise; messaging.system when all share one; ProcessAttrs and
// messaging.batch.message_count.
func BatchProcess(msgs []*dedup.Message, group string) (string, []attribute.KeyValue) {
	attrs := make([]attribute.KeyValue, 0, 6)
	name := "process"
	if len(msgs) > 0 {
		topic, system := msgs[0].Topic, System(msgs[0].Source)
		for _, m := range msgs[1:] {
			if m.Topic != topic {
				topic = ""
			}
			if System(m.Source) != system {
				system = ""
			}
		}
		switch system {
		case systemKafka:
			attrs = append(attrs, semconv.MessagingSystemKafka)
		case systemRocketMQ:
			attrs = append(attrs, semconv.MessagingSystemRocketMQ)
		}
		if topic != "" {
			name += " " + topic
			attrs = append(attrs, semconv.MessagingDestinationName(topic))
		}
	}
	attrs = ProcessAttrs(attrs, group)
	return name, append(attrs, semconv.MessagingBatchMessageCount(len(msgs)))
}
