package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/internal/leasewatch"
	"github.com/jackc/pgx/v5"
)

// Lease mode is for handlers whose side effects cannot join
// the Postgres transaction: an HTTP call to a payment provider, an e-mail.
// The claim commits PROCESSING with an owner token, a fence and a deadline
// (lease_until, in database time); a heartbeat extends it; completion and
// failure are conditional on the owner token and fence. A copy that finds a
// live lease is not acked (OutcomeRetry); a copy that finds an expired lease
// takes over, bumping the fence and rotating the token, after which the
// stale owner's completion fails with ErrFenced (OutcomeFenced, not acked).

// Lease is the claim one handler execution holds in lease mode. Handlers get
// it from LeaseFromContext and pass Identity and Fence downstream as the
// idempotency key, so a provider can refuse a stale owner.
type Lease struct {
	// Identity is the delivery's dedup identity.
	Identity Identity
	// Record is the identity of the consumption record the lease holds: the
	// delivery's own, or, when the delivery matched an earlier record by
	// business key (a producer re-send under a new message ID), that
	// record's, whose message ID is the first one seen.
	Record Identity
	// OwnerToken is a fresh UUID per claim or takeover.
	OwnerToken uuid.UUID
	// Fence grows by one at every claim or takeover of the record: 1 for the
	// first owner.
	Fence int64
	// Attempt is the record's attempts count for this execution.
	Attempt int
}

// IdempotencyKey is the key to send to a downstream system with the side
// effect: the string form of Record (Identity when Record is unset). It is
// stable across takeovers, including a takeover by a re-send under a new
// message ID with the same business key, and the fence is not part of it,
// so a takeover repeats the very same downstream request.
func (l Lease) IdempotencyKey() string {
	if l.Record.Scope == "" {
		return l.Identity.String()
	}
	return l.Record.String()
}

type leaseCtxKey struct{}

// ContextWithLease returns ctx carrying l, for LeaseFromContext. Stores
// other than Store (redisstore) use it to hand their lease to the handler.
func ContextWithLease(ctx context.Context, l Lease) context.Context {
	return context.WithValue(ctx, leaseCtxKey{}, l)
}

// LeaseFromContext returns the lease of the running lease-mode handler.
func LeaseFromContext(ctx context.Context) (Lease, bool) {
	l, ok := ctx.Value(leaseCtxKey{}).(Lease)
	return l, ok
}

// LeaseHandler is a lease-mode handler. It runs outside any transaction;
// ctx carries its Lease and is canceled with cause ErrFenced when a heartbeat
// finds the lease taken over, or ErrLeaseExpired when it could not be renewed
// for 90% of the TTL. Return values mean what they mean for Handler.
type LeaseHandler func(ctx context.Context, msg *Message) error

// LeaseOptions configure lease mode.
type LeaseOptions struct {
	// TTL is how long a claim or heartbeat keeps the lease, in database time.
	// Default 30s; at least 1s. It must fit under the broker's own
	// redelivery timer (see ValidateUnder).
	TTL time.Duration
	// Heartbeat is how often the lease is extended while the handler runs.
	// Default TTL/3; negative disables heartbeats (the lease then lasts TTL).
	Heartbeat time.Duration
}

// WithDefaults returns o with its zero fields set to their defaults: TTL
// 30s, Heartbeat TTL/3.
func (o LeaseOptions) WithDefaults() LeaseOptions {
	if o.TTL == 0 {
		o.TTL = 30 * time.Second
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = o.TTL / 3
	}
	return o
}

// ValidateUnder refuses a lease TTL that does not fit under the broker's
// redelivery timer (RocketMQ ConsumeTimeout, Kafka session timeout): the
// broker would hand the message to another consumer while the lease still
// blocks it. The error names both numbers and wraps ErrInvalidConfig.
func (o LeaseOptions) ValidateUnder(brokerTimer time.Duration) error {
	ttl := o.WithDefaults().TTL
	if ttl < time.Second {
		return fmt.Errorf("%w: lease TTL %s must be at least 1s", ErrInvalidConfig, ttl)
	}
	if brokerTimer > 0 && ttl >= brokerTimer {
		return fmt.Errorf("%w: lease TTL %s must be shorter than the broker's redelivery timer %s", ErrInvalidConfig, ttl, brokerTimer)
	}
	return nil
}

// ErrFenced is returned (as Result.Err of OutcomeFenced) when a lease-mode
// completion or failure mark finds the record taken over by another owner.
// The delivery must not be acked.
var ErrFenced = errors.New("idemq: fenced: the lease was taken over by another owner")

// ErrLeaseExpired is the cause with which a lease-mode handler's context is
// canceled when its lease could not be renewed for about a TTL (the database
// unreachable): another copy may take over at any moment, so a handler that
// honours ctx stops its side effect. Its completion is still checked against
// the owner token and fence.
var ErrLeaseExpired = errors.New("idemq: lease expired without renewal")

// ErrLeaseHeld is Result.Err of OutcomeRetry when another owner holds a live
// lease on the record.
var ErrLeaseHeld = errors.New("idemq: a live lease is held by another owner")

// ProcessLeased runs h for msg in lease mode (see the Lease type). Results
// and errors mean what they mean for Process, plus OutcomeFenced.
//
// A copy that finds an expired lease takes over and counts an attempt, unless
// the dead owner held the last one (attempts = Config.MaxAttempts): the
// record then becomes FAILED_FINAL with a dead letter (ReasonAttemptsExhausted,
// Result.Err wrapping ErrExecutionLost), the handler does not run and the
// delivery is acked, so a message that kills every owner starts at most
// MaxAttempts executions. The Redis-only store applies the same rule. Such a
// claim, sent again because its answer was lost, answers the same dead
// letter (the record keeps the claim's owner token).
func (s *Store) ProcessLeased(ctx context.Context, msg *Message, h LeaseHandler, opt LeaseOptions) (Result, error) {
	if msg == nil || h == nil {
		return Result{}, errors.New("idemq: ProcessLeased: nil message or handler")
	}
	opt = opt.WithDefaults()
	if err := opt.ValidateUnder(0); err != nil {
		return Result{}, err
	}
	sum, keyID, err := s.fp.Sum(msg.Payload)
	if err != nil {
		return s.Reject(ctx, msg, ReasonBadInput, err)
	}
	if res, hit := s.fastLookup(ctx, msg); hit {
		return res, nil
	}
	lease, rowID, res, err := s.claimLeaseRetrying(ctx, msg, sum, keyID, opt.TTL)
	if err != nil || rowID == 0 {
		return res, err
	}
	marks := &pgLease{s: s, rowID: rowID, lease: lease, msg: msg, sum: sum, ttl: opt.TTL}
	res, err = RunLease(ctx, msg, lease, h, opt, s.cfg.MaxAttempts, marks, s.cfg.Logger)
	if err == nil && res.Outcome == OutcomeProcessed {
		s.fastRemember(ctx, msg.Identity, sum, keyID)
	}
	return res, err
}

// LeaseMarks is the storage side of one claimed lease-mode execution, what
// RunLease calls to keep the lease and to record the outcome. Every call is
// a compare-and-set on the lease's owner token and fence: fenced (or held
// false) means another owner holds the record now. A call may reach the
// store twice (a client resends it when its answer was lost): a second run
// with the same owner token and fence must answer as the first did. Store
// implements it on Postgres; dedup/redisstore on Redis.
type LeaseMarks interface {
	// Renew extends the lease by its TTL; held is false when another owner
	// holds the record.
	Renew(ctx context.Context) (held bool, err error)
	// Succeed marks the record SUCCEEDED.
	Succeed(ctx context.Context) (fenced bool, err error)
	// Fail marks the record status (StatusFailedRetryable, or
	// StatusFailedFinal with a dead letter for reason) with the handler's
	// error, and returns the dead letter's ID (0 when none).
	Fail(ctx context.Context, status Status, reason string, herr error) (deadLetterID int64, fenced bool, err error)
	// Release gives the lease back without counting the attempt (the
	// handler was interrupted by a shutdown); ErrFenced when another owner
	// holds the record.
	Release(ctx context.Context) error
}

// RunLease runs h for msg under the freshly claimed lease l and records the
// outcome through marks; it is the part of lease mode that does not depend
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
func RunLease(ctx context.Context, msg *Message, l Lease, h LeaseHandler, opt LeaseOptions, maxAttempts int, marks LeaseMarks, log *slog.Logger) (Result, error) {
	opt = opt.WithDefaults()
	msg.Attempt = l.Attempt
	hctx, cancel := context.WithCancelCause(ContextWithLease(ctx, l))
	stop := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		warn := func(err error) { log.Warn("idemq: lease renewal failed", "identity", l.Identity.String(), "err", err) }
		switch leasewatch.Keep(hctx, opt.TTL, opt.Heartbeat, stop, marks.Renew, warn) {
		case leasewatch.Fenced:
			cancel(ErrFenced)
		case leasewatch.Expired:
			cancel(ErrLeaseExpired)
		}
	}()
	herr := runLeased(hctx, msg, h)
	close(stop)
	<-watchDone
	fenced := errors.Is(context.Cause(hctx), ErrFenced)
	cancel(nil)

	res := Result{HandlerCalled: true, Attempts: l.Attempt}
	fence := func() (Result, error) {
		res.Outcome, res.Err, res.Status = OutcomeFenced, ErrFenced, StatusProcessing
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
		res.Outcome, res.Status = OutcomeProcessed, StatusSucceeded
		return res, nil
	}
	if ctx.Err() != nil {
		// A shutdown is not the message's fault: give the lease back without
		// counting the attempt, and do not ack.
		if rerr := marks.Release(mctx); rerr != nil {
			log.Warn("idemq: release lease", "identity", l.Identity.String(), "err", rerr)
		}
		return res, fmt.Errorf("%w: handler interrupted: %w", ErrOutcomeUnknown, errors.Join(ctx.Err(), herr))
	}
	status, reason := StatusFailedRetryable, ""
	switch {
	case IsPermanent(herr):
		status, reason = StatusFailedFinal, ReasonPermanentError
	case l.Attempt >= maxAttempts:
		status, reason = StatusFailedFinal, ReasonAttemptsExhausted
	}
	dlID, lost, err := marks.Fail(mctx, status, reason, herr)
	if err != nil {
		return res, wrapUnknown(fmt.Errorf("idemq: lease mark %s %s: %w", status, l.Identity, err))
	}
	if lost {
		return fence()
	}
	res.Err, res.Status, res.Outcome, res.DeadLetterID = herr, status, OutcomeRetry, dlID
	if status == StatusFailedFinal {
		res.Outcome, res.Reason = OutcomeDeadLetter, reason
	}
	return res, nil
}

func runLeased(ctx context.Context, msg *Message, h LeaseHandler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v}
		}
	}()
	return h(ctx, msg)
}

// claimLease commits a PROCESSING record owned by a fresh token, or decides
// the delivery without running the handler (rowID 0).
func (s *Store) claimLease(ctx context.Context, msg *Message, sum []byte, keyID string, ttl time.Duration) (Lease, int64, Result, error) {
	lease := Lease{Identity: msg.Identity, Record: msg.Identity, OwnerToken: uuid.New(), Fence: 1, Attempt: 1}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return lease, 0, Result{}, fmt.Errorf("idemq: begin lease claim: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	id := msg.Identity
	var rowID int64
	err = tx.QueryRow(ctx, s.q.leaseInsertSQL, id.Scope, id.MessageID, id.BusinessKey, sum, keyID,
		clip(msg.Source, 1024), msg.ReconsumeTimes, lease.OwnerToken, ttl.Seconds()).Scan(&rowID)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return lease, 0, Result{}, fmt.Errorf("idemq: lease claim %s: %w", id, err)
	}
	if rowID == 0 {
		rec, live, err := s.q.lockLease(ctx, tx, id)
		if err != nil {
			return lease, 0, Result{}, err
		}
		if rec == nil {
			return lease, 0, Result{}, fmt.Errorf("idemq: lease claim %s: record vanished", id)
		}
		res, run, err := s.decide(ctx, tx, msg, sum, rec)
		if err != nil {
			return lease, 0, Result{}, err
		}
		if rec.status == StatusProcessing && res.Outcome != OutcomeConflict {
			if live {
				res.Outcome, res.Err = OutcomeRetry, ErrLeaseHeld
				return lease, 0, res, nil
			}
			if rec.attempts >= s.cfg.MaxAttempts {
				// The owner of the last allowed attempt died (or stalled)
				// without an outcome: final, so a message that kills its
				// consumer cannot loop (the Redis-only store's rule). A
				// FAILED_RETRYABLE record at the limit was re-driven: it runs.
				res, err := s.exhaustLostExecution(ctx, tx, msg, sum, rec, res.MatchedBy, rec.attempts, leaseLost(rec.attempts), &lease.OwnerToken)
				if err != nil {
					return lease, 0, Result{}, err
				}
				return lease, 0, res, commit(ctx, tx)
			}
			run = true // expired lease: take over
		}
		if !run {
			return lease, 0, res, commit(ctx, tx)
		}
		rowID = rec.id
		lease.Record = Identity{Scope: id.Scope, MessageID: rec.messageID, BusinessKey: rec.businessKey}
		if err := tx.QueryRow(ctx, s.q.leaseTakeSQL, rowID, lease.OwnerToken, ttl.Seconds(), clip(msg.Source, 1024), msg.ReconsumeTimes).
			Scan(&lease.Attempt, &lease.Fence); err != nil {
			return lease, 0, Result{}, fmt.Errorf("idemq: lease takeover %s: %w", id, err)
		}
	}
	return lease, rowID, Result{}, commit(ctx, tx)
}

// pgLease is LeaseMarks on the Postgres record rowID.
type pgLease struct {
	s     *Store
	rowID int64
	lease Lease
	msg   *Message
	sum   []byte
	ttl   time.Duration
}

func (p *pgLease) Renew(ctx context.Context) (bool, error) {
	tag, err := p.s.pool.Exec(ctx, p.s.q.leaseBeatSQL, p.rowID, p.lease.OwnerToken, p.lease.Fence, p.ttl.Seconds())
	return err == nil && tag.RowsAffected() > 0, err
}

// The marks are retried in place while their outcome is unknown or they
// are transient (markRetry), and recognise their own earlier run (see
// lease_unknown.go).

func (p *pgLease) Succeed(ctx context.Context) (fenced bool, err error) {
	return markRetry(ctx, p.s, "lease complete "+p.lease.Identity.String(), func() (bool, error) {
		var marked, before bool
		err := p.s.pool.QueryRow(ctx, p.s.q.leaseDoneSQL, p.rowID, p.lease.OwnerToken, p.lease.Fence, *p.s.expiry(StatusSucceeded)).
			Scan(&marked, &before)
		return !marked && !before, err
	})
}

// Release returns ErrFenced when the record is not this owner's any more.
func (p *pgLease) Release(ctx context.Context) error {
	fenced, err := markRetry(ctx, p.s, "lease release "+p.lease.Identity.String(), func() (bool, error) {
		var marked, before bool
		err := p.s.pool.QueryRow(ctx, p.s.q.leaseReleaseSQL, p.rowID, p.lease.OwnerToken, p.lease.Fence).Scan(&marked, &before)
		return !marked && !before, err
	})
	if err == nil && fenced {
		return ErrFenced
	}
	return err
}

// Fail writes the mark and, for a final failure, the dead letter in one
// transaction.
func (p *pgLease) Fail(ctx context.Context, status Status, reason string, herr error) (deadLetterID int64, fenced bool, err error) {
	type marked struct {
		dlID   int64
		fenced bool
	}
	m, err := markRetry(ctx, p.s, "lease mark "+string(status)+" "+p.lease.Identity.String(), func() (marked, error) {
		var m marked
		err := pgx.BeginFunc(ctx, p.s.pool, func(tx pgx.Tx) (err error) {
			m.dlID, m.fenced, err = p.fail(ctx, tx, status, reason, herr)
			return err
		})
		if err != nil {
			return marked{}, err
		}
		return m, nil
	})
	return m.dlID, m.fenced, err
}

// fail is one run of Fail's mark in tx. A run that finds the mark already
// made by an earlier run of its own (its answer lost) answers with the dead
// letter that run wrote.
func (p *pgLease) fail(ctx context.Context, tx pgx.Tx, status Status, reason string, herr error) (dlID int64, fenced bool, err error) {
	s := p.s
	var marked, before bool
	if err := tx.QueryRow(ctx, s.q.leaseFailSQL, p.rowID, p.lease.OwnerToken, p.lease.Fence, string(status),
		clip(herr.Error(), s.cfg.MaxErrorBytes), ErrorClass(herr), s.expiry(status)).Scan(&marked, &before); err != nil {
		return 0, false, err
	}
	switch {
	case !marked && !before:
		return 0, true, nil
	case status != StatusFailedFinal: // no dead letter
		return 0, false, nil
	case marked:
		dlID, err = s.q.insertDeadLetter(ctx, tx, p.msg, p.sum, reason, herr, p.lease.Attempt, s.cfg.MaxErrorBytes)
	default: // an earlier run of this mark committed: the dead letter it wrote
		dlID, err = s.q.liveDeadLetterID(ctx, tx, p.msg, p.sum, reason)
	}
	return dlID, false, err
}
