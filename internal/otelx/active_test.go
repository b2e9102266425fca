package otelx

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// recordingProvider stands in for an SDK provider.
type recordingProvider struct{ embedded.TracerProvider }

func (recordingProvider) Tracer(string, ...trace.TracerOption) trace.Tracer {
	return noop.NewTracerProvider().Tracer("")
}

func TestTracingNoop(t *testing.T) {
	for _, tp := range []trace.TracerProvider{nil, noop.NewTracerProvider(), &noop.TracerProvider{}} {
		if NewTracing(tp).On() {
			t.Errorf("%T: tracing on; want off", tp)
		}
	}
	if !NewTracing(recordingProvider{}).On() {
		t.Error("a provider of the application's own: tracing off; want on")
	}
}

// TestTracingGlobal: the global provider is off while no provider is set
// and on once the application sets one, for a Tracing made before.
func TestTracingGlobal(t *testing.T) {
	tp := otel.GetTracerProvider()
	tr := NewTracing(tp)
	if !tr.global {
		t.Fatalf("otel.GetTracerProvider() is a %T, not the placeholder %s: update globalPlaceholder", tp, globalPlaceholder)
	}
	if tr.On() {
		t.Fatal("global provider with none set: tracing on; want off")
	}
	_, span := tp.Tracer("t").Start(context.Background(), "s")
	if span.IsRecording() {
		t.Fatal("the placeholder recorded a span")
	}
	otel.SetTracerProvider(recordingProvider{})
	if !tr.On() {
		t.Fatal("global provider after otel.SetTracerProvider: tracing off; want on")
	}
}
