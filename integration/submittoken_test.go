package integration

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/faultproxy"
	"github.com/idemq/idemq/submittoken"
	"github.com/redis/go-redis/v9"
)

// tokenStore is a submittoken.Store on the test Redis (at addr when given,
// else TEST_REDIS_ADDR) under a key prefix of the test's own, whose keys are
// deleted when the test ends.
func tokenStore(t *testing.T, addr string, tweak func(*submittoken.Config)) (*submittoken.Store, *redis.Client) {
	t.Helper()
	direct := redis.NewClient(&redis.Options{Addr: redisAddress(t)})
	if addr == "" {
		addr = redisAddress(t)
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	prefix := randomName("st")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if keys, err := direct.Keys(ctx, prefix+":*").Result(); err == nil && len(keys) > 0 {
			_ = direct.Del(ctx, keys...).Err()
		}
		_ = direct.Close()
		_ = c.Close()
	})
	cfg := submittoken.Config{Client: c, Prefix: prefix}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := submittoken.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, direct
}

var tokenPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)

// A token is consumed once: the second submit gets ErrTokenUsed; it is
// unknown in another scope, and a forged token is unknown; tokens are
// URL-safe and distinct; the key expires with the configured TTL.
func TestSubmitTokenIssueConsume(t *testing.T) {
	t.Parallel()
	s, rdb := tokenStore(t, "", nil)
	ctx := context.Background()
	seen := map[string]bool{}
	for range 200 {
		tok, err := s.Issue(ctx, "checkout:session-1")
		if err != nil {
			t.Fatal(err)
		}
		if !tokenPattern.MatchString(tok) || seen[tok] {
			t.Fatalf("token %q: not 43 base64url characters, or issued twice", tok)
		}
		seen[tok] = true
	}
	tok, err := s.Issue(ctx, "checkout:session-1")
	if err != nil {
		t.Fatal(err)
	}
	ttl, err := rdb.TTL(ctx, s.Config().Prefix+":submit:checkout:session-1:"+tok).Result()
	if err != nil || ttl <= submittoken.DefaultTTL-time.Minute || ttl > submittoken.DefaultTTL {
		t.Fatalf("the token's key TTL = %s, %v; want about %s", ttl, err, submittoken.DefaultTTL)
	}
	if err := s.Consume(ctx, "checkout:session-2", tok); !errors.Is(err, submittoken.ErrTokenUnknown) {
		t.Fatalf("consumed in another scope: %v, want ErrTokenUnknown", err)
	}
	if err := s.Consume(ctx, "checkout:session-1", tok); err != nil {
		t.Fatalf("first submit: %v", err)
	}
	for i := range 3 {
		if err := s.Consume(ctx, "checkout:session-1", tok); !errors.Is(err, submittoken.ErrTokenUsed) {
			t.Fatalf("submit %d: %v, want ErrTokenUsed", i+2, err)
		}
	}
	forged := strings.Repeat("A", 43) // well formed, never issued
	if err := s.Consume(ctx, "checkout:session-1", forged); !errors.Is(err, submittoken.ErrTokenUnknown) {
		t.Fatalf("forged token: %v, want ErrTokenUnknown", err)
	}
	if st := s.Stats(); st.Issued != 201 || st.Consumed != 1 || st.Reused != 3 || st.Unknown != 2 || st.Errors != 0 {
		t.Fatalf("stats = %+v; want 201 issued, 1 consumed, 3 reused, 2 unknown", st)
	}
}

// An unused token expires after TTL (unknown); a used one is remembered as
// used for at least UsedTTL, past the token's own expiry.
func TestSubmitTokenExpiry(t *testing.T) {
	t.Parallel()
	s, rdb := tokenStore(t, "", func(c *submittoken.Config) { c.TTL = 2 * time.Second; c.UsedTTL = time.Minute })
	ctx := context.Background()
	unused, err := s.Issue(ctx, "checkout")
	if err != nil {
		t.Fatal(err)
	}
	used, err := s.Issue(ctx, "checkout")
	if err != nil {
		t.Fatal(err)
	}
	usedExpiry := time.Now().Add(2 * time.Second) // no earlier than the TTL the used token was issued with
	if err := s.Consume(ctx, "checkout", used); err != nil {
		t.Fatalf("first submit: %v", err)
	}
	key := func(tok string) string { return s.Config().Prefix + ":submit:checkout:" + tok }
	if ttl, err := rdb.PTTL(ctx, key(used)).Result(); err != nil || ttl <= 2*time.Second {
		t.Fatalf("a used token's key TTL = %s, %v; want UsedTTL (1m), more than the token's 2s", ttl, err)
	}
	deadline := time.Now().Add(time.Minute)
	for rdb.Exists(ctx, key(unused)).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the unused token's key did not expire")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Until(usedExpiry)) // the used token's own TTL has run out too
	if err := s.Consume(ctx, "checkout", unused); !errors.Is(err, submittoken.ErrTokenUnknown) {
		t.Fatalf("expired token: %v, want ErrTokenUnknown", err)
	}
	if err := s.Consume(ctx, "checkout", used); !errors.Is(err, submittoken.ErrTokenUsed) {
		t.Fatalf("a used token past its TTL: %v, want ErrTokenUsed", err)
	}
}

// 50 submits of one token at once: exactly one consumes it, the 49 others
// get ErrTokenUsed. Ten tokens, so a lucky interleaving cannot pass.
func TestSubmitTokenConcurrentConsumes(t *testing.T) {
	t.Parallel()
	s, _ := tokenStore(t, "", nil)
	ctx := context.Background()
	for range 10 {
		tok, err := s.Issue(ctx, "checkout")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, 50)
		for i := range errs {
			wg.Go(func() {
				<-start
				errs[i] = s.Consume(ctx, "checkout", tok)
			})
		}
		close(start)
		wg.Wait()
		won, used := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case errors.Is(err, submittoken.ErrTokenUsed):
				used++
			default:
				t.Fatalf("consume: %v", err)
			}
		}
		if won != 1 || used != 49 {
			t.Fatalf("50 concurrent submits: %d consumed, %d ErrTokenUsed; want 1 and 49", won, used)
		}
	}
	if st := s.Stats(); st.Consumed != 10 || st.Reused != 490 {
		t.Fatalf("stats = %+v; want 10 consumed, 490 reused", st)
	}
}

// Consume's reply is lost and its connection closed (S18's fault, through
// a TCP proxy in front of the real Redis): go-redis sends the script again,
// which finds the token consumed by this very call and answers nil, not
// "unknown" (GETDEL's answer) nor "used". A later submit gets ErrTokenUsed.
func TestSubmitTokenConsumeReplyLost(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, redisAddress(t), faultproxy.RESP)
	s, _ := tokenStore(t, p.Addr(), nil)
	ctx := context.Background()
	// A first token loads the script, so that the lost reply is the
	// script's, not EVALSHA's NOSCRIPT.
	for range 2 {
		warm, err := s.Issue(ctx, "warm-up")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Consume(ctx, "warm-up", warm); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := s.Issue(ctx, "checkout")
	if err != nil {
		t.Fatal(err)
	}
	p.DropReplyOnce(func(req []byte) bool {
		sc, ok := faultproxy.AsScript(req)
		return ok && sc.HasKey(":submit:checkout:"+tok)
	})
	err = s.Consume(ctx, "checkout", tok)
	p.WaitDropped(1)
	if err != nil {
		t.Fatalf("consume whose first reply was lost: %v, want nil", err)
	}
	if err := s.Consume(ctx, "checkout", tok); !errors.Is(err, submittoken.ErrTokenUsed) {
		t.Fatalf("second submit: %v, want ErrTokenUsed", err)
	}
}
