package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// Config.Maintenance runs while Run runs: it starts with Run, its context
// ends when Run shuts down, and Run returns only after it returned.
func TestRunRunsMaintenance(t *testing.T) {
	started := make(chan struct{})
	stopping := make(chan struct{})
	release := make(chan struct{})
	returned := make(chan struct{})
	c, err := New(Config{Scope: "s", Store: newFakeStore(&trail{}), Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil },
		Maintenance: func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			close(stopping)
			<-release // Run must wait here
			close(returned)
			return errors.New("stopped")
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, newListSource()) }()
	<-started
	select {
	case <-returned:
		t.Fatal("maintenance stopped while Run was running")
	default:
	}
	cancel()
	<-stopping
	// Give a Run that does not wait the time to return (with the wait, it
	// cannot, however long this is).
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while the maintenance function was still running", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	select {
	case <-returned:
	default:
		t.Fatal("Run returned before the maintenance function did")
	}
}
