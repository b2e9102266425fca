package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A delivery's span continues the trace of the message's traceparent header,
// the handler's ctx carries it, and outbox rows written by the handler carry
// it on to the next hop.
func TestTracingAcrossDeliveryAndOutbox(t *testing.T) {
	t.Parallel()
	o := setupOutbox(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var handlerTrace trace.TraceID
	c, err := consumer.New(consumer.Config{Scope: "traced", Store: o.store, TracerProvider: tp,
		Handler: func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
			handlerTrace = trace.SpanContextFromContext(ctx).TraceID()
			_, err := o.ob.Add(ctx, tx, outbox.Message{Topic: "next", Key: []byte("k"), Payload: []byte("x")})
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	d := consumer.Delivery{MessageID: "m-trace", Position: "test:0", Message: &dedup.Message{Topic: "orders", Payload: []byte("x"),
		Headers: map[string]string{"traceparent": parent}}}
	res, err := c.Handle(e2eCtx(t), d)
	if err != nil || res.Outcome != dedup.OutcomeProcessed {
		t.Fatalf("%+v %v", res, err)
	}
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("spans = %d, want 1", len(spans))
	}
	sp := spans[0]
	if sp.Name() != "process orders" || sp.Parent().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || sp.SpanKind() != trace.SpanKindConsumer {
		t.Fatalf("span %q parent %v kind %v", sp.Name(), sp.Parent().TraceID(), sp.SpanKind())
	}
	attrs := map[string]string{}
	for _, a := range sp.Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	if attrs["idemq.outcome"] != "processed" || attrs["messaging.message.id"] != "m-trace" || attrs["messaging.consumer.group.name"] != "traced" {
		t.Fatalf("attributes = %v", attrs)
	}
	if handlerTrace != sp.SpanContext().TraceID() {
		t.Fatalf("handler ctx trace %v, want %v", handlerTrace, sp.SpanContext().TraceID())
	}
	rows := o.outboxRows(t)
	if len(rows) != 1 || !strings.Contains(rows[0].Headers["traceparent"], "0af7651916cd43dd8448eb211c80319c-"+sp.SpanContext().SpanID().String()) {
		t.Fatalf("outbox row headers = %v, want the delivery span's traceparent", rows)
	}
}

func e2eCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}
