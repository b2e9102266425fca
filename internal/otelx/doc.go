// Package otelx carries OpenTelemetry trace context in message headers (W3C
// Trace Context: traceparent, tracestate), for the consumer and the outbox.
package otelx
