package submittoken

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// TokenBytes is the number of random bytes in a token (256 bits, from
// crypto/rand); TokenLen is the length of its text, base64url without
// padding.
const (
	TokenBytes = 32
	TokenLen   = 43 // base64.RawURLEncoding.EncodedLen(TokenBytes)
)

var (
	// ErrTokenUsed is returned by Consume for a token of the scope that was
	// consumed before: a second submit of the same form. Answer 409 Conflict
	// (or let the Idempotency-Key layer replay the first response).
	ErrTokenUsed = errors.New("submittoken: token already used")
	// ErrTokenUnknown is returned by Consume for a token that was never
	// issued in this scope, has expired (Config.TTL), was used longer than
	// Config.UsedTTL ago, or is not a token at all (wrong length or
	// characters; refused without a Redis call). Re-render the form with a
	// fresh token.
	ErrTokenUnknown = errors.New("submittoken: token unknown or expired")
	// ErrInvalidScope is returned by Issue and Consume for an empty scope,
	// one longer than MaxScopeBytes, or one with control characters.
	ErrInvalidScope = errors.New("submittoken: invalid scope")
)

// Store issues and consumes one-time submit tokens in Redis. It is safe for
// concurrent use.
type Store struct {
	cfg   Config
	stats counters
}

type counters struct {
	issued, consumed, reused, unknown, errors, released atomic.Int64
}

// New returns a Store for cfg (defaults applied), or an error wrapping
// ErrInvalidConfig that names the invalid field. It makes no Redis call.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Store{cfg: cfg.withDefaults()}, nil
}

// Config returns the Store's configuration with the defaults applied.
func (s *Store) Config() Config { return s.cfg }

// issueAttempts bounds Issue's SET NX: a refused SET means the key exists,
// which for a fresh 256-bit token only happens when go-redis sent the SET
// again after a lost reply (the first run stored it; that token is then
// never handed out and expires). A fresh token is drawn each time.
const issueAttempts = 3

// Issue returns a fresh token for scope, stored in Redis for Config.TTL
// (SET NX EX). Errors: ErrInvalidScope, a crypto/rand failure, or the Redis
// error (wrapped).
func (s *Store) Issue(ctx context.Context, scope string) (string, error) {
	token, err := issue(scope, func(token string) (bool, error) {
		return s.cfg.Client.SetNX(ctx, s.key(scope, token), issuedValue, s.cfg.TTL).Result()
	})
	if err == nil {
		s.stats.issued.Add(1)
	}
	return token, err
}

// issue draws fresh tokens for scope until store, which writes one only if
// it is new, takes one (at most issueAttempts): the token, or
// ErrInvalidScope, a crypto/rand failure or store's error, wrapped.
func issue(scope string, store func(token string) (bool, error)) (string, error) {
	if err := checkScope(scope); err != nil {
		return "", err
	}
	for range issueAttempts {
		var b [TokenBytes]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("submittoken: issue: %w", err)
		}
		token := base64.RawURLEncoding.EncodeToString(b[:])
		ok, err := store(token)
		if err != nil {
			return "", fmt.Errorf("submittoken: issue: %w", err)
		}
		if ok {
			return token, nil
		}
	}
	return "", fmt.Errorf("submittoken: issue: %d fresh tokens were all taken", issueAttempts)
}

// Consume uses token in scope, once: nil the first time (the caller goes on
// with the submit), then ErrTokenUsed. Under an Idempotency-Key use
// ConsumeFor instead (see the package documentation): Consume refuses the
// retry of a request whose first attempt failed. ErrTokenUnknown for a token that was
// never issued in scope, has expired or is malformed; ErrInvalidScope; or
// the Redis error (wrapped: the outcome is unknown, see the package
// documentation). One round trip (a Lua script); safe under go-redis's
// command retries: a second run of the same call answers nil again.
func (s *Store) Consume(ctx context.Context, scope, token string) error {
	if err := checkScope(scope); err != nil {
		return err
	}
	if !wellFormed(token) {
		s.stats.unknown.Add(1)
		return ErrTokenUnknown
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return fmt.Errorf("submittoken: consume: %w", err)
	}
	return s.consume(ctx, scope, token, "c:"+base64.RawURLEncoding.EncodeToString(id[:]))
}

// ConsumeFor uses token in scope for owner, the request it is submitted
// with (give it the Idempotency-Key's identity: httpidem.Info's
// DownstreamKey). nil the first time, and again for every later call of
// the same owner (a retry of the same request goes on, and the key layer
// replays or reruns it); ErrTokenUsed for any other owner, or when Consume
// used the token; ErrTokenUnknown and ErrInvalidScope as Consume; an empty
// owner is ErrInvalidScope too. The token stays the owner's until it
// expires, so a crash between ConsumeFor and the commit of the request's
// work loses nothing: the request's retry (same key) gets the token, and
// no other request can. When the request's attempt rolled back, Release
// gives the token back for any owner. One round trip; safe under
// go-redis's command retries.
func (s *Store) ConsumeFor(ctx context.Context, scope, token, owner string) error {
	if err := checkScope(scope); err != nil {
		return err
	}
	if owner == "" {
		return fmt.Errorf("%w: empty owner", ErrInvalidScope)
	}
	if !wellFormed(token) {
		s.stats.unknown.Add(1)
		return ErrTokenUnknown
	}
	return s.consume(ctx, scope, token, ownerID(owner))
}

// Release gives back a token that ConsumeFor used for owner, when the
// owner's attempt rolled back (its handler answered a retryable failure):
// the token is unused again, with the rest of its key's TTL (at least
// Config.UsedTTL from its use), and the next submit of any owner may
// consume it. It reports whether it released the token: false when the
// token is unused, used by another owner or by Consume, or unknown.
// Release only what is known to have rolled back: a request whose outcome
// is unknown (the COMMIT's answer was lost) keeps the token, which its
// retry gets again. Never Release under the httpidem middleware's lease
// mode: a failed attempt's provider call may have happened, and only the
// same key (the same downstream key) may retry it. Errors: ErrInvalidScope, or the Redis error (wrapped).
func (s *Store) Release(ctx context.Context, scope, token, owner string) (bool, error) {
	if err := checkScope(scope); err != nil {
		return false, err
	}
	if owner == "" {
		return false, fmt.Errorf("%w: empty owner", ErrInvalidScope)
	}
	if !wellFormed(token) {
		return false, nil
	}
	n, err := releaseScript.Run(ctx, s.cfg.Client, []string{s.key(scope, token)}, ownerID(owner)).Int()
	if err != nil {
		return false, fmt.Errorf("submittoken: release: %w", err)
	}
	if n == 1 {
		s.stats.released.Add(1)
	}
	return n == 1, nil
}

// ownerID is the value part that marks a token used by owner: "o:" and
// base64url of SHA-256 over owner (fixed length, reveals nothing).
func ownerID(owner string) string {
	h := sha256.Sum256([]byte(owner))
	return "o:" + base64.RawURLEncoding.EncodeToString(h[:])
}

// consume runs consumeScript for a consumer ID ("c:…" for one Consume
// call, "o:…" for an owner).
func (s *Store) consume(ctx context.Context, scope, token, id string) error {
	res, err := consumeScript.Run(ctx, s.cfg.Client, []string{s.key(scope, token)},
		id, s.cfg.UsedTTL.Milliseconds()).Int()
	if err != nil {
		s.stats.errors.Add(1)
		return fmt.Errorf("submittoken: consume: %w", err)
	}
	switch res {
	case 1:
		s.stats.consumed.Add(1)
		return nil
	case 2:
		s.stats.reused.Add(1)
		return ErrTokenUsed
	default:
		s.stats.unknown.Add(1)
		return ErrTokenUnknown
	}
}

// issuedValue is the value of an issued, unused token; a consumed one holds
// "used:<consumer ID>": "c:<Consume call ID>" or "o:<owner hash>".
const issuedValue = "issued"

// consumeScript: KEYS[1] the token's key; ARGV[1] the Consume call's ID,
// ARGV[2] UsedTTL in ms. Returns 1 consumed by this call (now, or by an
// earlier run of the same call that go-redis sent again), 2 consumed by
// another call, 0 unknown.
// releaseScript: KEYS[1] the token's key; ARGV[1] the owner's consumer
// ID. Sets the value back to issued (keeping the TTL) when the owner holds
// it; returns 1 when released, else 0.
var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v ~= 'used:' .. ARGV[1] then return 0 end
redis.call('SET', KEYS[1], 'issued', 'KEEPTTL')
return 1
`)

var consumeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local mine = 'used:' .. ARGV[1]
if v == mine then return 1 end
if v ~= 'issued' then return 2 end
local ttl = redis.call('PTTL', KEYS[1])
local keep = tonumber(ARGV[2])
if ttl < keep then ttl = keep end
redis.call('SET', KEYS[1], mine, 'PX', ttl)
return 1
`)

func (s *Store) key(scope, token string) string {
	return s.cfg.Prefix + ":submit:" + scope + ":" + token
}

func checkScope(scope string) error {
	if scope == "" || len(scope) > MaxScopeBytes {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidScope, len(scope), MaxScopeBytes)
	}
	for i := 0; i < len(scope); i++ {
		if c := scope[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: control character at byte %d", ErrInvalidScope, i)
		}
	}
	return nil
}

// wellFormed reports whether token could have come from Issue.
func wellFormed(token string) bool {
	if len(token) != TokenLen {
		return false
	}
	for i := 0; i < len(token); i++ {
		switch c := token[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}
