package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemq/idemq/dedup"
)

// PushConfig describes the broker a push listener serves (RocketMQ's push
// consumer: rocketmqadapter fills it from its Config). The Consumer checks
// its own timers against it in Push. Fields marked required must be set;
// every other zero value means the default given in the field's comment.
type PushConfig struct {
	// CallTimeout is how long one listener call may run before the broker
	// (client) sends its messages back for redelivery: RocketMQ
	// ConsumeTimeout. Required; at least 1s. Config.MaxHandlerDuration ×
	// DeliveriesPerCall and the lease TTL (Config.Lease.TTL, lease mode) must
	// be below it.
	CallTimeout time.Duration
	// DeliveriesPerCall is the most deliveries one listener call hands over,
	// handled one after another: RocketMQ ConsumeMessageBatchMaxSize. Default
	// 1; at least 1.
	DeliveriesPerCall int
	// ConcurrentCalls is how many listener calls run at once: RocketMQ
	// ConsumeGoroutineNums. Default 1; at least 1. When
	// Config.CrashLoop.InFlight is not set, a lane may run ConcurrentCalls ×
	// DeliveriesPerCall deliveries at once after a restart, and that many
	// get start markers.
	ConcurrentCalls int
	// MaxRedeliveries is how often the broker redelivers a delivery the
	// listener answered RetryLater before it gives up (RocketMQ
	// MaxReconsumeTimes: then the copy goes to %DLQ%). A delivery whose
	// Message.ReconsumeTimes has reached it is the broker's last copy: Push
	// retries it in place (Config.RetryInitial to RetryMax backoff) until
	// its outcome is durable or ctx ends, never answering RetryLater while
	// ctx lasts. Required; at least 1, and MaxRedeliveries+1 deliveries must
	// be at least Store.MaxAttempts, so that the attempts counted by the
	// store, not the broker, decide when a message is final.
	MaxRedeliveries int32
	// RedeliveryHorizon is how long after its first delivery the broker may
	// still deliver a copy: Push refuses a Store whose SucceededRetention does
	// not exceed it (an error wrapping dedup.ErrRetentionTooShort). 0: unknown;
	// Push logs a warning instead. Not negative.
	RedeliveryHorizon time.Duration
}

// Verdict is the push entry point's answer for one delivery.
type Verdict int

const (
	// Ack means the outcome is durable: acknowledge the delivery (RocketMQ:
	// ConsumeSuccess).
	Ack Verdict = iota + 1
	// RetryLater means not acknowledged: the broker must deliver it again later
	// (RocketMQ: ConsumeRetryLater, a copy on %RETRY%<group>).
	RetryLater
)

// String returns "ack" or "retry_later".
func (v Verdict) String() string {
	switch v {
	case Ack:
		return "ack"
	case RetryLater:
		return "retry_later"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Pusher is a Consumer's push entry point for one push listener: the
// listener translates each broker message into a Delivery, calls Handle and
// maps the Verdict to the broker's answer. Build it with Consumer.Push; it is
// safe for concurrent use.
type Pusher struct {
	c        *Consumer
	cfg      PushConfig
	inFlight int
	locks    keyLocks
}

// Push returns the push entry point for a broker described by pc, after
// checking the Consumer's config against it. Errors wrap ErrInvalidConfig
// and name the field (PushConfig's, or Config's compared to it), or wrap
// dedup.ErrRetentionTooShort when the store's SucceededRetention does not
// exceed pc.RedeliveryHorizon. A push listener may not use batched atomic
// mode (Config.BatchSize must be 1: the broker decides the batches).
func (c *Consumer) Push(pc PushConfig) (*Pusher, error) {
	if pc.DeliveriesPerCall == 0 {
		pc.DeliveriesPerCall = 1
	}
	if pc.ConcurrentCalls == 0 {
		pc.ConcurrentCalls = 1
	}
	cfg := c.cfg
	perCall := time.Duration(pc.DeliveriesPerCall)
	switch {
	case pc.CallTimeout < time.Second:
		return nil, fmt.Errorf("%w: PushConfig.CallTimeout %s must be at least 1s", ErrInvalidConfig, pc.CallTimeout)
	case pc.DeliveriesPerCall < 1:
		return nil, fmt.Errorf("%w: PushConfig.DeliveriesPerCall %d must be at least 1", ErrInvalidConfig, pc.DeliveriesPerCall)
	case pc.ConcurrentCalls < 1:
		return nil, fmt.Errorf("%w: PushConfig.ConcurrentCalls %d must be at least 1", ErrInvalidConfig, pc.ConcurrentCalls)
	case pc.MaxRedeliveries < 1:
		return nil, fmt.Errorf("%w: PushConfig.MaxRedeliveries %d must be at least 1", ErrInvalidConfig, pc.MaxRedeliveries)
	case int(pc.MaxRedeliveries)+1 < cfg.Store.MaxAttempts():
		return nil, fmt.Errorf("%w: PushConfig.MaxRedeliveries %d allows %d deliveries, fewer than the store's MaxAttempts %d: the broker would give the message up (RocketMQ: %%DLQ%%) before the store records it FAILED_FINAL",
			ErrInvalidConfig, pc.MaxRedeliveries, pc.MaxRedeliveries+1, cfg.Store.MaxAttempts())
	case pc.RedeliveryHorizon < 0:
		return nil, fmt.Errorf("%w: PushConfig.RedeliveryHorizon %s must not be negative", ErrInvalidConfig, pc.RedeliveryHorizon)
	case cfg.BatchSize > 1:
		return nil, fmt.Errorf("%w: BatchSize %d is for pull mode (Run); a push broker decides its batches (PushConfig.DeliveriesPerCall)", ErrInvalidConfig, cfg.BatchSize)
	case cfg.MaxHandlerDuration > 0 && cfg.MaxHandlerDuration*perCall >= pc.CallTimeout:
		return nil, fmt.Errorf("%w: MaxHandlerDuration %s × PushConfig.DeliveriesPerCall %d = %s must be below PushConfig.CallTimeout %s, or the broker sends messages back while their handler still runs",
			ErrInvalidConfig, cfg.MaxHandlerDuration, pc.DeliveriesPerCall, cfg.MaxHandlerDuration*perCall, pc.CallTimeout)
	}
	if cfg.LeaseHandler != nil {
		if err := cfg.Lease.ValidateUnder(pc.CallTimeout); err != nil {
			return nil, fmt.Errorf("%w: Lease: %v (PushConfig.CallTimeout)", ErrInvalidConfig, err)
		}
	}
	if pc.RedeliveryHorizon == 0 {
		c.log.Warn("idemq: broker redelivery horizon is unknown; records expire after SucceededRetention", "retention", cfg.Store.SucceededRetention())
	} else if err := cfg.Store.ValidateRetention(pc.RedeliveryHorizon); err != nil {
		return nil, fmt.Errorf("idemq/consumer: %w", err)
	}
	inFlight := cfg.CrashLoop.InFlight
	if !c.inFlightSet {
		// At most this many listener calls' deliveries run at once, so at
		// most this many of a lane can have been running when a process died.
		inFlight = pc.ConcurrentCalls * pc.DeliveriesPerCall
	}
	return &Pusher{c: c, cfg: pc, inFlight: inFlight, locks: keyLocks{m: map[string]*keyLock{}}}, nil
}

// Config returns the PushConfig with defaults applied.
func (p *Pusher) Config() PushConfig { return p.cfg }

// Handle takes one delivery of a listener call to a Verdict, through the
// same middleware chain and core as Run: identity, claim, handler, mark.
// Copies with the same message ID (else position) run one at a time in this
// process. The broker's last copy (Message.ReconsumeTimes >=
// PushConfig.MaxRedeliveries) is retried in place until its outcome is
// durable; any other copy gets one attempt.
//
// The Verdict is Ack when the outcome is durable and acknowledgeable
// (dedup.Outcome.Acked), else RetryLater. A non-nil error (Verdict
// RetryLater) means the outcome was not recorded or is not known to be
// (database down, ctx ended: cancel ctx to abort the handlers of a listener
// being shut down); nothing was counted, and the next copy finds the truth.
// The Result is the last attempt's.
func (p *Pusher) Handle(ctx context.Context, d Delivery) (Verdict, dedup.Result, error) {
	key := d.MessageID
	if key == "" {
		key = d.Position
	}
	unlock, err := p.locks.lock(ctx, key)
	if err != nil {
		return RetryLater, dedup.Result{}, fmt.Errorf("idemq/consumer: waiting for another copy of %s: %w", key, err)
	}
	defer unlock()
	sess := p.c.guard.pushSessionN(d.Lane, p.inFlight)
	var res dedup.Result
	if d.Message != nil && d.Message.ReconsumeTimes >= p.cfg.MaxRedeliveries {
		// The broker's last copy: answering RetryLater would move it out of
		// the store's view (RocketMQ: %DLQ%) while its attempts may not even
		// be recorded (database down, lease held).
		res, err = p.c.handleInPlace(ctx, ctx, d, sess)
	} else {
		res, err = p.c.handle(ctx, d, sess)
	}
	if err != nil || !res.Outcome.Acked() {
		return RetryLater, res, err
	}
	return Ack, res, nil
}

// keyLocks is a set of per-key mutexes that can be waited for with a
// context.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	sem  chan struct{}
	refs int
}

var errNoLockMap = errors.New("idemq/consumer: Pusher not built with Consumer.Push")

func (k *keyLocks) lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.m == nil {
		k.mu.Unlock()
		return nil, errNoLockMap
	}
	kl := k.m[key]
	if kl == nil {
		kl = &keyLock{sem: make(chan struct{}, 1)}
		k.m[key] = kl
	}
	kl.refs++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		kl.refs--
		if kl.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case kl.sem <- struct{}{}:
		return func() { <-kl.sem; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}
