package redisfast

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/redis/go-redis/v9"
)

// Defaults and bounds of Config; see the package documentation for the
// budget they add up to.
const (
	// DefaultTimeout is Config.Timeout's default.
	DefaultTimeout = 50 * time.Millisecond
	// MaxTimeout is the largest Config.Timeout New accepts, and the backstop
	// FailFast gives the client's own dial, read, write and pool timeouts.
	MaxTimeout = time.Second
	// DefaultBreakerFailures is Config.BreakerFailures's default.
	DefaultBreakerFailures = 5
	// DefaultBreakerCooldown is Config.BreakerCooldown's default when
	// Timeout is at most a tenth of it.
	DefaultBreakerCooldown = 5 * time.Second
	// MinCooldownTimeouts is how many Timeouts a BreakerCooldown must hold
	// at least: the probe sent after each cool-down may wait one Timeout, so
	// while Redis stays down probes take at most 1/MinCooldownTimeouts of
	// one lane's time.
	MinCooldownTimeouts = 10
)

// ErrInvalidConfig is wrapped by every Config error.
var ErrInvalidConfig = errors.New("idemq/redisfast: invalid config")

// ErrBreakerOpen is returned at once by Lookup and Remember, without a Redis
// call, while the circuit breaker is open (and, while it is half-open, to
// every call but the one probe). It wraps dedup.ErrFastPathSkipped, so the
// store falls through to Postgres and counts the call as a fast-path error
// without logging it.
var ErrBreakerOpen = fmt.Errorf("idemq/redisfast: circuit breaker open, Redis skipped: %w", dedup.ErrFastPathSkipped)

// Config configures a FastPath.
type Config struct {
	// Client is the Redis client (a *redis.Client, *redis.ClusterClient or
	// any redis.UniversalClient). Required. Build it with ClientOptions or
	// FailFast (FailFastCluster): New logs one warning when a *redis.Client
	// or *redis.ClusterClient has settings that let a Redis outage cost more
	// than Timeout per call (see the package documentation).
	Client redis.UniversalClient
	// Prefix starts every key. Default "idemq".
	Prefix string
	// TTL is how long an identity is remembered. Default 24h; at least 1s.
	// pgstore.New refuses a TTL longer than its SucceededRetention (a
	// purged record must not be answered from Redis).
	TTL time.Duration
	// Timeout bounds each Redis call (one MGET, or one pipeline of SETs)
	// through its context: on timeout Postgres answers and the call counts
	// as a failure for the circuit breaker. The client must honour context
	// deadlines (ContextTimeoutEnabled, set by FailFast) for a hung Redis to
	// be cut off at Timeout. Default 50ms (DefaultTimeout); 1ms to 1s
	// (MaxTimeout).
	Timeout time.Duration
	// BreakerFailures is how many consecutive failed calls (errors or
	// timeouts, Lookup and Remember alike) open the circuit breaker; any
	// successful call resets the count. Default 5
	// (DefaultBreakerFailures); 1 to 1000.
	BreakerFailures int
	// BreakerCooldown is how long an open breaker skips Redis (every call
	// returns ErrBreakerOpen at once) before it lets one call probe Redis:
	// a successful probe closes it, a failed one opens it for another
	// BreakerCooldown. Default 5s (DefaultBreakerCooldown) or 10 × Timeout,
	// whichever is longer; at least 10 × Timeout (MinCooldownTimeouts), at
	// most 10m.
	BreakerCooldown time.Duration
	// Logger receives one warning when the breaker opens, one info line
	// when it closes, debug lines for failed probes, and the one-time
	// warning about the client's settings; never a line per message. Give
	// it the pgstore.Config.Logger of the store. Default slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "idemq"
	}
	if c.TTL == 0 {
		c.TTL = 24 * time.Hour
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.BreakerFailures == 0 {
		c.BreakerFailures = DefaultBreakerFailures
	}
	if c.BreakerCooldown == 0 {
		c.BreakerCooldown = max(DefaultBreakerCooldown, MinCooldownTimeouts*c.Timeout)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.Client == nil:
		return bad("Client is required")
	case c.TTL < time.Second:
		return bad("TTL %s must be at least 1s", c.TTL)
	case c.Timeout < time.Millisecond || c.Timeout > MaxTimeout:
		return bad("Timeout %s must be 1ms to %s: it is what every message may wait for Redis until the breaker opens", c.Timeout, MaxTimeout)
	case c.BreakerFailures < 1 || c.BreakerFailures > 1000:
		return bad("BreakerFailures %d must be 1 to 1000", c.BreakerFailures)
	case c.BreakerCooldown < MinCooldownTimeouts*c.Timeout || c.BreakerCooldown > 10*time.Minute:
		return bad("BreakerCooldown %s must be %d × Timeout (%s) to 10m: each cool-down ends with a probe that may wait one Timeout",
			c.BreakerCooldown, MinCooldownTimeouts, MinCooldownTimeouts*c.Timeout)
	}
	return nil
}

// FastPath implements dedup.FastPath on Redis, behind a circuit breaker.
// It is safe for concurrent use.
type FastPath struct {
	c       redis.UniversalClient
	prefix  string
	ttl     time.Duration
	timeout time.Duration
	br      *breaker
}

var _ dedup.FastPath = (*FastPath)(nil)

// New validates cfg and returns a FastPath. It does not contact Redis. It
// logs one warning (Config.Logger) when cfg.Client is a *redis.Client or
// *redis.ClusterClient whose settings let an outage cost more than Timeout
// per call or spend it on retries (see FailFast). Errors wrap
// ErrInvalidConfig and name the field.
func New(cfg Config) (*FastPath, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if problems := clientProblems(cfg.Client, cfg.Timeout); len(problems) > 0 {
		cfg.Logger.Warn("idemq: the Redis fast path's client is not set to fail fast; build it with redisfast.ClientOptions or redisfast.FailFast",
			"problems", strings.Join(problems, "; "), "timeout", cfg.Timeout)
	}
	return &FastPath{c: cfg.Client, prefix: cfg.Prefix, ttl: cfg.TTL, timeout: cfg.Timeout,
		br: newBreaker(cfg.BreakerFailures, cfg.BreakerCooldown, cfg.Logger)}, nil
}

// TTL is how long an identity is remembered (Config.TTL with its default).
func (f *FastPath) TTL() time.Duration { return f.ttl }

// Key returns the Redis key of one identity part: kind "m" (message ID) or
// "b" (business key).
func (f *FastPath) Key(scope, kind, key string) string {
	return f.prefix + ":{" + scope + "}:" + kind + ":" + key
}

const valuePrefix = "s1:"

func encode(e dedup.FastPathEntry) string {
	return valuePrefix + e.KeyID + ":" + hex.EncodeToString(e.Fingerprint)
}

func decode(v string) (dedup.FastPathEntry, bool) {
	rest, ok := strings.CutPrefix(v, valuePrefix)
	if !ok {
		return dedup.FastPathEntry{}, false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return dedup.FastPathEntry{}, false
	}
	fp, err := hex.DecodeString(rest[i+1:])
	if err != nil || len(fp) == 0 {
		return dedup.FastPathEntry{}, false
	}
	return dedup.FastPathEntry{KeyID: rest[:i], Fingerprint: fp}, true
}

// Lookup implements dedup.FastPath with one MGET of both keys, bounded by
// Config.Timeout. While the breaker is open it returns ErrBreakerOpen at
// once.
func (f *FastPath) Lookup(ctx context.Context, id dedup.Identity) (dedup.FastPathEntry, bool, error) {
	keys := []string{f.Key(id.Scope, "m", id.MessageID)}
	if id.BusinessKey != "" {
		keys = append(keys, f.Key(id.Scope, "b", id.BusinessKey))
	}
	var vals []any
	err := f.br.call(ctx, f.timeout, func(ctx context.Context) error {
		var err error
		vals, err = f.c.MGet(ctx, keys...).Result()
		return err
	})
	if err != nil {
		return dedup.FastPathEntry{}, false, err
	}
	for i, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue
		}
		if e, ok := decode(s); ok {
			e.MatchedBy = dedup.ByMessageID
			if i == 1 {
				e.MatchedBy = dedup.ByBusinessKey
			}
			return e, true, nil
		}
	}
	return dedup.FastPathEntry{}, false, nil
}

// Remember implements dedup.FastPath: both keys are set with the TTL in one
// pipeline, bounded by Config.Timeout. While the breaker is open it returns
// ErrBreakerOpen at once.
func (f *FastPath) Remember(ctx context.Context, id dedup.Identity, e dedup.FastPathEntry) error {
	v := encode(e)
	return f.br.call(ctx, f.timeout, func(ctx context.Context) error {
		_, err := f.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, f.Key(id.Scope, "m", id.MessageID), v, f.ttl)
			if id.BusinessKey != "" {
				p.Set(ctx, f.Key(id.Scope, "b", id.BusinessKey), v, f.ttl)
			}
			return nil
		})
		return err
	})
}

// BreakerStats returns the circuit breaker's state and counters since New.
func (f *FastPath) BreakerStats() BreakerStats { return f.br.stats() }
