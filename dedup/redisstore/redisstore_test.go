package redisstore

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/redis/go-redis/v9"
)

func testFingerprinter(t *testing.T) *dedup.Fingerprinter {
	t.Helper()
	f, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestNewValidates(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	fp := testFingerprinter(t)
	bad := []Config{
		{Fingerprinter: fp},
		{Client: c},
		{Client: c, Fingerprinter: fp, MaxAttempts: -1},
		{Client: c, Fingerprinter: fp, SucceededRetention: time.Second},
		{Client: c, Fingerprinter: fp, SucceededRetention: 48 * time.Hour, FailedRetention: time.Hour},
		{Client: c, Fingerprinter: fp, MaxErrorBytes: 10},
		{Client: c, Fingerprinter: fp, Prefix: "app{eu}"},
	}
	for i, cfg := range bad {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("config %d: err = %v, want ErrInvalidConfig", i, err)
		}
	}
	s, err := New(Config{Client: c, Fingerprinter: fp})
	if err != nil {
		t.Fatal(err)
	}
	got := s.Config()
	if got.Prefix != "idemq" || got.MaxAttempts != 5 || got.SucceededRetention != 7*24*time.Hour || got.FailedRetention != 30*24*time.Hour {
		t.Fatalf("defaults = %+v", got)
	}
	if err := s.ValidateRetention(8 * 24 * time.Hour); !errors.Is(err, dedup.ErrRetentionTooShort) || !strings.Contains(err.Error(), "168h0m0s") {
		t.Fatalf("ValidateRetention(8d) = %v, want ErrRetentionTooShort naming 168h", err)
	}
	if err := s.ValidateRetention(24 * time.Hour); err != nil {
		t.Fatalf("ValidateRetention(1d) = %v", err)
	}
}

func TestStreamIDRoundTrip(t *testing.T) {
	for _, id := range []string{"1732900000000-0", "1732900000000-17", "1-999999"} {
		n := streamID(id)
		if n == 0 || entryID(n) != id {
			t.Errorf("streamID(%s) = %d, entryID back = %s", id, n, entryID(n))
		}
	}
	if streamID("1732900000000-0") >= streamID("1732900000000-1") || streamID("1732900000000-999") >= streamID("1732900000001-0") {
		t.Error("dead-letter IDs must order like stream IDs")
	}
	for _, bad := range []string{"", "x", "1-1000000", "a-1"} {
		if streamID(bad) != 0 {
			t.Errorf("streamID(%q) = %d, want 0", bad, streamID(bad))
		}
	}
}

// All keys of a scope share one hash slot (the scripts need it on Redis
// Cluster), and different scopes get different tags.
func TestKeysShareAHashSlot(t *testing.T) {
	s := &Store{cfg: Config{Prefix: "p"}}
	k := s.keysOf("billing {eu}")
	tag := func(key string) string {
		i := strings.IndexByte(key, '{')
		j := strings.IndexByte(key[i:], '}')
		return key[i+1 : i+j]
	}
	want := tag(k.record("m-1"))
	for _, key := range []string{k.lease("m-1"), k.businessKey("order-7"), k.deadLetters(), k.record("other")} {
		if tag(key) != want {
			t.Errorf("%s has tag %q, want %q", key, tag(key), want)
		}
	}
	if tag(s.keysOf("shipping").record("m-1")) == want {
		t.Error("two scopes share a tag")
	}
	if k.bkOrRecord("", "R") != "R" || k.bkOrRecord("b", "R") != k.businessKey("b") {
		t.Error("bkOrRecord")
	}
}
