// Package leasewatch is the heartbeat loop shared by the lease-mode stores
// (dedup.Store on Postgres, redisstore.Store on Redis).
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
// claim or the last successful renewal. A renew error is passed to warn and
// the next heartbeat tries again.
func Keep(ctx context.Context, ttl, heartbeat time.Duration, stop <-chan struct{},
	renew func(ctx context.Context) (held bool, err error), warn func(error)) Loss {
	safe := ttl * 9 / 10
	expire := time.NewTimer(safe)
	defer expire.Stop()
	var beat <-chan time.Time
	if heartbeat > 0 {
		t := time.NewTicker(heartbeat)
		defer t.Stop()
		beat = t.C
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
		held, err := renew(ctx)
		switch {
		case err != nil:
			warn(err)
		case !held:
			return Fenced
		default:
			expire.Reset(safe - time.Since(sent))
		}
	}
}
