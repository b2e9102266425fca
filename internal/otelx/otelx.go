package otelx

import (
	"context"

	"github.com/idemq/idemq/wire"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// fallback is the propagator used while the application has set no global
// one: W3C Trace Context and W3C Baggage.
var fallback propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Propagator returns p when it is not nil, else the global propagator
// (otel.GetTextMapPropagator()) once the application has set one, else W3C
// Trace Context plus W3C Baggage. OpenTelemetry's global propagator is a
// no-op until otel.SetTextMapPropagator is called (it then has no Fields),
// which would silently drop the trace context idemq always carried; the
// choice is made per call, so a propagator set after New is used.
func Propagator(p propagation.TextMapPropagator) propagation.TextMapPropagator {
	if p != nil {
		return p
	}
	if g := otel.GetTextMapPropagator(); len(g.Fields()) > 0 {
		return g
	}
	return fallback
}

// Inject returns headers plus the trace context (and baggage) of ctx, as
// written by p (see Propagator; nil: the default). headers is not
// modified; when ctx holds neither a valid span nor baggage, or headers
// already carry a traceparent, headers is returned as is.
func Inject(ctx context.Context, p propagation.TextMapPropagator, headers map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() && baggage.FromContext(ctx).Len() == 0 {
		return headers
	}
	if _, ok := headers[wire.TraceparentHeader]; ok {
		return headers
	}
	out := make(map[string]string, len(headers)+2)
	for k, v := range headers {
		out[k] = v
	}
	Propagator(p).Inject(ctx, propagation.MapCarrier(out))
	return out
}

// Extract returns ctx with the remote span context (and baggage) that p
// (see Propagator; nil: the default) finds in headers as its parent.
func Extract(ctx context.Context, p propagation.TextMapPropagator, headers map[string]string) context.Context {
	if len(headers) == 0 {
		return ctx
	}
	return Propagator(p).Extract(ctx, propagation.MapCarrier(headers))
}

// Replace returns a copy of headers whose trace context fields (those of
// p: see Propagator) are those of ctx, replacing any already there;
// headers is returned as is when ctx holds no valid span.
func Replace(ctx context.Context, p propagation.TextMapPropagator, headers map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	prop := Propagator(p)
	out := make(map[string]string, len(headers)+2)
	for k, v := range headers {
		out[k] = v
	}
	for _, f := range prop.Fields() {
		delete(out, f)
	}
	prop.Inject(ctx, propagation.MapCarrier(out))
	return out
}
