package dedup

import (
	"context"
	"errors"
	"fmt"
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

func (o LeaseOptions) withDefaults() LeaseOptions {
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
	o = o.withDefaults()
	if o.TTL < time.Second {
		return fmt.Errorf("%w: lease TTL %s must be at least 1s", ErrInvalidConfig, o.TTL)
	}
	if brokerTimer > 0 && o.TTL >= brokerTimer {
		return fmt.Errorf("%w: lease TTL %s must be shorter than the broker's redelivery timer %s", ErrInvalidConfig, o.TTL, brokerTimer)
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
func (s *Store) ProcessLeased(ctx context.Context, msg *Message, h LeaseHandler, opt LeaseOptions) (Result, error) {
	if msg == nil || h == nil {
		return Result{}, errors.New("idemq: ProcessLeased: nil message or handler")
	}
	opt = opt.withDefaults()
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
	lease, rowID, res, err := s.claimLease(ctx, msg, sum, keyID, opt.TTL)
	if err != nil || rowID == 0 {
		return res, err
	}
	msg.Attempt = lease.Attempt

	hctx, cancel := context.WithCancelCause(ContextWithLease(ctx, lease))
	stopBeat := make(chan struct{})
	beatDone := make(chan struct{})
	go func() {
		defer close(beatDone)
		s.heartbeat(hctx, cancel, rowID, lease, opt, stopBeat)
	}()
	herr := runLeased(hctx, msg, h)
	close(stopBeat)
	<-beatDone
	lost := errors.Is(context.Cause(hctx), ErrFenced)
	cancel(nil)

	res = Result{HandlerCalled: true, Attempts: lease.Attempt}
	if lost {
		res.Outcome, res.Err, res.Status = OutcomeFenced, ErrFenced, StatusProcessing
		return res, nil
	}
	if herr == nil {
		res, err := s.completeLease(ctx, rowID, lease, res)
		if err == nil && res.Outcome == OutcomeProcessed {
			s.fastRemember(ctx, msg.Identity, sum, keyID)
		}
		return res, err
	}
	if ctx.Err() != nil {
		// A shutdown is not the message's fault: give the lease back without
		// counting the attempt, and do not ack.
		if _, rerr := s.pool.Exec(context.WithoutCancel(ctx), s.q.leaseReleaseSQL, rowID, lease.OwnerToken, lease.Fence); rerr != nil {
			s.cfg.Logger.Warn("idemq: release lease", "identity", lease.Identity.String(), "err", rerr)
		}
		return Result{}, fmt.Errorf("idemq: handler interrupted: %w", errors.Join(ctx.Err(), herr))
	}
	return s.failLease(ctx, msg, sum, rowID, lease, herr, res)
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
		res, run, err := s.decide(ctx, tx, msg, sum, keyID, rec)
		if err != nil {
			return lease, 0, Result{}, err
		}
		if rec.status == StatusProcessing && res.Outcome != OutcomeConflict {
			if live {
				res.Outcome, res.Err = OutcomeRetry, ErrLeaseHeld
				return lease, 0, res, nil
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

// heartbeat extends the lease every opt.Heartbeat until stop. When the lease
// is found taken over it cancels the handler's context with ErrFenced; when
// no extension succeeded for 90% of the TTL (heartbeats failing, or disabled)
// it cancels it with ErrLeaseExpired.
func (s *Store) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, rowID int64, l Lease, opt LeaseOptions, stop <-chan struct{}) {
	renew := func(ctx context.Context) (bool, error) {
		tag, err := s.pool.Exec(ctx, s.q.leaseBeatSQL, rowID, l.OwnerToken, l.Fence, opt.TTL.Seconds())
		return err == nil && tag.RowsAffected() > 0, err
	}
	warn := func(err error) {
		s.cfg.Logger.Warn("idemq: lease heartbeat failed", "identity", l.Identity.String(), "err", err)
	}
	switch leasewatch.Keep(ctx, opt.TTL, opt.Heartbeat, stop, renew, warn) {
	case leasewatch.Fenced:
		cancel(ErrFenced)
	case leasewatch.Expired:
		cancel(ErrLeaseExpired)
	}
}

func (s *Store) completeLease(ctx context.Context, rowID int64, l Lease, res Result) (Result, error) {
	ctx = context.WithoutCancel(ctx)
	tag, err := s.pool.Exec(ctx, s.q.leaseDoneSQL, rowID, l.OwnerToken, l.Fence, *s.expiry(StatusSucceeded))
	if err != nil {
		return Result{}, fmt.Errorf("idemq: lease complete %s: %w", l.Identity, err)
	}
	if tag.RowsAffected() == 0 {
		res.Outcome, res.Err, res.Status = OutcomeFenced, ErrFenced, StatusProcessing
		return res, nil
	}
	res.Outcome, res.Status = OutcomeProcessed, StatusSucceeded
	return res, nil
}

func (s *Store) failLease(ctx context.Context, msg *Message, sum []byte, rowID int64, l Lease, herr error, res Result) (Result, error) {
	ctx = context.WithoutCancel(ctx)
	status := StatusFailedRetryable
	reason := ReasonAttemptsExhausted
	if IsPermanent(herr) {
		status, reason = StatusFailedFinal, ReasonPermanentError
	} else if l.Attempt >= s.cfg.MaxAttempts {
		status = StatusFailedFinal
	}
	res.Err, res.Status, res.Outcome = herr, status, OutcomeRetry
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, s.q.leaseFailSQL, rowID, l.OwnerToken, l.Fence, string(status),
			clip(herr.Error(), s.cfg.MaxErrorBytes), ErrorClass(herr), s.expiry(status))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			res.Outcome, res.Err, res.Status = OutcomeFenced, ErrFenced, StatusProcessing
			return nil
		}
		if status == StatusFailedFinal {
			res.Outcome = OutcomeDeadLetter
			res.DeadLetterID, err = s.q.insertDeadLetter(ctx, tx, msg, sum, reason, herr, l.Attempt, s.cfg.MaxErrorBytes)
		}
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("idemq: lease mark failed %s: %w", l.Identity, err)
	}
	return res, nil
}
