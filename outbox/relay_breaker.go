package outbox

import (
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// breaker pauses a relay's publishing while the broker is unavailable (a
// circuit breaker). Closed: workers claim batches as usual. A batch with a
// publish failure that IsUnavailable opens it: no worker claims a batch for
// a backoff delay (OutageBackoffInitial, doubling to OutageBackoffMax,
// ±20% jitter). When the delay is over one worker claims a probe batch
// (half-open) while the others keep waiting: if it publishes without an
// unavailable failure (or finds nothing to publish) the breaker closes,
// otherwise it stays open for the next, longer delay. Rows that failed
// because the broker was unavailable are left as they were (no attempt, no
// error, no retry time), so they are the first claimed again and drain in
// per-key order once the broker is back.
type breaker struct {
	mu      sync.Mutex
	open    bool
	probing bool      // a worker runs the probe batch
	until   time.Time // while open: the earliest time of the next probe
	delay   time.Duration
	b       *backoff.ExponentialBackOff
	log     *slog.Logger

	outages int64 // closed→open transitions
}

func newBreaker(initial, maxDelay time.Duration, log *slog.Logger) *breaker {
	b := &backoff.ExponentialBackOff{InitialInterval: initial, RandomizationFactor: 0.2, Multiplier: 2, MaxInterval: maxDelay}
	b.Reset()
	return &breaker{b: b, log: log}
}

// admit reports whether a worker may claim a batch now, whether that batch
// is the probe of an open breaker, and otherwise how long to wait before
// asking again (a worker's wake-up ends the wait early; it then asks again).
func (k *breaker) admit(now time.Time, idle time.Duration) (ok, probe bool, wait time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case !k.open:
		return true, false, 0
	case now.Before(k.until):
		return false, false, k.until.Sub(now)
	case k.probing:
		// Another worker probes: look again after a while (its outcome
		// either closes the breaker or sets a new delay).
		return false, false, min(idle, k.delay)
	default:
		k.probing = true
		return true, true, 0
	}
}

// done records the outcome of a batch admitted by admit: unavailable is how
// many of its publishes failed with an unavailable broker, lost whether the
// batch was lost to a database error (which tells nothing about the broker).
func (k *breaker) done(now time.Time, probe bool, res BatchResult, lost bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if probe {
		k.probing = false
	}
	switch {
	case lost, k.open && !probe:
		// Keep the state: a lost batch tells nothing about the broker (an
		// open breaker probes again after the worker's database backoff),
		// and a batch claimed before the breaker opened neither extends
		// the delay nor ends it.
	case res.Unavailable > 0:
		k.delay = k.b.NextBackOff()
		k.until = now.Add(k.delay)
		if !k.open {
			k.open = true
			k.outages++
			k.log.Warn("idemq: broker unavailable; relay pauses publishing (no attempts are counted) and probes with backoff",
				"unavailable", res.Unavailable, "probe_in", k.delay)
		} else {
			k.log.Debug("idemq: broker still unavailable; relay stays paused", "probe_in", k.delay)
		}
	case k.open && probe:
		k.open = false
		k.b.Reset()
		k.log.Info("idemq: broker available again; relay resumes publishing", "published", res.Published)
	}
}

// state returns whether the breaker is open and how many outages it saw.
func (k *breaker) state() (open bool, outages int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.open, k.outages
}
