package redisfast

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
)

func TestEncodeDecode(t *testing.T) {
	e := dedup.FastPathEntry{KeyID: "2026:11", Fingerprint: []byte{1, 2, 0xff}}
	got, ok := decode(encode(e))
	if !ok || got.KeyID != e.KeyID || !bytes.Equal(got.Fingerprint, e.Fingerprint) {
		t.Fatalf("round trip = %+v %v", got, ok)
	}
	for _, v := range []string{"", "claim:worker-1", "s1:", "s1:k1:", "s1:k1:zz", "s2:k1:00"} {
		if _, ok := decode(v); ok {
			t.Errorf("decode(%q) accepted a value that is not a SUCCEEDED entry", v)
		}
	}
}

func TestNewValidates(t *testing.T) {
	client := redis.NewClient(ClientOptions("127.0.0.1:1"))
	t.Cleanup(func() { _ = client.Close() })
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{}, "Client"},
		{Config{Client: client, TTL: time.Millisecond}, "TTL"},
		{Config{Client: client, Timeout: -time.Millisecond}, "Timeout"},
		{Config{Client: client, Timeout: 2 * time.Second}, "Timeout"},
		{Config{Client: client, BreakerFailures: -1}, "BreakerFailures"},
		{Config{Client: client, BreakerFailures: 1001}, "BreakerFailures"},
		{Config{Client: client, Timeout: time.Second, BreakerCooldown: 5 * time.Second}, "BreakerCooldown"},
		{Config{Client: client, BreakerCooldown: 400 * time.Millisecond}, "BreakerCooldown"},
		{Config{Client: client, BreakerCooldown: 11 * time.Minute}, "BreakerCooldown"},
	} {
		_, err := New(c.cfg)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: err = %v, want ErrInvalidConfig naming %s", c.cfg, err, c.field)
		}
	}
	if _, err := New(Config{Client: client, Timeout: time.Second, BreakerCooldown: 10 * time.Second}); err != nil {
		t.Errorf("Timeout at its maximum with a 10s cool-down: %v", err)
	}
	// The default cool-down grows with Timeout so the default always fits.
	f, err := New(Config{Client: client, Timeout: time.Second})
	if err != nil {
		t.Fatalf("Timeout 1s with the default cool-down: %v", err)
	}
	if f.br.cooldown != 10*time.Second {
		t.Errorf("Timeout 1s: default cool-down %v, want 10s", f.br.cooldown)
	}
}

// FailFast sets what the fast path needs and keeps smaller timeouts.
func TestFailFast(t *testing.T) {
	o := FailFast(&redis.Options{Addr: "x:1", ReadTimeout: 20 * time.Millisecond, WriteTimeout: -1, DialTimeout: 5 * time.Second})
	if o.DialerRetries != 1 || o.MaxRetries != -1 || !o.ContextTimeoutEnabled {
		t.Fatalf("retries and deadlines: %+v", o)
	}
	if o.ReadTimeout != 20*time.Millisecond || o.WriteTimeout != MaxTimeout || o.DialTimeout != MaxTimeout || o.PoolTimeout != MaxTimeout {
		t.Fatalf("timeouts: read %s write %s dial %s pool %s", o.ReadTimeout, o.WriteTimeout, o.DialTimeout, o.PoolTimeout)
	}
	co := FailFastCluster(&redis.ClusterOptions{Addrs: []string{"x:1"}})
	if co.DialerRetries != 1 || co.MaxRetries != -1 || !co.ContextTimeoutEnabled || co.ReadTimeout != MaxTimeout {
		t.Fatalf("cluster: %+v", co)
	}
}

// New warns once about a client with go-redis's default retries and
// deadlines, naming what each costs, and not about a FailFast client.
func TestNewWarnsAboutClientThatDoesNotFailFast(t *testing.T) {
	for _, c := range []struct {
		name     string
		client   redis.UniversalClient
		problems []string
	}{
		{"defaults", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), []string{"ContextTimeoutEnabled", "DialerRetries is 5", "MaxRetries is 3"}},
		{"cluster defaults", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), []string{"ContextTimeoutEnabled", "DialerRetries is 5"}},
		{"fail fast", redis.NewClient(ClientOptions("127.0.0.1:1")), nil},
		{"fail fast cluster", redis.NewClusterClient(FailFastCluster(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Cleanup(func() { _ = c.client.Close() })
			logs := &logRecorder{}
			if _, err := New(Config{Client: c.client, Logger: slog.New(logs)}); err != nil {
				t.Fatal(err)
			}
			var problems string
			logs.mu.Lock()
			for _, r := range logs.recs {
				r.Attrs(func(a slog.Attr) bool {
					if a.Key == "problems" {
						problems = a.Value.String()
					}
					return true
				})
			}
			logs.mu.Unlock()
			if got := logs.count(slog.LevelWarn); got != min(len(c.problems), 1) {
				t.Fatalf("%d warnings, want %d", got, min(len(c.problems), 1))
			}
			for _, p := range c.problems {
				if !strings.Contains(problems, p) {
					t.Errorf("problems %q do not name %q", problems, p)
				}
			}
		})
	}
}

func TestStoreRefusesTTLAboveRetention(t *testing.T) {
	client := redis.NewClient(ClientOptions("127.0.0.1:1"))
	t.Cleanup(func() { _ = client.Close() })
	fast, err := New(Config{Client: client, TTL: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("0123456789abcdef")})
	_, err = pgstore.New(&pgxpool.Pool{}, pgstore.Config{Fingerprinter: fp, FastPath: fast}) // SucceededRetention 7d
	if !errors.Is(err, dedup.ErrInvalidConfig) {
		t.Fatalf("TTL 30d over retention 7d: err = %v", err)
	}
}
