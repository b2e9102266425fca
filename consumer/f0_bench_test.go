package consumer

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// f0Store is the cheapest store the runtime can run on: it fingerprints the
// payload (as every store does) and runs the handler, with no database and
// no allocation of its own. BenchmarkF0 measures the runtime plus the
// fingerprint on it.
type f0Store struct{ fp *dedup.Fingerprinter }

func (s f0Store) Process(ctx context.Context, msg *dedup.Message, h dedup.TxHandler[pgx.Tx]) (dedup.Result, error) {
	if _, _, err := s.fp.Sum(msg.Payload); err != nil {
		return dedup.Result{}, err
	}
	if err := h(ctx, nil, msg); err != nil {
		return dedup.Result{Outcome: dedup.OutcomeRetry, Err: err, Attempts: 1, HandlerCalled: true}, nil
	}
	return dedup.Result{Outcome: dedup.OutcomeProcessed, Status: dedup.StatusSucceeded, Attempts: 1, HandlerCalled: true}, nil
}

func (s f0Store) ProcessBatch(ctx context.Context, msgs []*dedup.Message, h dedup.TxHandler[pgx.Tx]) ([]dedup.Result, error) {
	out := make([]dedup.Result, len(msgs))
	for i, m := range msgs {
		out[i], _ = s.Process(ctx, m, h)
	}
	return out, nil
}

func (s f0Store) ProcessLeased(ctx context.Context, msg *dedup.Message, h dedup.LeaseHandler, _ dedup.LeaseOptions) (dedup.Result, error) {
	return s.Process(ctx, msg, func(ctx context.Context, _ pgx.Tx, m *dedup.Message) error { return h(ctx, m) })
}

func (f0Store) Reject(context.Context, *dedup.Message, string, error) (dedup.Result, error) {
	return dedup.Result{Outcome: dedup.OutcomeDeadLetter, Reason: dedup.ReasonBadInput}, nil
}
func (f0Store) ValidateRetention(time.Duration) error { return nil }
func (f0Store) MaxAttempts() int                      { return 16 }
func (f0Store) SucceededRetention() time.Duration     { return 24 * time.Hour }

// BenchmarkF0 is the runtime and the fingerprint alone, per message, with no
// database: Consumer.Handle in atomic mode on f0Store (identity, the
// middleware chain with the default, no-op tracer and metrics, the
// fingerprint of a 256-byte payload, a handler that does nothing), and the
// fingerprint by itself. allocs/op is idemq's own allocations per message.
func BenchmarkF0(b *testing.B) {
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 256)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	b.Run("Handle", func(b *testing.B) {
		c, err := New(Config{Scope: "bench", Store: f0Store{fp: fp}, CrashLoop: CrashLoopConfig{Off: true},
			Logger:  slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})),
			Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		msg := &dedup.Message{Topic: "orders", Payload: payload}
		d := Delivery{Message: msg, MessageID: "order-42", Position: "orders/0/42", Lane: "orders/0", Offset: 42}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			msg.Source = ""
			if res, err := c.Handle(ctx, d); err != nil || res.Outcome != dedup.OutcomeProcessed {
				b.Fatalf("%+v, %v", res, err)
			}
		}
	})
	b.Run("FingerprintSum", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := fp.Sum(payload); err != nil {
				b.Fatal(err)
			}
		}
	})
}
