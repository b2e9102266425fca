package submittoken

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
)

func TestConfigValidate(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = client.Close() })
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{}, "Client"},
		{Config{Client: client, Prefix: "a:b"}, "Prefix"},
		{Config{Client: client, Prefix: "a b"}, "Prefix"},
		{Config{Client: client, TTL: 500 * time.Millisecond}, "TTL"},
		{Config{Client: client, TTL: 1500 * time.Millisecond}, "TTL"},
		{Config{Client: client, TTL: -time.Second}, "TTL"},
		{Config{Client: client, TTL: MaxTTL + time.Second}, "TTL"},
		{Config{Client: client, UsedTTL: time.Millisecond}, "UsedTTL"},
		{Config{Client: client, UsedTTL: MaxTTL + time.Second}, "UsedTTL"},
	} {
		err := c.cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: err = %v, want ErrInvalidConfig naming %s", c.cfg, err, c.field)
		}
		if _, nerr := New(c.cfg); nerr == nil || nerr.Error() != err.Error() {
			t.Errorf("New(%+v) = %v, want Validate's %v", c.cfg, nerr, err)
		}
	}
	s, err := New(Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Config(); got.Prefix != DefaultPrefix || got.TTL != DefaultTTL || got.UsedTTL != DefaultUsedTTL {
		t.Errorf("defaults = %+v", got)
	}
}

// Malformed tokens and bad scopes are refused without a Redis call (the
// client points at a closed port: a call would fail with a dial error).
func TestRefusedWithoutRedis(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = client.Close() })
	s, err := New(Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	good := strings.Repeat("A", TokenLen)
	for _, tok := range []string{"", "abc", good + "A", good[1:] + "=", good[1:] + "+", good[1:] + "/", good[1:] + ":", good[1:] + "é"[:1]} {
		if err := s.Consume(ctx, "checkout", tok); !errors.Is(err, ErrTokenUnknown) {
			t.Errorf("Consume(%q) = %v, want ErrTokenUnknown", tok, err)
		}
	}
	for _, scope := range []string{"", strings.Repeat("s", MaxScopeBytes+1), "a\nb", "a\x00b", "a\x7fb"} {
		if err := s.Consume(ctx, scope, good); !errors.Is(err, ErrInvalidScope) {
			t.Errorf("Consume scope %q = %v, want ErrInvalidScope", scope, err)
		}
		if _, err := s.Issue(ctx, scope); !errors.Is(err, ErrInvalidScope) {
			t.Errorf("Issue scope %q = %v, want ErrInvalidScope", scope, err)
		}
	}
	if err := s.Consume(ctx, "checkout", good); err == nil || errors.Is(err, ErrTokenUnknown) || errors.Is(err, ErrTokenUsed) {
		t.Errorf("Consume with Redis unreachable = %v, want the Redis error", err)
	}
	if st := s.Stats(); st.Unknown != 8 || st.Errors != 1 {
		t.Errorf("stats = %+v, want 8 unknown, 1 error", st)
	}
}

// The collector registers with several registries, and several Stores
// register with one registry under wrapped labels.
func TestCollectorRegistersSeveralTimes(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = client.Close() })
	a, _ := New(Config{Client: client})
	b, _ := New(Config{Client: client, Prefix: "other"})
	a.stats.reused.Add(2)
	r1, r2 := prometheus.NewPedanticRegistry(), prometheus.NewPedanticRegistry()
	r1.MustRegister(a.Collector())
	r2.MustRegister(a.Collector())
	r3 := prometheus.NewPedanticRegistry()
	prometheus.WrapRegistererWith(prometheus.Labels{"form": "checkout"}, r3).MustRegister(a.Collector())
	prometheus.WrapRegistererWith(prometheus.Labels{"form": "transfer"}, r3).MustRegister(b.Collector())
	for _, c := range []struct {
		r    *prometheus.Registry
		want int
	}{{r1, 5}, {r2, 5}, {r3, 10}} { // 1 issued + 4 consume results, per Store
		if n, err := testutil.GatherAndCount(c.r); err != nil || n != c.want {
			t.Errorf("gathered %d series (%v), want %d", n, err, c.want)
		}
	}
	want := `
# HELP idemq_submit_token_consumes_total submittoken.Store.Consume calls by result: consumed (first submit), reused (a second submit of a used token), unknown (never issued, expired or malformed), error (Redis failed).
# TYPE idemq_submit_token_consumes_total counter
idemq_submit_token_consumes_total{result="consumed"} 0
idemq_submit_token_consumes_total{result="error"} 0
idemq_submit_token_consumes_total{result="reused"} 2
idemq_submit_token_consumes_total{result="unknown"} 0
`
	if err := testutil.GatherAndCompare(r1, strings.NewReader(want), "idemq_submit_token_consumes_total"); err != nil {
		t.Error(err)
	}
}

func TestPGConfigValidate(t *testing.T) {
	long := strings.Repeat("t", 64)
	for _, c := range []struct {
		cfg   PGConfig
		field string
	}{
		{PGConfig{}, "Table"},
		{PGConfig{Table: pgx.Identifier{"a", "b", "c", "d"}}, "Table"},
		{PGConfig{Table: pgx.Identifier{"shop", ""}}, "Table[1]"},
		{PGConfig{Table: pgx.Identifier{long}}, "Table[0]"},
		{PGConfig{Table: pgx.Identifier{"a\x00b"}}, "Table[0]"},
		{PGConfig{Table: pgx.Identifier{"tokens"}, TTL: time.Millisecond}, "TTL"},
		{PGConfig{Table: pgx.Identifier{"tokens"}, TTL: MaxTTL + time.Second}, "TTL"},
		{PGConfig{Table: pgx.Identifier{"tokens"}, UsedTTL: -time.Second}, "UsedTTL"},
	} {
		if _, err := NewPG(c.cfg); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("NewPG(%+v) = %v, want ErrInvalidConfig naming %s", c.cfg, err, c.field)
		}
	}
	s, err := NewPG(PGConfig{Table: pgx.Identifier{"shop", "submit_tokens"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Config(); got.TTL != DefaultTTL || got.UsedTTL != DefaultUsedTTL {
		t.Errorf("defaults = %+v", got)
	}
	// Malformed tokens, bad scopes and an empty owner are refused before
	// any statement (db is nil: a statement would panic).
	if err := s.Consume(t.Context(), nil, "checkout", "short"); !errors.Is(err, ErrTokenUnknown) {
		t.Errorf("Consume of a malformed token = %v, want ErrTokenUnknown", err)
	}
	if err := s.Consume(t.Context(), nil, "", strings.Repeat("A", TokenLen)); !errors.Is(err, ErrInvalidScope) {
		t.Errorf("Consume with an empty scope = %v, want ErrInvalidScope", err)
	}
	if _, err := s.Purge(t.Context(), nil, 0); err == nil {
		t.Error("Purge with limit 0: no error")
	}
	rs, _ := New(Config{Client: redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})})
	if err := rs.ConsumeFor(t.Context(), "checkout", strings.Repeat("A", TokenLen), ""); !errors.Is(err, ErrInvalidScope) {
		t.Errorf("ConsumeFor with an empty owner = %v, want ErrInvalidScope", err)
	}
	if ok, err := rs.Release(t.Context(), "checkout", "short", "owner"); ok || err != nil {
		t.Errorf("Release of a malformed token = %v, %v; want false, nil", ok, err)
	}
}

// PGStore.Consume without a transaction (httpidem's lease mode) is an
// error, not a panic.
func TestPGConsumeNilDB(t *testing.T) {
	s, err := NewPG(PGConfig{Table: pgx.Identifier{"submit_tokens"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Consume(t.Context(), nil, "checkout", strings.Repeat("A", TokenLen)); err == nil || errors.Is(err, ErrTokenUnknown) || !strings.Contains(err.Error(), "no transaction") {
		t.Fatalf("Consume with a nil db = %v; want the no-transaction error", err)
	}
}
