package pgstore

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// poolerPool is a pool in mode that never connects (pgxpool connects
// lazily; nothing here may reach a server).
func poolerPool(t *testing.T, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://u@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestTransactionPoolerConfig: with Config.TransactionPooler, New refuses
// the pgx default exec mode (named prepared statements) and DescribeExec,
// and Migrate and RunMaintenance (session advisory locks) refuse to start,
// naming the setting, before they send anything.
func TestTransactionPoolerConfig(t *testing.T) {
	fp := testFingerprinterForPooler(t)
	_, err := New(poolerPool(t, pgx.QueryExecModeCacheStatement), Config{Fingerprinter: fp, TransactionPooler: true})
	if !errors.Is(err, dedup.ErrInvalidConfig) || !strings.Contains(err.Error(), "TransactionPooler") {
		t.Fatalf("New in cache_statement mode: %v, want ErrInvalidConfig naming TransactionPooler", err)
	}
	if _, err := New(poolerPool(t, pgx.QueryExecModeCacheStatement), Config{Fingerprinter: fp}); err != nil {
		t.Fatalf("New without TransactionPooler: %v", err)
	}
	s, err := New(poolerPool(t, pgx.QueryExecModeSimpleProtocol), Config{Fingerprinter: fp, TransactionPooler: true})
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
