package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/wire"
	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The relay makes one producer span per published row, "send <topic>"
// with messaging.operation.type "send", messaging.system "kafka" and the
// row's message ID, child of the causation context stored with the row
// (the span that was current when Add ran) or a new trace when the row has
// none; the record published to the real Kafka carries the send span's
// trace context, so the consumer's span is the send span's child.
func TestRelaySendSpansFollowCausation(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	topic := newTopic(t, 1)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	pctx, parent := tp.Tracer("test").Start(o.ctx, "handler")
	add := func(ctx context.Context, key string) uuid.UUID {
		var id uuid.UUID
		err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
			var err error
			id, err = o.ob.Add(ctx, tx, outbox.Message{Topic: topic, Key: []byte(key), Payload: []byte("x")})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	caused := add(pctx, "k1")
	parent.End()
	orphan := add(o.ctx, "k2")

	cfg := fastRelay("trace-relay")
	cfg.DisableListen, cfg.DisablePurge, cfg.TracerProvider = true, true, tp
	r, err := outbox.NewRelay(o.ob, obKafkaPub(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r.RunOnce(o.ctx); err != nil || res.Published != 2 {
		t.Fatalf("RunOnce: %+v %v", res, err)
	}
	sends := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range rec.Ended() {
		if sp.SpanKind() == trace.SpanKindProducer {
			attrs := map[string]string{}
			for _, a := range sp.Attributes() {
				attrs[string(a.Key)] = a.Value.String()
			}
			if sp.Name() != "send "+topic || attrs["messaging.operation.type"] != "send" || attrs["messaging.operation.name"] != "send" ||
				attrs["messaging.system"] != "kafka" || attrs["messaging.destination.name"] != topic {
				t.Errorf("send span %q attributes %v", sp.Name(), attrs)
			}
			if sp.Status().Code.String() != "Ok" {
				t.Errorf("send span %s status %v, want Ok", attrs["messaging.message.id"], sp.Status())
			}
			if sp.InstrumentationScope().Name != "github.com/idemq/idemq/outbox" || sp.InstrumentationScope().Version == "" {
				t.Errorf("scope %+v", sp.InstrumentationScope())
			}
			sends[attrs["messaging.message.id"]] = sp
		}
	}
	c, ok := sends[caused.String()]
	if !ok || c.Parent().SpanID() != parent.SpanContext().SpanID() || c.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Fatalf("send span of the caused row: %v (have %d), want the child of %v", c, len(sends), parent.SpanContext())
	}
	n, ok := sends[orphan.String()]
	if !ok || n.Parent().IsValid() || n.SpanContext().TraceID() == parent.SpanContext().TraceID() {
		t.Fatalf("send span of the row without causation: %v, want a new trace", n)
	}
	for _, m := range obReadAll(t, topic, 1)[0] {
		sp := sends[header(m, wire.MessageIDHeader)]
		if sp == nil || !strings.Contains(header(m, "traceparent"), sp.SpanContext().TraceID().String()+"-"+sp.SpanContext().SpanID().String()) {
			t.Errorf("published traceparent %q, want its send span's", header(m, "traceparent"))
		}
	}
}
