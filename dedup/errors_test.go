package dedup

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestErrorClass(t *testing.T) {
	uv := &pgconn.PgError{Code: "23505", ConstraintName: "orders_order_no_key"}
	cases := map[string]error{
		"pg:23505:orders_order_no_key":           uv,
		"pg:23505:orders_order_no_key (wrapped)": fmt.Errorf("create order: %w", uv),
		"permanent:error":                        Permanent(errors.New("bad amount")),
		"permanent:pg:23505:orders_order_no_key": Permanent(fmt.Errorf("x: %w", uv)),
		"timeout":                                fmt.Errorf("call: %w", context.DeadlineExceeded),
		"panic":                                  &PanicError{Value: "boom"},
		"error":                                  errors.New("plain"),
	}
	for want, err := range cases {
		if i := len(want) - len(" (wrapped)"); i > 0 && want[i:] == " (wrapped)" {
			want = want[:i]
		}
		if got := ErrorClass(err); got != want {
			t.Errorf("ErrorClass(%v) = %q, want %q", err, got, want)
		}
	}
	if !IsUniqueViolation(fmt.Errorf("w: %w", uv), "orders_order_no_key") || IsUniqueViolation(uv, "other") {
		t.Fatal("IsUniqueViolation")
	}
	if Permanent(nil) != nil || !IsPermanent(fmt.Errorf("w: %w", Permanent(errors.New("x")))) {
		t.Fatal("Permanent")
	}
}

func TestClip(t *testing.T) {
	s := clip("ab\x00c\xff"+string(make([]byte, 100)), 64)
	if len(s) > 64 {
		t.Fatalf("len %d", len(s))
	}
	for _, r := range s {
		if r == 0 {
			t.Fatal("NUL kept")
		}
	}
}

func TestConfigValidation(t *testing.T) {
	fp, _ := NewFingerprinter(nil, k1)
	good := Config{Fingerprinter: fp}
	if err := good.withDefaults().validate(); err != nil {
		t.Fatalf("defaults rejected: %v", err)
	}
	bad := []Config{
		{},                                      // no fingerprinter
		{Fingerprinter: fp, Schema: "Bad-Name"}, // not an identifier
		{Fingerprinter: fp, RecordsTable: "x", DeadLettersTable: "x"},
		{Fingerprinter: fp, MaxAttempts: -1},
		{Fingerprinter: fp, SucceededRetention: time.Second},
		{Fingerprinter: fp, SucceededRetention: time.Hour, FailedFinalRetention: time.Minute},
	}
	for i, c := range bad {
		if err := c.withDefaults().validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("config %d accepted: %v", i, err)
		}
	}
	s := &Store{cfg: good.withDefaults()}
	if err := s.ValidateRetention(8 * 24 * time.Hour); !errors.Is(err, ErrRetentionTooShort) {
		t.Fatalf("retention 7d vs horizon 8d: %v", err)
	}
	if err := s.ValidateRetention(7 * 24 * time.Hour); err != nil { // Kafka's default retention.ms
		t.Fatal(err)
	}
	if err := s.ValidateRetention(24 * time.Hour); err != nil {
		t.Fatal(err)
	}
}
