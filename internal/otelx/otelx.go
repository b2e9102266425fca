package otelx

import (
	"context"

	"github.com/idemq/idemq/wire"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

var propagator = propagation.TraceContext{}

// Inject returns headers plus the traceparent (and tracestate) of the span
// in ctx. headers is not modified; when ctx holds no valid span, or headers
// already carry a traceparent, headers is returned as is.
func Inject(ctx context.Context, headers map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	if _, ok := headers[wire.TraceparentHeader]; ok {
		return headers
	}
	out := make(map[string]string, len(headers)+2)
	for k, v := range headers {
		out[k] = v
	}
	propagator.Inject(ctx, propagation.MapCarrier(out))
	return out
}

// Extract returns ctx with the remote span context found in headers (if any)
// as its parent.
func Extract(ctx context.Context, headers map[string]string) context.Context {
	if len(headers) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier(headers))
}

// Replace returns a copy of headers whose trace context headers are those
// of the span in ctx, replacing any already there; headers is returned as
// is when ctx holds no valid span.
func Replace(ctx context.Context, headers map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	out := make(map[string]string, len(headers)+2)
	for k, v := range headers {
		out[k] = v
	}
	delete(out, wire.TraceparentHeader)
	delete(out, "tracestate")
	propagator.Inject(ctx, propagation.MapCarrier(out))
	return out
}
