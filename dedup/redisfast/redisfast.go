package redisfast

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/redis/go-redis/v9"
)

// Config configures a FastPath.
type Config struct {
	// Client is the Redis client (a *redis.Client, *redis.ClusterClient or
	// any redis.UniversalClient). Required.
	Client redis.UniversalClient
	// Prefix starts every key. Default "idemq".
	Prefix string
	// TTL is how long an identity is remembered. Default 24h; at least 1s.
	// dedup.NewStore refuses a TTL longer than its SucceededRetention (a
	// purged record must not be answered from Redis).
	TTL time.Duration
	// Timeout bounds each Redis round trip so a slow Redis cannot slow the
	// consumer more than this; on timeout Postgres answers. Default 50ms;
	// must not be negative.
	Timeout time.Duration
}

// FastPath implements dedup.FastPath on Redis.
type FastPath struct {
	c       redis.UniversalClient
	prefix  string
	ttl     time.Duration
	timeout time.Duration
}

var _ dedup.FastPath = (*FastPath)(nil)

// New validates cfg and returns a FastPath. It does not contact Redis.
func New(cfg Config) (*FastPath, error) {
	if cfg.Client == nil {
		return nil, errors.New("idemq/redisfast: Client is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "idemq"
	}
	if cfg.TTL == 0 {
		cfg.TTL = 24 * time.Hour
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 50 * time.Millisecond
	}
	if cfg.TTL < time.Second || cfg.Timeout < 0 {
		return nil, fmt.Errorf("idemq/redisfast: TTL %s must be at least 1s and Timeout %s not negative", cfg.TTL, cfg.Timeout)
	}
	return &FastPath{c: cfg.Client, prefix: cfg.Prefix, ttl: cfg.TTL, timeout: cfg.Timeout}, nil
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

// Lookup implements dedup.FastPath with one MGET of both keys.
func (f *FastPath) Lookup(ctx context.Context, id dedup.Identity) (dedup.FastPathEntry, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	keys := []string{f.Key(id.Scope, "m", id.MessageID)}
	if id.BusinessKey != "" {
		keys = append(keys, f.Key(id.Scope, "b", id.BusinessKey))
	}
	vals, err := f.c.MGet(ctx, keys...).Result()
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
// pipeline.
func (f *FastPath) Remember(ctx context.Context, id dedup.Identity, e dedup.FastPathEntry) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	v := encode(e)
	_, err := f.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, f.Key(id.Scope, "m", id.MessageID), v, f.ttl)
		if id.BusinessKey != "" {
			p.Set(ctx, f.Key(id.Scope, "b", id.BusinessKey), v, f.ttl)
		}
		return nil
	})
	return err
}
