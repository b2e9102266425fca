package consumer

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TestNoTracerKeepsTraceContext: with a provider whose spans cannot record,
// the runtime builds no span, yet the handler's ctx still carries the trace
// context of the message's traceparent header, so that what the handler
// publishes through the outbox continues the trace.
func TestNoTracerKeepsTraceContext(t *testing.T) {
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	var got trace.SpanContext
	c, err := New(Config{Scope: "trace-off", Store: f0Store{fp: fp}, CrashLoop: CrashLoopConfig{Off: true},
		TracerProvider: noop.NewTracerProvider(),
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: func(ctx context.Context, _ pgx.Tx, _ *dedup.Message) error {
			got = trace.SpanContextFromContext(ctx)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if c.tracing.On() {
		t.Fatal("tracing on with a no-op provider")
	}
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	msg := &dedup.Message{Topic: "orders", Payload: []byte("x"), Headers: map[string]string{"traceparent": parent}}
	if _, err := c.Handle(context.Background(), Delivery{Message: msg, MessageID: "m-1", Position: "orders/0/1"}); err != nil {
		t.Fatal(err)
	}
	if got.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || got.SpanID().String() != "b7ad6b7169203331" {
		t.Fatalf("handler's trace context %v; want the header's", got)
	}
}
