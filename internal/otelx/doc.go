// Package otelx carries OpenTelemetry trace context in message headers (W3C
// Trace Context: traceparent, tracestate), for the consumer and the outbox,
// and builds the span names and attributes of the messaging semantic
// conventions (semconv v1.43.0) and the tracers' instrumentation scope
// options (the module version from the build info).
package otelx
