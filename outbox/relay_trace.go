package outbox

import (
	"context"

	"github.com/idemq/idemq/internal/otelx"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// MessagingSystem is implemented by a Publisher that names its messaging
// system for the relay's producer spans (messaging.system): kafkapub says
// "kafka", rocketmqpub "rocketmq". A Publisher without it gets spans
// without messaging.system.
type MessagingSystem interface {
	// MessagingSystem returns the OpenTelemetry messaging.system value,
	// e.g. "kafka".
	MessagingSystem() string
}

// sendSpans are the producer spans of one batch's rows, by row sequence.
type sendSpans map[int64]trace.Span

// startSendSpans starts one producer span per row of chains ("send
// <topic>", kind producer, RelayConfig.TracerProvider), child of the trace
// context stored in the row's headers (the causation context Add took from
// its ctx) when there is one, a new trace otherwise; and replaces the row's
// trace context headers with the span's, so that the consumer's process
// span is the send span's child. It returns nil (and changes nothing) when
// the provider's spans cannot record.
func (r *Relay) startSendSpans(ctx context.Context, chains [][]item) sendSpans {
	if !r.tracing.On() {
		return nil
	}
	system := ""
	if ms, ok := r.pub.(MessagingSystem); ok {
		system = ms.MessagingSystem()
	}
	spans := make(sendSpans)
	for _, c := range chains {
		for j := range c {
			env := &c[j].env
			attrs := make([]attribute.KeyValue, 0, 8)
			attrs = otelx.MessageAttrs(attrs, system, env.Topic, -1, 0, nil, env.ID.String())
			attrs = otelx.SendAttrs(attrs)
			sctx, span := r.tracer.Start(otelx.Extract(ctx, r.ob.cfg.Propagator, env.Headers), "send "+env.Topic,
				trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
			env.Headers = otelx.Replace(sctx, r.ob.cfg.Propagator, env.Headers)
			spans[c[j].seq] = span
		}
	}
	return spans
}

// end ends the spans: published rows OK, failed rows with their error;
// rows in neither (a shutdown) end without a status.
func (s sendSpans) end(published []item, failed []failure) {
	if s == nil {
		return
	}
	for _, it := range published {
		if sp := s[it.seq]; sp != nil {
			sp.SetStatus(codes.Ok, "")
		}
	}
	for _, f := range failed {
		if sp := s[f.seq]; sp != nil {
			sp.RecordError(f.err)
			sp.SetStatus(codes.Error, "publish failed")
		}
	}
	for _, sp := range s {
		sp.End()
	}
}
