package integration

import (
	"context"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/baggage"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// W3C baggage in a delivery's headers reaches the handler's ctx and goes on
// with the rows the handler writes to the outbox, with and without a
// recording tracer, under the default propagator (no global one set: W3C
// Trace Context plus Baggage).
func TestTracingBaggagePropagates(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	for name, provider := range map[string]trace.TracerProvider{"recording": tp, "noop": noop.NewTracerProvider()} {
		o := setupOutbox(t)
		var got string
		c, err := consumer.New(consumer.Config{Scope: "baggage-" + name, Store: o.store, TracerProvider: provider,
			Handler: func(ctx context.Context, tx pgx.Tx, _ *dedup.Message) error {
				got = baggage.FromContext(ctx).Member("tenant").Value()
				_, err := o.ob.Add(ctx, tx, outbox.Message{Topic: "next", Key: []byte("k"), Payload: []byte("x")})
				return err
			}})
		if err != nil {
			t.Fatal(err)
		}
		d := consumer.Delivery{MessageID: "m-bag", Position: "test:0", Message: &dedup.Message{Topic: "orders", Payload: []byte("x"),
			Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "baggage": "tenant=acme"}}}
		if res, err := c.Handle(e2eCtx(t), d); err != nil || res.Outcome != dedup.OutcomeProcessed {
			t.Fatalf("%s: %+v %v", name, res, err)
		}
		if got != "acme" {
			t.Errorf("%s: handler's baggage tenant = %q, want acme", name, got)
		}
		if rows := o.outboxRows(t); len(rows) != 1 || rows[0].Headers["baggage"] != "tenant=acme" {
			t.Errorf("%s: outbox rows %v, want the baggage header", name, rows)
		}
	}
}
