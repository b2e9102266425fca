package otelx

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/wire"
)

func TestInjectExtractRoundTrip(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	in := map[string]string{wire.MessageIDHeader: "m-1"}
	out := Inject(ctx, nil, in)
	if _, ok := in["traceparent"]; ok {
		t.Fatal("Inject modified its input")
	}
	if out["traceparent"] == "" || out[wire.MessageIDHeader] != "m-1" {
		t.Fatalf("headers = %v", out)
	}
	got := trace.SpanContextFromContext(Extract(context.Background(), nil, out))
	if got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || !got.IsRemote() {
		t.Fatalf("extracted %v, want %v", got, sc)
	}
	if h := Inject(context.Background(), nil, in); len(h) != 1 {
		t.Fatalf("no span: headers changed to %v", h)
	}
}
