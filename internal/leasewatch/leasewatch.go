// Package leasewatch is the heartbeat loop shared by the lease-mode stores
// (pgstore.Store on Postgres, redisstore.Store on Redis).
package leasewatch

import (
	"context"
	"time"
)

// Loss says why Keep stopped before stop was closed.
type Loss int

const (
	// Kept means stop was closed while the lease was held.
	Kept Loss = iota
	// Fenced means a renewal found the lease held by another owner.
	Fenced
	// Expired means no renewal succeeded for 90% of the TTL (renewals failing,
	// or heartbeat disabled), so another owner may take over any moment.
	Expired
)

// Keep calls renew every heartbeat (never when heartbeat <= 0) until stop
// is closed, and returns Kept then. It returns Fenced as soon as renew
// reports the lease is not held, and Expired when ttl·9/10 passed since the
// claim or since the start of the last successful renewal. A renew error is
// passed to warn and the next heartbeat tries again.
//
// Keep goes by the lease's clock, whatever renew does: each call gets a
// context whose deadline is the moment the lease counts as expired, and Keep
// does not wait for a call past that moment, nor past stop. A renewal stuck
// in a hung store, or in a client's own retries and socket timeouts that
// ignore the deadline, ends in Expired on time; such a call is left to
// finish on its canceled context and its answer is ignored.
func Keep(ctx context.Context, ttl, heartbeat time.Duration, stop <-chan struct{},
	renew func(ctx context.Context) (held bool, err error), warn func(error)) Loss {
	safe := ttl * 9 / 10
	expiry := time.Now().Add(safe)
	expire := time.NewTimer(safe)
	defer expire.Stop()
	var beat <-chan time.Time
	if heartbeat > 0 {
		t := time.NewTicker(heartbeat)
		defer t.Stop()
		beat = t.C
	}
	type answer struct {
		held bool
		err  error
	}
	for {
		select {
		case <-stop:
			return Kept
		case <-expire.C:
			return Expired
		case <-beat:
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, expiry)
		done := make(chan answer, 1) // the call may outlive Keep: never block it
		go func() {
			held, err := renew(rctx)
			done <- answer{held, err}
		}()
		var a answer
		select {
		case <-stop:
			cancel()
			return Kept
		case <-expire.C:
			cancel()
			return Expired
		case a = <-done:
			cancel()
		}
		switch {
		case a.err != nil:
			warn(a.err)
		case !a.held:
			return Fenced
		default:
			expiry = sent.Add(safe)
			expire.Reset(time.Until(expiry))
		}
	}
}
