package redisfast

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// BreakerState is the circuit breaker's state. Its numeric value is the
// value of the idemq_fastpath_breaker_state gauge.
type BreakerState int

// The breaker's states.
const (
	// BreakerClosed: Redis is used (the normal state).
	BreakerClosed BreakerState = BreakerState(gobreaker.StateClosed)
	// BreakerHalfOpen: the cool-down is over; one call probes Redis, the
	// others still skip it.
	BreakerHalfOpen BreakerState = BreakerState(gobreaker.StateHalfOpen)
	// BreakerOpen: Redis is skipped; every call returns ErrBreakerOpen.
	BreakerOpen BreakerState = BreakerState(gobreaker.StateOpen)
)

// String returns "closed", "half_open" or "open" (the label values of
// idemq_fastpath_breaker_transitions_total).
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half_open"
	case BreakerOpen:
		return "open"
	}
	return "unknown"
}

// BreakerStats are a FastPath's circuit-breaker state and counters since
// New.
type BreakerStats struct {
	// State is the state now.
	State BreakerState
	// Opened counts closed → open: BreakerFailures consecutive calls failed
	// (an outage began; one warning logged each time).
	Opened int64
	// Probed counts open → half-open: a cool-down ended and a probe was
	// let through.
	Probed int64
	// ProbesFailed counts half-open → open: the probe failed, Redis is
	// skipped for another cool-down (a debug line each).
	ProbesFailed int64
	// Closed counts half-open → closed: a probe succeeded (the outage
	// ended; one info line logged each time).
	Closed int64
	// Skipped counts calls answered with ErrBreakerOpen without a Redis
	// call.
	Skipped int64
}

// errCallerGone marks a call that failed because its caller's context
// ended (a shutdown): not Redis's fault, so the breaker ignores it.
var errCallerGone = errors.New("caller context ended")

// breaker is the fast path's circuit breaker: sony/gobreaker's two-step
// breaker, with the logs and counters of BreakerStats.
type breaker struct {
	cb       *gobreaker.TwoStepCircuitBreaker[struct{}]
	log      *slog.Logger
	failures int
	cooldown time.Duration

	skipped     atomic.Int64
	transitions [3][3]atomic.Int64 // [from][to], by gobreaker.State

	mu            sync.Mutex // guards the fields below
	lastErr       error      // the most recent failure, for the logs
	openedAt      time.Time  // when the current outage began
	skippedAtOpen int64      // skipped when it began
}

func newBreaker(failures int, cooldown time.Duration, log *slog.Logger) *breaker {
	b := &breaker{log: log, failures: failures, cooldown: cooldown}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "idemq-redisfast",
		MaxRequests: 1,        // one probe when half-open
		Interval:    0,        // closed: counts are never cleared by time, only by a success
		Timeout:     cooldown, // open → half-open
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= uint32(failures) //nolint:gosec // failures is validated to 1..1000
		},
		OnStateChange: func(_ string, from, to gobreaker.State) { b.changed(from, to) },
		IsExcluded:    func(err error) bool { return errors.Is(err, errCallerGone) },
	})
	return b
}

// call runs fn with a context bounded by timeout, unless the breaker skips
// Redis (then ErrBreakerOpen at once), and reports the result to the
// breaker. A failure after ctx itself ended is not counted.
func (b *breaker) call(ctx context.Context, timeout time.Duration, fn func(ctx context.Context) error) error {
	done, err := b.cb.Allow()
	if err != nil {
		b.skipped.Add(1)
		return ErrBreakerOpen
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	err = fn(cctx)
	cancel()
	switch {
	case err == nil:
		done(nil)
	case ctx.Err() != nil:
		done(errCallerGone)
	default:
		b.mu.Lock()
		b.lastErr = err
		b.mu.Unlock()
		done(err)
	}
	return err
}

// changed runs under gobreaker's lock at every state change: it counts the
// transition and logs outages once each way.
func (b *breaker) changed(from, to gobreaker.State) {
	b.transitions[from][to].Add(1) // gobreaker has exactly the three states 0..2
	now := time.Now()
	opened := from == gobreaker.StateClosed && to == gobreaker.StateOpen
	b.mu.Lock()
	if opened {
		b.openedAt, b.skippedAtOpen = now, b.skipped.Load()
	}
	lastErr, openedAt, skippedAtOpen := b.lastErr, b.openedAt, b.skippedAtOpen
	b.mu.Unlock()
	switch {
	case opened:
		b.log.Warn("idemq: Redis fast path failing; skipping Redis, Postgres answers alone until a probe succeeds",
			"consecutive_failures", b.failures, "cooldown", b.cooldown, "err", lastErr)
	case from == gobreaker.StateHalfOpen && to == gobreaker.StateOpen:
		b.log.Debug("idemq: Redis fast path probe failed; skipping Redis for another cool-down", "cooldown", b.cooldown, "err", lastErr)
	case from == gobreaker.StateOpen && to == gobreaker.StateHalfOpen:
		b.log.Debug("idemq: Redis fast path cool-down over; probing Redis")
	case to == gobreaker.StateClosed:
		b.log.Info("idemq: Redis fast path recovered; using Redis again",
			"down_for", now.Sub(openedAt).Round(time.Millisecond), "skipped_calls", b.skipped.Load()-skippedAtOpen)
	}
}

func (b *breaker) state() BreakerState { return BreakerState(b.cb.State()) }

func (b *breaker) stats() BreakerStats {
	t := func(from, to gobreaker.State) int64 { return b.transitions[from][to].Load() }
	return BreakerStats{
		State:        b.state(),
		Opened:       t(gobreaker.StateClosed, gobreaker.StateOpen),
		Probed:       t(gobreaker.StateOpen, gobreaker.StateHalfOpen),
		ProbesFailed: t(gobreaker.StateHalfOpen, gobreaker.StateOpen),
		Closed:       t(gobreaker.StateHalfOpen, gobreaker.StateClosed),
		Skipped:      b.skipped.Load(),
	}
}
