package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/testkit"
	"github.com/jackc/pgx/v5"
)

// TestTransactionPoolerConfig: with Config.TransactionPooler, New refuses
// the pgx default exec mode, Migrate refuses to start (a session advisory
// lock), and NewRelay refuses LISTEN, each naming the setting.
func TestTransactionPoolerConfig(t *testing.T) {
	_, err := New(testkit.LazyPool(t, pgx.QueryExecModeCacheStatement), Config{TransactionPooler: true})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "TransactionPooler") {
		t.Fatalf("New in cache_statement mode: %v, want ErrInvalidConfig naming TransactionPooler", err)
	}
	ob, err := New(testkit.LazyPool(t, pgx.QueryExecModeExec), Config{TransactionPooler: true})
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
