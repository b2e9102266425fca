// Package lease is the lease engine: the part of lease mode that does not
// depend on the store. dedup/pgstore and dedup/redisstore claim a lease in
// their own storage and then hand the execution to Run, which runs the
// handler under heartbeats and records the outcome through the store's
// Marks. It is internal: stores outside this module implement
// pgstore.Store.ProcessLeased themselves and are checked by dedup/storetest.
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/leasectx"
	"github.com/idemq/idemq/internal/leasewatch"
)

// Marks is the storage side of one claimed lease-mode execution, what
// Run calls to keep the lease and to record the outcome. Every call is
// a compare-and-set on the lease's owner token and fence: fenced (or held
// false) means another owner holds the record now. A call may reach the
// store twice (a client resends it when its answer was lost): a second run
// with the same owner token and fence must answer as the first did. Store
// implements it on Postgres; dedup/redisstore on Redis.
type Marks interface {
	// Renew extends the lease by its TTL; held is false when another owner
	// holds the record.
	Renew(ctx context.Context) (held bool, err error)
	// Succeed marks the record SUCCEEDED.
	Succeed(ctx context.Context) (fenced bool, err error)
	// Fail marks the record status (StatusFailedRetryable, or
	// StatusFailedFinal with a dead letter for reason) with the handler's
	// error, and returns the dead letter's ID (0 when none).
	Fail(ctx context.Context, status dedup.Status, reason string, herr error) (deadLetterID int64, fenced bool, err error)
	// Release gives the lease back without counting the attempt (the
	// handler was interrupted by a shutdown); ErrFenced when another owner
	// holds the record.
	Release(ctx context.Context) error
}

// Params is one claimed execution for Run.
type Params struct {
	// Message is the delivery; Run sets its Attempt to Lease.Attempt.
	Message *dedup.Message
	// Lease is the freshly claimed lease.
	Lease dedup.Lease
	// Handler is the user's lease-mode handler.
	Handler dedup.LeaseHandler
	// Options are the lease TTL and heartbeat (defaults applied by Run).
	Options dedup.LeaseOptions
	// MaxAttempts is the store's attempt limit: a failure at this attempt
	// is final (dead letter).
	MaxAttempts int
	// Marks record the outcome in the store.
	Marks Marks
	// Logger receives renewal warnings; nil discards them.
	Logger *slog.Logger
}

// wrapUnknown wraps err with ErrOutcomeUnknown when dedup.Classify says its
// outcome is unknown and it does not already.
func wrapUnknown(err error) error {
	if dedup.Classify(err) == dedup.FailureOutcomeUnknown && !errors.Is(err, dedup.ErrOutcomeUnknown) {
		return fmt.Errorf("%w: %w", dedup.ErrOutcomeUnknown, err)
	}
	return err
}

// Run runs p.Handler for p.Message under the freshly claimed lease p.Lease
// and records the outcome through p.Marks; it is the part of lease mode that does not depend
// on the store. msg.Attempt is set to l.Attempt and h's context carries l
// (LeaseFromContext). While h runs, marks.Renew is called every
// opt.Heartbeat: a renewal that finds another owner cancels h's context
// with ErrFenced, and no successful renewal for 90% of opt.TTL cancels it
// with ErrLeaseExpired, by the lease's clock: a renewal call that hangs (a
// store not answering, a client retrying) is not waited for. Then:
//
//   - fenced during the run: OutcomeFenced (do not ack);
//   - h returned nil: marks.Succeed, OutcomeProcessed (or OutcomeFenced);
//   - h failed because ctx ended (a shutdown): marks.Release and an error
//     (do not ack; the attempt is not counted);
//   - h failed: marks.Fail with StatusFailedFinal and a dead letter when the
//     error is Permanent (ReasonPermanentError) or l.Attempt reached
//     maxAttempts (ReasonAttemptsExhausted), else StatusFailedRetryable
//     (OutcomeRetry).
//
// A panic in h is an error (*PanicError). Marks are made even after ctx
// ended. A non-nil error means the outcome was not recorded, or not known to
// be (a mark whose connection was lost: it wraps ErrOutcomeUnknown): do not
// ack. The Result returned with it has HandlerCalled and Attempts set.
func Run(ctx context.Context, p Params) (dedup.Result, error) {
	msg, l, h, opt, maxAttempts, marks, log := p.Message, p.Lease, p.Handler, p.Options, p.MaxAttempts, p.Marks, p.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opt = opt.WithDefaults()
	msg.Attempt = l.Attempt
	hctx, cancel := context.WithCancelCause(leasectx.With(ctx, l))
	stop := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		warn := func(err error) {
			log.WarnContext(ctx, "idemq: lease renewal failed", "identity", l.Identity.String(), "err", err)
		}
		switch leasewatch.Keep(hctx, opt.TTL, opt.Heartbeat, stop, marks.Renew, warn) {
		case leasewatch.Fenced:
			cancel(dedup.ErrFenced)
		case leasewatch.Expired:
			cancel(dedup.ErrLeaseExpired)
		}
	}()
	herr := runLeased(hctx, msg, h)
	close(stop)
	<-watchDone
	fenced := errors.Is(context.Cause(hctx), dedup.ErrFenced)
	cancel(nil)

	res := dedup.Result{HandlerCalled: true, Attempts: l.Attempt}
	fence := func() (dedup.Result, error) {
		res.Outcome, res.Err, res.Status = dedup.OutcomeFenced, dedup.ErrFenced, dedup.StatusProcessing
		return res, nil
	}
	if fenced {
		return fence()
	}
	mctx := context.WithoutCancel(ctx) // the mark must land even during shutdown
	if herr == nil {
		lost, err := marks.Succeed(mctx)
		if err != nil {
			// Not recorded, or not known to be: not acked, not counted; the
			// handler ran all the same.
			return res, wrapUnknown(fmt.Errorf("idemq: lease complete %s: %w", l.Identity, err))
		}
		if lost {
			return fence()
		}
		res.Outcome, res.Status = dedup.OutcomeProcessed, dedup.StatusSucceeded
		return res, nil
	}
	if ctx.Err() != nil {
		// A shutdown is not the message's fault: give the lease back without
		// counting the attempt, and do not ack.
		if rerr := marks.Release(mctx); rerr != nil {
			log.WarnContext(ctx, "idemq: release lease", "identity", l.Identity.String(), "err", rerr)
		}
		return res, fmt.Errorf("%w: handler interrupted: %w", dedup.ErrOutcomeUnknown, errors.Join(ctx.Err(), herr))
	}
	status, reason := dedup.StatusFailedRetryable, ""
	switch {
	case dedup.IsPermanent(herr):
		status, reason = dedup.StatusFailedFinal, dedup.ReasonPermanentError
	case l.Attempt >= maxAttempts:
		status, reason = dedup.StatusFailedFinal, dedup.ReasonAttemptsExhausted
	}
	dlID, lost, err := marks.Fail(mctx, status, reason, herr)
	if err != nil {
		return res, wrapUnknown(fmt.Errorf("idemq: lease mark %s %s: %w", status, l.Identity, err))
	}
	if lost {
		return fence()
	}
	res.Err, res.Status, res.Outcome, res.DeadLetterID = herr, status, dedup.OutcomeRetry, dlID
	if status == dedup.StatusFailedFinal {
		res.Outcome, res.Reason = dedup.OutcomeDeadLetter, reason
	}
	return res, nil
}

func runLeased(ctx context.Context, msg *dedup.Message, h dedup.LeaseHandler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &dedup.PanicError{Value: v}
		}
	}()
	return h(ctx, msg)
}
