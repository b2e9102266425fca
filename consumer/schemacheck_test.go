package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

var errOutdated = errors.New("schema outdated (found version 5, want 6)")

// checkingStore is a fakeStore with a CheckSchema that fails.
type checkingStore struct {
	*fakeStore
	calls int
}

func (s *checkingStore) CheckSchema(context.Context) error { s.calls++; return errOutdated }

// By default Run calls the store's CheckSchema before it fetches: an
// outdated schema stops it at once with that error, nothing fetched, the
// source closed.
func TestRunChecksSchemaFirst(t *testing.T) {
	st := &checkingStore{fakeStore: newFakeStore(&trail{})}
	c, err := New(Config{Scope: "s", Store: st, Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	src := newListSource(Delivery{Lane: "p0", Offset: 1, Message: &dedup.Message{}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Run(ctx, src); !errors.Is(err, errOutdated) {
		t.Fatalf("Run = %v, want the CheckSchema error", err)
	}
	if st.calls != 1 || len(src.ds) != 1 || !src.closed {
		t.Fatalf("CheckSchema called %d times, %d of 1 deliveries left unfetched, source closed %v", st.calls, len(src.ds), src.closed)
	}
}

// With Config.SkipSchemaCheck, Run never calls CheckSchema, and neither
// does Consumer.CheckSchema.
func TestRunSkipSchemaCheck(t *testing.T) {
	st := &checkingStore{fakeStore: newFakeStore(&trail{})}
	c, err := New(Config{Scope: "s", Store: st, SkipSchemaCheck: true, Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.Run(ctx, newListSource()); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if err := c.CheckSchema(ctx); err != nil {
		t.Fatalf("Consumer.CheckSchema with SkipSchemaCheck = %v", err)
	}
	if st.calls != 0 {
		t.Fatalf("CheckSchema called %d times with Config.SkipSchemaCheck", st.calls)
	}
}
