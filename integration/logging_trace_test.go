package integration

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// spanLogs is a slog.Handler that records, per message, the trace ID of the
// span in the record's context (the zero ID when the call dropped it).
type spanLogs struct {
	mu    sync.Mutex
	trace map[string][]trace.TraceID
}

func (h *spanLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h *spanLogs) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trace[r.Message] = append(h.trace[r.Message], trace.SpanContextFromContext(ctx).TraceID())
	return nil
}
func (h *spanLogs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *spanLogs) WithGroup(string) slog.Handler      { return h }

func (h *spanLogs) of(msg string) []trace.TraceID {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]trace.TraceID(nil), h.trace[msg]...)
}

// Log lines written while a delivery is handled carry its context, so a
// handler that reads the span (as trace-ID log bridges do) finds the
// delivery's trace: the consumer's outcome line and the Postgres store's
// fast-path line (Redis refusing connections) on the real Postgres.
func TestLogsCarryTheDeliveryTrace(t *testing.T) {
	t.Parallel()
	logs := &spanLogs{trace: map[string][]trace.TraceID{}}
	client := redis.NewClient(redisfast.ClientOptions("127.0.0.1:1")) // nothing listens on port 1
	t.Cleanup(func() { _ = client.Close() })
	fast, err := redisfast.New(redisfast.Config{Client: client, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t, func(c *pgstore.Config) { c.FastPath, c.Logger = fast, slog.New(logs) })
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var want trace.TraceID
	c, err := consumer.New(consumer.Config{Scope: "logs", Store: e.store, TracerProvider: tp, Logger: slog.New(logs),
		Handler: func(ctx context.Context, _ pgx.Tx, _ *dedup.Message) error {
			want = trace.SpanContextFromContext(ctx).TraceID()
			return errors.New("not yet")
		}})
	if err != nil {
		t.Fatal(err)
	}
	d := consumer.Delivery{MessageID: "m-logs", Position: "test:0", Message: &dedup.Message{Topic: "orders", Payload: []byte("x")}}
	if res, err := c.Handle(e.ctx, d); err != nil || res.Outcome != dedup.OutcomeRetry {
		t.Fatalf("%+v %v", res, err)
	}
	if !want.IsValid() {
		t.Fatal("handler saw no span")
	}
	for _, msg := range []string{"idemq: delivery", "idemq: fast path lookup failed; using Postgres"} {
		got := logs.of(msg)
		if len(got) == 0 {
			t.Errorf("no %q line", msg)
		}
		for _, id := range got {
			if id != want {
				t.Errorf("%q logged with trace %v, want the delivery's %v", msg, id, want)
			}
		}
	}
}
