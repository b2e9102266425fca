//go:build !race

// The race detector adds allocations of its own (and makes sync.Pool drop
// entries at random), so allocation counts are checked without it: make
// test-unit runs this file in a pass without -race; `go test -race` leaves it out.

package consumer

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// TestHandleAllocations: a delivery through the runtime with the default
// (no-op) tracer costs at most 3 allocations of idemq's own, fingerprint
// included (measured: 2; it was 18 with a span built per delivery, a fresh
// HMAC state per fingerprint and a context value per delivery).
func TestHandleAllocations(t *testing.T) {
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Scope: "allocs", Store: f0Store{fp: fp}, CrashLoop: CrashLoopConfig{Off: true},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	msg := &dedup.Message{Topic: "orders", Payload: []byte(`{"amount":100}`)}
	d := Delivery{Message: msg, MessageID: "order-42", Position: "orders/0/42", Lane: "orders/0", Offset: 42}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(200, func() {
		msg.Source = ""
		if _, err := c.Handle(ctx, d); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 3 {
		t.Fatalf("Handle allocates %.1f times per delivery; want at most 3", allocs)
	}
}
