package pgstore

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/testkit"
	"github.com/jackc/pgx/v5"
)

// TestTransactionPoolerConfig: with Config.TransactionPooler, New refuses
// the pgx default exec mode (named prepared statements) and DescribeExec,
// and Migrate and RunMaintenance (session advisory locks) refuse to start,
// naming the setting, before they send anything.
func TestTransactionPoolerConfig(t *testing.T) {
	fp := testFingerprinterForPooler(t)
	_, err := New(testkit.LazyPool(t, pgx.QueryExecModeCacheStatement), Config{Fingerprinter: fp, TransactionPooler: true})
	if !errors.Is(err, dedup.ErrInvalidConfig) || !strings.Contains(err.Error(), "TransactionPooler") {
		t.Fatalf("New in cache_statement mode: %v, want ErrInvalidConfig naming TransactionPooler", err)
	}
	if _, err := New(testkit.LazyPool(t, pgx.QueryExecModeCacheStatement), Config{Fingerprinter: fp}); err != nil {
		t.Fatalf("New without TransactionPooler: %v", err)
	}
	s, err := New(testkit.LazyPool(t, pgx.QueryExecModeSimpleProtocol), Config{Fingerprinter: fp, TransactionPooler: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); !errors.Is(err, ErrNeedsSession) || !strings.Contains(err.Error(), "TransactionPooler") {
		t.Errorf("Migrate: %v, want ErrNeedsSession naming TransactionPooler", err)
	}
	if err := s.RunMaintenance(t.Context(), MaintenanceConfig{}); !errors.Is(err, ErrNeedsSession) || !strings.Contains(err.Error(), "TransactionPooler") {
		t.Errorf("RunMaintenance: %v, want ErrNeedsSession naming TransactionPooler", err)
	}
}

func testFingerprinterForPooler(t *testing.T) *dedup.Fingerprinter {
	t.Helper()
	f, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("pooler-test-secret-0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	return f
}
