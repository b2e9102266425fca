package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lazyPool is a pool in mode that never connects (pgxpool connects lazily;
// nothing here may reach a server).
func lazyPool(t *testing.T, mode pgx.QueryExecMode) *pgxpool.Pool {
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
// the pgx default exec mode, Migrate refuses to start (a session advisory
// lock), and NewRelay refuses LISTEN, each naming the setting.
func TestTransactionPoolerConfig(t *testing.T) {
	_, err := New(lazyPool(t, pgx.QueryExecModeCacheStatement), Config{TransactionPooler: true})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "TransactionPooler") {
		t.Fatalf("New in cache_statement mode: %v, want ErrInvalidConfig naming TransactionPooler", err)
	}
	ob, err := New(lazyPool(t, pgx.QueryExecModeExec), Config{TransactionPooler: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(t.Context()); !errors.Is(err, ErrNeedsSession) || !strings.Contains(err.Error(), "TransactionPooler") {
		t.Errorf("Migrate: %v, want ErrNeedsSession naming TransactionPooler", err)
	}
	pub := PublisherFunc(func(context.Context, []Envelope) error { return nil })
	if _, err := NewRelay(ob, pub, RelayConfig{}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "DisableListen") {
		t.Errorf("NewRelay with LISTEN: %v, want ErrInvalidConfig naming DisableListen", err)
	}
	if _, err := NewRelay(ob, pub, RelayConfig{DisableListen: true}); err != nil {
		t.Errorf("NewRelay with DisableListen: %v", err)
	}
}
