package submittoken

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults and bounds of Config.
const (
	// DefaultPrefix is Config.Prefix's default.
	DefaultPrefix = "idemq"
	// DefaultTTL is Config.TTL's default: how long a form may stay open
	// before its token expires.
	DefaultTTL = 30 * time.Minute
	// MaxTTL is the largest Config.TTL.
	MaxTTL = 7 * 24 * time.Hour
	// DefaultUsedTTL is Config.UsedTTL's default.
	DefaultUsedTTL = 10 * time.Minute
	// MinTTL is the smallest Config.TTL and Config.UsedTTL: Redis expiries
	// are set in whole seconds (SET … EX).
	MinTTL = time.Second
	// MaxScopeBytes is the longest scope Issue and Consume accept.
	MaxScopeBytes = 255
)

// ErrInvalidConfig is wrapped by New's errors, which name the field.
var ErrInvalidConfig = errors.New("submittoken: invalid config")

// Config configures a Store (New). The zero value of each field except
// Client means its default.
type Config struct {
	// Client is the Redis connection (required): a *redis.Client,
	// *redis.ClusterClient or *redis.Ring; Redis 6.2 or later. Keep
	// go-redis's command retries (MaxRetries, 3 by default): Consume is safe
	// to run twice.
	Client redis.UniversalClient
	// Prefix is the first part of every key:
	// "<Prefix>:submit:<scope>:<token>". Default DefaultPrefix ("idemq");
	// must not contain ':' or whitespace.
	Prefix string
	// TTL is how long an issued token can be consumed. Default DefaultTTL
	// (30 minutes); MinTTL (1s) to MaxTTL (7 days), whole seconds.
	TTL time.Duration
	// UsedTTL is how long a consumed token is at least remembered as used,
	// so that a second submit gets ErrTokenUsed rather than ErrTokenUnknown
	// even when the first came just before the token's expiry; the key
	// otherwise lives for the rest of TTL. Default DefaultUsedTTL (10
	// minutes); MinTTL (1s) to MaxTTL (7 days).
	UsedTTL time.Duration
}

// withDefaults returns c with the zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.UsedTTL == 0 {
		c.UsedTTL = DefaultUsedTTL
	}
	return c
}

// Validate reports the first invalid field of c after defaults, as an error
// wrapping ErrInvalidConfig that names it; nil when New would accept c.
func (c Config) Validate() error {
	return c.withDefaults().validate()
}

func (c Config) validate() error {
	switch {
	case c.Client == nil:
		return fmt.Errorf("%w: Client is required", ErrInvalidConfig)
	case strings.ContainsAny(c.Prefix, ": \t\r\n"):
		return fmt.Errorf("%w: Prefix %q must not contain ':' or whitespace", ErrInvalidConfig, c.Prefix)
	case c.TTL < MinTTL || c.TTL > MaxTTL || c.TTL%time.Second != 0:
		return fmt.Errorf("%w: TTL %s must be whole seconds from %s to %s", ErrInvalidConfig, c.TTL, MinTTL, MaxTTL)
	case c.UsedTTL < MinTTL || c.UsedTTL > MaxTTL:
		return fmt.Errorf("%w: UsedTTL %s must be from %s to %s", ErrInvalidConfig, c.UsedTTL, MinTTL, MaxTTL)
	}
	return nil
}
