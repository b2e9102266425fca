package otelx

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// With no global propagator set, trace context and baggage both travel
// (W3C Trace Context + Baggage); once the application sets a global
// propagator, it is the one used; a configured propagator wins over both.
// Not parallel: it sets the global propagator.
func TestPropagatorGlobalUnlessConfigured(t *testing.T) {
	old := otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTextMapPropagator(old) })

	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	m, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	b, err := baggage.New(m)
	if err != nil {
		t.Fatal(err)
	}
	ctx := baggage.ContextWithBaggage(trace.ContextWithSpanContext(context.Background(), sc), b)

	h := Inject(ctx, nil, nil)
	if h["traceparent"] == "" || h["baggage"] != "tenant=acme" {
		t.Fatalf("default: headers %v, want traceparent and baggage", h)
	}
	back := Extract(context.Background(), nil, h)
	if baggage.FromContext(back).Member("tenant").Value() != "acme" || trace.SpanContextFromContext(back).TraceID() != sc.TraceID() {
		t.Fatalf("default: extracted baggage %v span %v", baggage.FromContext(back), trace.SpanContextFromContext(back))
	}
	if h := Inject(baggage.ContextWithBaggage(context.Background(), b), nil, nil); h["baggage"] != "tenant=acme" {
		t.Fatalf("baggage without a span: %v", h)
	}

	otel.SetTextMapPropagator(propagation.Baggage{}) // the application's choice: baggage only
	if h := Inject(ctx, nil, nil); h["traceparent"] != "" || h["baggage"] != "tenant=acme" {
		t.Fatalf("global set: headers %v, want the global propagator's (baggage only)", h)
	}
	if h := Inject(ctx, propagation.TraceContext{}, nil); h["traceparent"] == "" || h["baggage"] != "" {
		t.Fatalf("configured: headers %v, want the configured propagator's (trace context only)", h)
	}
	r := Replace(ctx, propagation.TraceContext{}, map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "x=y"})
	if r["traceparent"] != "00-01000000000000000000000000000000-0200000000000000-01" || r["tracestate"] != "" {
		t.Fatalf("Replace: %v", r)
	}
}
