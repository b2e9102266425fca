package redisfast

import (
	"errors"
	"time"

	"bytes"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
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
	if _, err := New(Config{}); err == nil {
		t.Fatal("nil client accepted")
	}
}

func TestStoreRefusesTTLAboveRetention(t *testing.T) {
	fast, err := New(Config{Client: redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), TTL: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("0123456789abcdef")})
	_, err = dedup.NewStore(&pgxpool.Pool{}, dedup.Config{Fingerprinter: fp, FastPath: fast}) // SucceededRetention 7d
	if !errors.Is(err, dedup.ErrInvalidConfig) {
		t.Fatalf("TTL 30d over retention 7d: err = %v", err)
	}
}
