package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A delivery's span follows the OpenTelemetry messaging semantic
// conventions: named "process <topic>", kind consumer, with
// messaging.system, messaging.operation.type/name, destination, partition,
// offset (Kafka) or keys (RocketMQ), consumer group and message ID; no
// empty business key; the tracer's scope carries a version and the
// semconv schema URL. Both brokers' message shapes, on the real store.
func TestTracingSpanFollowsMessagingConventions(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	withKey := func(m *dedup.Message) (string, error) { return m.Header("bk"), nil }
	c, err := consumer.New(consumer.Config{Scope: "semconv-group", Store: o.store, TracerProvider: tp, BusinessKey: withKey,
		Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		d      consumer.Delivery
		want   map[string]string
		absent []string
	}{
		{"kafka", consumer.Delivery{MessageID: "m-kafka", Position: "kafka:payments/2/1041", Message: &dedup.Message{
			Topic: "payments", Partition: 2, Offset: 1041, Payload: []byte("x"), Source: "kafka:payments/2/1041"}},
			map[string]string{"messaging.system": "kafka", "messaging.operation.type": "process", "messaging.operation.name": "process",
				"messaging.destination.name": "payments", "messaging.destination.partition.id": "2", "messaging.kafka.offset": "1041",
				"messaging.consumer.group.name": "semconv-group", "messaging.message.id": "m-kafka"},
			[]string{"idemq.business_key", "messaging.rocketmq.message.keys"}},
		{"rocketmq", consumer.Delivery{MessageID: "m-rmq", Position: "rocketmq:billing/broker-a/3/17", Message: &dedup.Message{
			Topic: "billing", Partition: 3, Offset: 17, Key: []byte("k1 k2"), Payload: []byte("x"), Source: "rocketmq:billing/broker-a/3/17",
			Headers: map[string]string{"bk": "INV-7"}}},
			map[string]string{"messaging.system": "rocketmq", "messaging.operation.type": "process", "messaging.operation.name": "process",
				"messaging.destination.name": "billing", "messaging.destination.partition.id": "3", "messaging.rocketmq.message.keys": `["k1","k2"]`,
				"messaging.consumer.group.name": "semconv-group", "messaging.message.id": "m-rmq", "idemq.business_key": "INV-7"},
			[]string{"messaging.kafka.offset"}},
	}
	for _, tc := range cases {
		if res, err := c.Handle(e2eCtx(t), tc.d); err != nil || res.Outcome != dedup.OutcomeProcessed {
			t.Fatalf("%s: %+v %v", tc.name, res, err)
		}
		spans := rec.Ended()
		sp := spans[len(spans)-1]
		if sp.Name() != "process "+tc.d.Message.Topic || sp.SpanKind() != trace.SpanKindConsumer {
			t.Fatalf("%s: span %q kind %v", tc.name, sp.Name(), sp.SpanKind())
		}
		attrs := map[string]attribute.Value{}
		for _, a := range sp.Attributes() {
			attrs[string(a.Key)] = a.Value
		}
		for k, v := range tc.want {
			if got, ok := attrs[k]; !ok || got.String() != v {
				t.Errorf("%s: %s = %q (present %v), want %q", tc.name, k, got.String(), ok, v)
			}
		}
		if v, ok := attrs["messaging.kafka.offset"]; ok && v.Type() != attribute.INT64 {
			t.Errorf("%s: messaging.kafka.offset is %v, want an int", tc.name, attrs["messaging.kafka.offset"].Type())
		}
		for _, k := range tc.absent {
			if v, ok := attrs[k]; ok {
				t.Errorf("%s: %s = %q, want absent", tc.name, k, v.String())
			}
		}
		scope := sp.InstrumentationScope()
		if scope.Name != "github.com/idemq/idemq/consumer" || scope.Version == "" || !strings.HasPrefix(scope.SchemaURL, "https://opentelemetry.io/schemas/") {
			t.Errorf("%s: instrumentation scope %+v, want a version and a semconv schema URL", tc.name, scope)
		}
	}
}
