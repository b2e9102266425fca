package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq/internal/otelx"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/cenkalti/backoff/v5"
	"github.com/idemq/idemq/dedup"
)

// Delivery is one message handed over by a broker adapter.
type Delivery struct {
	// Message carries the broker fields; Identity and Attempt are filled by
	// the Consumer.
	Message *dedup.Message
	// MessageID is the message's own ID (Kafka header, RocketMQ property or
	// UNIQ_KEY); "" when absent.
	MessageID string
	// Position is the broker-position identity used when MessageID is empty,
	// e.g. "kafka:payments/2/1041". Required.
	Position string
	// Lane orders deliveries in pull mode: deliveries of one lane (a Kafka
	// topic partition) are handled one at a time in order.
	Lane string
	// Offset orders deliveries within a lane; commits never go backwards.
	Offset int64
	// Ack is adapter data needed to acknowledge (e.g. the kafka.Message).
	Ack any
}

// Source is a pull-mode broker adapter (Kafka). Fetch and Commit are called
// from different goroutines, never Fetch concurrently with itself.
type Source interface {
	// Fetch blocks until a delivery is available or ctx ends.
	Fetch(ctx context.Context) (Delivery, error)
	// Commit acknowledges, for each delivery given, that it and every
	// earlier delivery of its lane are done (Kafka: commit offset+1). It is
	// given at most one delivery per lane, each above the last committed.
	Commit(ctx context.Context, done []Delivery) error
	// Close releases the source; Commit is not called after it.
	Close() error
}

// Consumer runs handlers for deliveries with dedup. Build it with New; it is
// safe for concurrent use.
type Consumer struct {
	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer
	// tracing says whether tracer's spans can record (otelx.Tracing): no
	// span is built when they cannot.
	tracing otelx.Tracing
	guard   *crashGuard // nil: no start markers (crashloop.go)
	// tx is Config.Store as a TxStore, resolved once in New (nil: lease
	// mode only).
	tx TxStore
	// txh is the per-message atomic-mode handler (txHandler: Handler, or
	// BatchHandler one message at a time); nil in lease mode.
	txh txHandlerFunc
	// process is the middleware chain over core (middleware.go).
	process ProcessFunc
	// inFlightSet: Config.CrashLoop.InFlight was given (not defaulted).
	inFlightSet bool
}

// New validates cfg and returns a Consumer. Errors wrap ErrInvalidConfig.
//
// New resolves the store's optional capabilities once: TxStore (atomic and
// batched modes) and StartMarker (crash-loop bounding).
func New(cfg Config) (*Consumer, error) {
	inFlightSet := cfg.CrashLoop.InFlight != 0
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("scope", cfg.Scope)
	tx, _ := cfg.Store.(TxStore)
	c := &Consumer{cfg: cfg, log: log, guard: newCrashGuard(cfg, log), tx: tx, inFlightSet: inFlightSet,
		tracer: cfg.TracerProvider.Tracer("github.com/idemq/idemq/consumer", otelx.TracerOptions()...), tracing: otelx.NewTracing(cfg.TracerProvider)}
	c.txh = txHandler(cfg)
	c.process = c.chain()
	return c, nil
}

// Config returns the consumer's configuration with defaults applied.
func (c *Consumer) Config() Config { return c.cfg }

// Handle takes one delivery to a durable outcome, once: identity, then the
// middleware chain (see the package doc, "Middleware") down to the dedup
// claim, handler and mark. It is the single-attempt path under Run and
// Pusher.Handle, for callers that drive the Consumer themselves; a broker
// listener uses Push instead (per-message-ID serialization, the broker's
// last copy, a Verdict). An OutcomeRetry result means "not acknowledged:
// deliver again later". A non-nil error means the
// outcome could not be recorded, or is not known to be (database down, ctx
// ended, the connection lost or terminated at COMMIT: dedup.ErrOutcomeUnknown):
// do not ack; nothing was counted, and the next copy finds the truth.
//
// In atomic mode a delivery with a Lane runs under the crash-loop guard of
// that lane (Config.CrashLoop, push mode: see the package doc).
func (c *Consumer) Handle(ctx context.Context, d Delivery) (dedup.Result, error) {
	return c.handle(ctx, d, c.guard.pushSession(d.Lane))
}

// handle is Handle within the crash-loop session sess of d's lane (nil:
// none): identity, then the middleware chain (middleware.go) down to the
// core. Run and the push entry points both come here for every delivery.
func (c *Consumer) handle(ctx context.Context, d Delivery, sess *laneSession) (dedup.Result, error) {
	msg, reject, err := c.prepare(d)
	if err != nil {
		return dedup.Result{}, err
	}
	d.Message = msg
	f := &frame{Context: ctx, st: state{reject: reject, sess: sess}, d: d}
	return c.process(f, &f.d)
}

// HandleBatch handles deliveries in one transaction (pgstore.Store.
// ProcessBatch). Bad input is rejected first, on its own. Results follow
// ProcessBatch: in order, stopping at the first OutcomeRetry (later results
// are zero: not attempted, not acked). A non-nil error means nothing of the
// batch is durable.
func (c *Consumer) HandleBatch(ctx context.Context, ds []Delivery) ([]dedup.Result, error) {
	if c.cfg.LeaseHandler != nil {
		return nil, errors.New("idemq/consumer: HandleBatch is not available in lease mode")
	}
	results := make([]dedup.Result, len(ds))
	var msgs []*dedup.Message
	var idx []int
	for i, d := range ds {
		msg, reject, err := c.prepare(d)
		if err != nil {
			return nil, err
		}
		if reject != nil {
			// Rejections commit on their own, before the batch: a bad message
			// is final whatever happens to its neighbours.
			res, err := c.cfg.Store.Reject(ctx, msg, dedup.ReasonBadInput, reject)
			if err != nil {
				return nil, err
			}
			results[i] = res
			continue
		}
		msgs, idx = append(msgs, msg), append(idx, i)
	}
	span := trace.SpanFromContext(context.Background()) // a no-op span: none is made when tracing is off
	if c.tracing.On() {
		ctx, span = c.startBatchSpan(ctx, msgs)
		defer span.End()
	}
	batch, err := c.processBatchTx(ctx, msgs)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "batch not recorded")
		c.log.WarnContext(ctx, "idemq: batch outcome not recorded; will be retried", "deliveries", len(ds), "err", err)
		return nil, err
	}
	for j, r := range batch {
		results[idx[j]] = r
	}
	for i, r := range results {
		if r.Outcome == "" {
			if r.Err != nil {
				// A per-message rerun stopped here: not durable, not acked.
				c.log.WarnContext(ctx, "idemq: outcome not recorded; will be retried", "message_id", ds[i].Message.Identity.MessageID,
					"source", ds[i].Message.Source, "class", dedup.Classify(r.Err), "handler_called", r.HandlerCalled, "err", r.Err)
			}
			break
		}
		c.report(ctx, ds[i].Message, r)
	}
	return results, nil
}

// startBatchSpan starts the batch's span ("process <topic>", or "process"
// when the batch spans topics), linked to the trace context of each message
// that carries one.
func (c *Consumer) startBatchSpan(ctx context.Context, msgs []*dedup.Message) (context.Context, trace.Span) {
	var links []trace.Link
	for _, m := range msgs {
		if sc := trace.SpanContextFromContext(otelx.Extract(context.Background(), c.cfg.Propagator, m.Headers)); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	name, attrs := otelx.BatchProcess(msgs, c.cfg.Scope)
	return c.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...), trace.WithAttributes(attrs...))
}

// startSpan starts the delivery's span as a child of the trace context in
// the message headers: "process <topic>", kind consumer, with the
// OpenTelemetry messaging attributes (otelx.MessageAttrs, ProcessAttrs).
// idemq.business_key is set only when the delivery has one.
func (c *Consumer) startSpan(ctx context.Context, msg *dedup.Message) (context.Context, trace.Span) {
	ctx = otelx.Extract(ctx, c.cfg.Propagator, msg.Headers)
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = otelx.MessageAttrs(attrs, otelx.System(msg.Source), msg.Topic, msg.Partition, msg.Offset, msg.Key, msg.Identity.MessageID)
	attrs = otelx.ProcessAttrs(attrs, c.cfg.Scope)
	if msg.Identity.BusinessKey != "" {
		attrs = append(attrs, attribute.String("idemq.business_key", msg.Identity.BusinessKey))
	}
	attrs = append(attrs, attribute.String("idemq.source", msg.Source))
	return c.tracer.Start(ctx, "process "+msg.Topic, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// endSpan records the outcome on the span; failures and conflicts mark it
// as an error.
func endSpan(span trace.Span, res dedup.Result, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "outcome not recorded")
		return
	}
	span.SetAttributes(attribute.String("idemq.outcome", string(res.Outcome)),
		attribute.String("idemq.matched_by", string(res.MatchedBy)), attribute.Int("idemq.attempts", res.Attempts))
	switch res.Outcome {
	case dedup.OutcomeRetry, dedup.OutcomeDeadLetter, dedup.OutcomeConflict, dedup.OutcomeFenced:
		if res.Err != nil {
			span.RecordError(res.Err)
		}
		span.SetStatus(codes.Error, string(res.Outcome))
	}
}

// prepare fills the message's identity. reject is non-nil when the delivery
// is bad input (the business-key extractor failed).
func (c *Consumer) prepare(d Delivery) (msg *dedup.Message, reject, err error) {
	msg = d.Message
	if msg == nil {
		return nil, nil, errors.New("idemq/consumer: delivery without message")
	}
	if msg.Source == "" {
		msg.Source = d.Position
	}
	if msg.Identity, err = dedup.NewIdentity(c.cfg.Scope, d.MessageID, d.Position, ""); err != nil {
		return nil, nil, fmt.Errorf("idemq/consumer: identity: %w", err)
	}
	if c.cfg.BusinessKey != nil {
		// The extractor may look at the scope and message ID already.
		bk, bkErr := c.extract(msg)
		if bkErr != nil {
			return msg, fmt.Errorf("business key: %w", bkErr), nil
		}
		msg.Identity.BusinessKey = dedup.NormalizeKey(bk)
	}
	return msg, nil, nil
}

func (c *Consumer) extract(msg *dedup.Message) (bk string, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("business key extractor panic: %v", v)
		}
	}()
	return c.cfg.BusinessKey(msg)
}

// report counts and logs a recorded outcome of batched mode, which runs
// outside the per-delivery chain (see the package doc, "Middleware").
// ctx is the batch's (its span, when one is made), so that the log line
// carries its trace.
func (c *Consumer) report(ctx context.Context, msg *dedup.Message, res dedup.Result) {
	c.count(msg, res)
	c.logOutcome(ctx, msg, res)
}

// count reports a recorded outcome of msg to Config.Metrics (and its
// ReasonObserver and MessageObserver parts).
func (c *Consumer) count(msg *dedup.Message, res dedup.Result) {
	c.cfg.Metrics.Delivery(c.cfg.Scope, res.Outcome, res.MatchedBy)
	if ro, ok := c.cfg.Metrics.(ReasonObserver); ok && res.Reason != "" {
		ro.ObserveReason(c.cfg.Scope, res.Outcome, res.Reason)
	}
	if mo, ok := c.cfg.Metrics.(MessageObserver); ok {
		mo.ObserveMessage(c.cfg.Scope, msg, res)
	}
}

// logOutcome logs a recorded outcome: debug for processed and duplicate
// deliveries, warning for the others.
func (c *Consumer) logOutcome(ctx context.Context, msg *dedup.Message, res dedup.Result) {
	level := logLevel(res.Outcome)
	if !c.log.Enabled(ctx, level) {
		return // no log line: skip building its attributes (every delivery passes here)
	}
	attrs := []any{"outcome", res.Outcome, "message_id", msg.Identity.MessageID, "business_key", msg.Identity.BusinessKey,
		"source", msg.Source, "attempts", res.Attempts, "record_status", res.Status}
	switch res.Outcome {
	case dedup.OutcomeProcessed:
		c.log.DebugContext(ctx, "idemq: delivery", attrs...)
	case dedup.OutcomeDuplicate:
		// Duplicates are normal under at-least-once delivery: debug, counted
		// by Metrics.
		c.log.DebugContext(ctx, "idemq: delivery", append(attrs, "matched_by", res.MatchedBy)...)
	default:
		c.log.WarnContext(ctx, "idemq: delivery", append(attrs, "matched_by", res.MatchedBy, "reason", res.Reason, "err", res.Err)...)
	}
}

// HandleInPlace handles d until its outcome may be acknowledged (anything but
// OutcomeRetry), retrying in place with exponential backoff between
// RetryInitial and RetryMax: after a retryable handler failure (each attempt
// is recorded; the store turns the last one into a dead letter) and after an
// infrastructure error (nothing recorded; retried until ctx ends). It returns
// an error only when ctx ends first; the delivery must then not be acked.
func (c *Consumer) HandleInPlace(ctx context.Context, d Delivery) (dedup.Result, error) {
	return c.handleInPlace(ctx, ctx, d, c.guard.pushSession(d.Lane))
}

// handleInPlace runs attempts under work (the handler's context), within the
// crash-loop session sess (nil: none), and stops retrying as soon as ctx
// ends.
func (c *Consumer) handleInPlace(ctx, work context.Context, d Delivery, sess *laneSession) (dedup.Result, error) {
	b := c.newBackoff()
	for {
		res, err := c.handle(work, d, sess)
		if err == nil && res.Outcome.Acked() {
			return res, nil
		}
		if ctx.Err() != nil {
			if err == nil {
				err = ctx.Err()
			}
			return res, err
		}
		if !sleep(ctx, b.NextBackOff()) {
			return res, ctx.Err()
		}
	}
}

// newBackoff is the in-place retry schedule: exponential from RetryInitial
// to RetryMax, doubling, with ±20% jitter.
func (c *Consumer) newBackoff() *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     c.cfg.RetryInitial,
		RandomizationFactor: 0.2,
		Multiplier:          2,
		MaxInterval:         c.cfg.RetryMax,
	}
	b.Reset()
	return b
}

// sleep waits d or until ctx ends; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
