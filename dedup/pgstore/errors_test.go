package pgstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5/pgconn"
)

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
	fp, _ := dedup.NewFingerprinter(nil, k1)
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
		{Fingerprinter: fp, StatementTimeout: time.Millisecond},
		{Fingerprinter: fp, StatementTimeout: 2 * time.Hour},
	}
	for i, c := range bad {
		if err := c.withDefaults().validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("config %d accepted: %v", i, err)
		}
	}
	s := &Store{cfg: good.withDefaults()}
	if err := s.ValidateRetention(8 * 24 * time.Hour); !errors.Is(err, dedup.ErrRetentionTooShort) {
		t.Fatalf("retention 7d vs horizon 8d: %v", err)
	}
	if err := s.ValidateRetention(7 * 24 * time.Hour); err != nil { // Kafka's default retention.ms
		t.Fatal(err)
	}
	if err := s.ValidateRetention(24 * time.Hour); err != nil {
		t.Fatal(err)
	}
}

func TestIsUniqueViolation(t *testing.T) {
	uv := &pgconn.PgError{Code: "23505", ConstraintName: "orders_order_no_key"}
	if !IsUniqueViolation(fmt.Errorf("w: %w", uv), "orders_order_no_key") || IsUniqueViolation(uv, "other") || !IsUniqueViolation(uv, "") {
		t.Fatal("IsUniqueViolation")
	}
}
