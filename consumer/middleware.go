package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/otelx"
	"github.com/jackc/pgx/v5"
)

// ProcessFunc takes one delivery to its outcome. d.Message.Identity is
// already filled (scope, message ID, business key). The result and error
// follow Consumer.Handle: a non-nil error means the outcome was not recorded,
// or is not known to be, and the delivery must not be acknowledged.
//
// The innermost ProcessFunc of a Consumer is its core: the dedup claim, the
// handler and the mark, through Config.Store (or a bad-input rejection).
type ProcessFunc func(ctx context.Context, d *Delivery) (dedup.Result, error)

// Middleware wraps a ProcessFunc, Watermill style: it may act before and
// after next, change ctx, or answer without calling next (then nothing is
// recorded unless it records it itself). Every delivery of both drive modes
// (Run and the push entry points) runs through the same chain; the order is
// in the package documentation, "Middleware". A Middleware is called once,
// in New; the ProcessFunc it returns runs concurrently for many deliveries.
type Middleware func(next ProcessFunc) ProcessFunc

// chain builds the Consumer's ProcessFunc, outermost first: tracing,
// recover, logging, metrics, Config.Middleware in order, timeout, core.
func (c *Consumer) chain() ProcessFunc {
	p := ProcessFunc(c.core)
	p = c.timeoutMiddleware(p)
	for i := len(c.cfg.Middleware) - 1; i >= 0; i-- {
		p = c.cfg.Middleware[i](p)
	}
	p = c.metricsMiddleware(p)
	p = c.loggingMiddleware(p)
	p = c.recoverMiddleware(p)
	return c.tracingMiddleware(p)
}

// state is what the core needs of a delivery besides the delivery itself:
// the bad-input cause found by prepare and the crash-loop session of its lane.
type state struct {
	reject error
	sess   *laneSession
}

type stateKey struct{}

// frame is one delivery on its way down the chain, in one allocation: the
// ctx that carries its state (stateKey: what context.WithValue would do,
// without a second allocation) and the delivery the chain is given a
// pointer to.
type frame struct {
	context.Context
	st state
	d  Delivery
}

// Value returns the delivery's state for stateKey, and the parent's value
// for any other key.
func (f *frame) Value(key any) any {
	if _, ok := key.(stateKey); ok {
		return &f.st
	}
	return f.Context.Value(key)
}

// handlerLimitKey carries the timeout middleware's bound to the core.
type handlerLimitKey struct{}

// core is the innermost ProcessFunc: claim, handler, mark (or rejection).
func (c *Consumer) core(ctx context.Context, d *Delivery) (dedup.Result, error) {
	st, _ := ctx.Value(stateKey{}).(*state)
	if st == nil {
		st = &state{}
	}
	msg := d.Message
	limit, _ := ctx.Value(handlerLimitKey{}).(time.Duration)
	switch {
	case st.reject != nil:
		return c.cfg.Store.Reject(ctx, msg, dedup.ReasonBadInput, st.reject)
	case c.cfg.LeaseHandler != nil:
		return c.cfg.Store.ProcessLeased(ctx, msg, boundLease(c.cfg.LeaseHandler, limit), c.cfg.Lease)
	default:
		return c.processTx(ctx, msg, *d, st.sess, boundTx(c.txh, limit))
	}
}

// timeoutMiddleware passes Config.MaxHandlerDuration to the core, which
// gives each handler execution (not the claim or the mark) that deadline.
func (c *Consumer) timeoutMiddleware(next ProcessFunc) ProcessFunc {
	limit := c.cfg.MaxHandlerDuration
	if limit <= 0 {
		return next
	}
	return func(ctx context.Context, d *Delivery) (dedup.Result, error) {
		return next(context.WithValue(ctx, handlerLimitKey{}, limit), d)
	}
}

// boundTx gives each execution of h a deadline of limit (0: h unchanged); a
// handler error after the deadline passed is reported as a timeout
// (errors.Is context.DeadlineExceeded, class "timeout"): a failed attempt.
func boundTx(h dedup.TxHandler[pgx.Tx], limit time.Duration) dedup.TxHandler[pgx.Tx] {
	if limit <= 0 || h == nil {
		return h
	}
	return func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
		hctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		return timeoutErr(ctx, hctx, limit, h(hctx, tx, msg))
	}
}

// boundLease is boundTx for a lease handler.
func boundLease(h dedup.LeaseHandler, limit time.Duration) dedup.LeaseHandler {
	if limit <= 0 || h == nil {
		return h
	}
	return func(ctx context.Context, msg *dedup.Message) error {
		hctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		return timeoutErr(ctx, hctx, limit, h(hctx, msg))
	}
}

func timeoutErr(ctx, hctx context.Context, limit time.Duration, err error) error {
	if err != nil && ctx.Err() == nil && errors.Is(hctx.Err(), context.DeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("handler exceeded MaxHandlerDuration %s: %w (%w)", limit, context.DeadlineExceeded, err)
	}
	return err
}

// recoverMiddleware turns a panic below it (a Config.Middleware, a Metrics
// implementation, the store) into an error wrapping *dedup.PanicError: the
// delivery is not acknowledged, and nothing is counted. Handler panics never
// get here: the store records them as failed attempts (*dedup.PanicError).
func (c *Consumer) recoverMiddleware(next ProcessFunc) ProcessFunc {
	return func(ctx context.Context, d *Delivery) (res dedup.Result, err error) {
		defer func() {
			if v := recover(); v != nil {
				c.log.ErrorContext(ctx, "idemq: panic while processing a delivery; not acknowledged", "source", d.Position,
					"panic", v, "stack", string(debug.Stack()))
				res, err = dedup.Result{}, fmt.Errorf("idemq/consumer: %w", &dedup.PanicError{Value: v})
			}
		}()
		return next(ctx, d)
	}
}

// loggingMiddleware logs each delivery's outcome with the delivery's ctx:
// a warning per retry, conflict, dead letter, fenced delivery or unrecorded
// outcome, a debug line per processed or duplicate delivery.
func (c *Consumer) loggingMiddleware(next ProcessFunc) ProcessFunc {
	return func(ctx context.Context, d *Delivery) (dedup.Result, error) {
		res, err := next(ctx, d)
		msg := d.Message
		if err != nil {
			c.log.WarnContext(ctx, "idemq: outcome not recorded; will be redelivered", "message_id", msg.Identity.MessageID, "source", msg.Source,
				"class", dedup.Classify(err), "handler_called", res.HandlerCalled, "err", err)
			return res, err
		}
		c.logOutcome(ctx, msg, res)
		return res, nil
	}
}

// metricsMiddleware reports each recorded outcome to Config.Metrics (and
// its DurationObserver and ReasonObserver parts), before the delivery is
// acknowledged. Unrecorded outcomes (err != nil) are not counted.
func (c *Consumer) metricsMiddleware(next ProcessFunc) ProcessFunc {
	do, _ := c.cfg.Metrics.(DurationObserver)
	return func(ctx context.Context, d *Delivery) (dedup.Result, error) {
		start := time.Now()
		res, err := next(ctx, d)
		if err != nil {
			return res, err
		}
		if do != nil {
			do.ObserveDuration(c.cfg.Scope, res.Outcome, time.Since(start))
		}
		c.count(d.Message, res)
		return res, nil
	}
}

// tracingMiddleware makes the delivery's span, child of the trace context in
// the message headers; everything below, the handler included, runs in it.
// When the provider's spans cannot record (otelx.Tracing: a no-op provider,
// or the global one with none set) it makes no span: the handler's ctx then
// carries the headers' trace context alone, so that what the handler
// publishes (the outbox) still propagates it.
func (c *Consumer) tracingMiddleware(next ProcessFunc) ProcessFunc {
	return func(ctx context.Context, d *Delivery) (dedup.Result, error) {
		if !c.tracing.On() {
			return next(otelx.Extract(ctx, c.cfg.Propagator, d.Message.Headers), d)
		}
		ctx, span := c.startSpan(ctx, d.Message)
		defer span.End()
		res, err := next(ctx, d)
		endSpan(span, res, err)
		return res, err
	}
}

// logLevel is the level of a recorded outcome's log line.
func logLevel(o dedup.Outcome) slog.Level {
	if o == dedup.OutcomeProcessed || o == dedup.OutcomeDuplicate {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}
