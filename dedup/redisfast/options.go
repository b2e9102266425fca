package redisfast

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClientOptions returns go-redis options for a fast-path client of the
// Redis at addr ("host:port"), set to fail fast: FailFast(&redis.Options{Addr:
// addr}). Set further fields (Password, TLSConfig, DB …) on the result
// before redis.NewClient.
func ClientOptions(addr string) *redis.Options {
	return FailFast(&redis.Options{Addr: addr})
}

// FailFast sets o for the fast path's budget and returns it (the same
// pointer):
//
//   - DialerRetries 1: one dial per call. go-redis dials up to 5 times,
//     100ms apart, so against a Redis that refuses connections every call
//     waited the whole Config.Timeout and logged "failed to dial after 5
//     attempts"; with 1 it fails in well under a millisecond.
//   - MaxRetries -1: no command retries (go-redis: 3). The fast path never
//     needs one: a failed call falls through to Postgres.
//   - ContextTimeoutEnabled true: socket reads and writes end at the call's
//     deadline, Config.Timeout. Without it go-redis ignores context
//     deadlines on the socket and a hung Redis holds each call for
//     ReadTimeout (go-redis: 5s).
//   - DialTimeout, ReadTimeout, WriteTimeout and PoolTimeout: at most
//     MaxTimeout (1s); values unset, negative (no timeout) or larger are set
//     to MaxTimeout, smaller ones are kept. They are backstops: each
//     fast-path call ends at its own Config.Timeout first.
//
// Use a client built from these options for the fast path only: other uses
// (a redisstore.Store, your own commands) may want retries.
func FailFast(o *redis.Options) *redis.Options {
	o.DialerRetries, o.MaxRetries, o.ContextTimeoutEnabled = 1, -1, true
	for _, d := range []*time.Duration{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout} {
		backstop(d)
	}
	return o
}

// FailFastCluster is FailFast for a Redis Cluster client's options. Its
// MaxRedirects (MOVED and ASK replies) is left as is.
func FailFastCluster(o *redis.ClusterOptions) *redis.ClusterOptions {
	o.DialerRetries, o.MaxRetries, o.ContextTimeoutEnabled = 1, -1, true
	for _, d := range []*time.Duration{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout} {
		backstop(d)
	}
	return o
}

func backstop(d *time.Duration) {
	if *d <= 0 || *d > MaxTimeout {
		*d = MaxTimeout
	}
}

// clientProblems lists what lets a Redis outage cost a *redis.Client or
// *redis.ClusterClient more than timeout per call, or spend it on retries.
// It reads the client's options as go-redis normalized them. Other clients
// are not checked (nil).
func clientProblems(c any, timeout time.Duration) []string {
	var dialerRetries, maxRetries int
	var ctxDeadlines bool
	var readTimeout time.Duration
	switch c := c.(type) {
	case *redis.Client:
		o := c.Options()
		dialerRetries, maxRetries, ctxDeadlines, readTimeout = o.DialerRetries, o.MaxRetries, o.ContextTimeoutEnabled, o.ReadTimeout
	case *redis.ClusterClient:
		o := c.Options()
		dialerRetries, maxRetries, ctxDeadlines, readTimeout = o.DialerRetries, o.MaxRetries, o.ContextTimeoutEnabled, o.ReadTimeout
	default:
		return nil
	}
	var out []string
	if !ctxDeadlines && (readTimeout <= 0 || readTimeout > timeout) {
		limit := "no limit"
		if readTimeout > 0 {
			limit = readTimeout.String()
		}
		out = append(out, fmt.Sprintf("ContextTimeoutEnabled is false: a hung Redis holds a call for ReadTimeout (%s), not Timeout, until the breaker opens", limit))
	}
	if dialerRetries > 1 {
		out = append(out, fmt.Sprintf("DialerRetries is %d: against a Redis refusing connections each call waits the whole Timeout and go-redis logs a dial failure per call, until the breaker opens", dialerRetries))
	}
	if maxRetries > 0 {
		out = append(out, fmt.Sprintf("MaxRetries is %d: failed commands are retried within Timeout instead of falling through to Postgres at once", maxRetries))
	}
	return out
}
