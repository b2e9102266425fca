package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq/internal/leasectx"
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

// LeaseFromContext returns the lease of the running lease-mode handler: the
// context a store gives a LeaseHandler carries it; any other context does
// not (false).
func LeaseFromContext(ctx context.Context) (Lease, bool) {
	l, ok := leasectx.From(ctx).(Lease)
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
	// Default TTL/3. Negative values are refused (ValidateUnder returns an
	// error wrapping ErrInvalidConfig): set DisableHeartbeat for none.
	Heartbeat time.Duration
	// DisableHeartbeat turns the heartbeat off: the lease then lasts TTL
	// from the claim, and a handler still running after 90% of TTL has its
	// context canceled with ErrLeaseExpired. Default false. Heartbeat must
	// then be zero.
	DisableHeartbeat bool
}

// WithDefaults returns o with its zero fields set to their defaults: TTL
// 30s, Heartbeat TTL/3 (none with DisableHeartbeat).
func (o LeaseOptions) WithDefaults() LeaseOptions {
	if o.TTL == 0 {
		o.TTL = 30 * time.Second
	}
	if o.Heartbeat == 0 && !o.DisableHeartbeat {
		o.Heartbeat = o.TTL / 3
	}
	return o
}

// ValidateUnder refuses a lease TTL that does not fit under the broker's
// redelivery timer (RocketMQ ConsumeTimeout, Kafka session timeout): the
// broker would hand the message to another consumer while the lease still
// blocks it. It also refuses a negative Heartbeat, and a Heartbeat set
// with DisableHeartbeat. Errors name the field and wrap ErrInvalidConfig.
func (o LeaseOptions) ValidateUnder(brokerTimer time.Duration) error {
	switch {
	case o.Heartbeat < 0:
		return fmt.Errorf("%w: lease Heartbeat %s is negative: a negative value no longer disables heartbeats; set DisableHeartbeat instead", ErrInvalidConfig, o.Heartbeat)
	case o.DisableHeartbeat && o.Heartbeat != 0:
		return fmt.Errorf("%w: lease DisableHeartbeat is set: Heartbeat must be zero, not %s", ErrInvalidConfig, o.Heartbeat)
	}
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

// The marks are retried in place while their outcome is unknown or they
// are transient (markRetry), and recognise their own earlier run (see
// lease_unknown.go).
