package otelx

import (
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing says whether the spans of a TracerProvider can be recorded, so
// that a caller skips building a span (its name, attributes, links: five to
// eight allocations per delivery) when none would be. The zero value is on.
type Tracing struct {
	tp trace.TracerProvider
	// off: tp is a no-op provider (noop.TracerProvider, nil).
	off bool
	// global: tp is OpenTelemetry's global placeholder provider, which
	// forwards to the provider given to otel.SetTracerProvider once one is
	// given, and makes non-recording spans until then.
	global bool
}

// globalPlaceholder is the type name of the provider otel.GetTracerProvider
// returns while no provider was set (go.opentelemetry.io/otel/internal/
// global); TestTracingGlobal fails if a new otel release renames it.
const globalPlaceholder = "*global.tracerProvider"

// NewTracing inspects tp once: a nil provider and noop.TracerProvider are
// off for good; the global placeholder is on from the moment the
// application calls otel.SetTracerProvider; any other provider is on.
// (The global placeholder's eBPF auto-instrumentation hook, which records
// spans without a provider set, is not seen: set a provider to trace.)
func NewTracing(tp trace.TracerProvider) Tracing {
	switch tp.(type) {
	case nil, noop.TracerProvider, *noop.TracerProvider:
		return Tracing{tp: tp, off: true}
	}
	return Tracing{tp: tp, global: fmt.Sprintf("%T", tp) == globalPlaceholder}
}

// On reports whether spans started from the provider may be recorded: one
// atomic load for the global placeholder, nothing otherwise; no allocation.
func (t Tracing) On() bool {
	switch {
	case t.off:
		return false
	case t.global:
		// Once a provider is set, the global one is that provider, never
		// the placeholder again.
		return otel.GetTracerProvider() != t.tp
	}
	return true
}
