package integration

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The Redis-only store's watchdog goes by the lease's clock: with Redis hung
// (its process stopped, SIGSTOP, connections open and silent) and a go-redis
// client that waits a minute on a socket read and retries three times, the
// handler's context still ends with ErrLeaseExpired at 90% of the lease's
// TTL, while Redis is still hung, instead of when the renewal call gives up.
func TestRedisStoreRenewalFailsByTheLeaseClock(t *testing.T) {
	t.Parallel()
	rs := startRedisServer(t)
	client := redis.NewClient(&redis.Options{Addr: rs.addr(), ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(redisstore.Config{Client: client, Prefix: randomName("rs-"), Fingerprinter: testFingerprinter(t)})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	ended := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.ProcessLeased(context.Background(), msg(t, "billing", "m-hung", "", "x"), func(hctx context.Context, _ *dedup.Message) error {
			close(started)
			<-hctx.Done()
			ended <- context.Cause(hctx)
			return context.Cause(hctx)
		}, dedup.LeaseOptions{TTL: 2 * time.Second, Heartbeat: 200 * time.Millisecond})
	}()
	<-started
	rs.pause()
	select {
	case cause := <-ended:
		if !errors.Is(cause, dedup.ErrLeaseExpired) {
			t.Fatalf("handler canceled with %v, want ErrLeaseExpired", cause)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("30s after Redis hung, the handler of a 2s lease still runs: the watchdog waits for the renewal call instead of the lease's clock")
	}
	rs.resume()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("ProcessLeased did not return after Redis resumed")
	}
}

// stuckExporter is a span exporter whose collector never answers: every
// ExportSpans call blocks until the test ends.
type stuckExporter struct {
	calls   atomic.Int64
	release chan struct{}
}

func (x *stuckExporter) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	x.calls.Add(1)
	select {
	case <-x.release:
	case <-ctx.Done():
	}
	return errors.New("collector unreachable")
}

func (x *stuckExporter) Shutdown(context.Context) error { return nil }

// Tracing export never blocks a delivery: idemq creates no exporter and
// never flushes; it ends each delivery's span on the delivery's goroutine,
// which with the SDK's batching span processor only queues it (and drops it
// when the queue is full). With the exporter stuck on an unreachable
// collector, 300 single deliveries and a batch of 50 all reach their
// outcome.
func TestTracingExportNeverBlocksDeliveries(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	exp := &stuckExporter{release: make(chan struct{})}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithMaxQueueSize(16), sdktrace.WithMaxExportBatchSize(4),
		sdktrace.WithBatchTimeout(10*time.Millisecond), sdktrace.WithExportTimeout(time.Hour)))
	t.Cleanup(func() {
		close(exp.release)
		_ = tp.Shutdown(context.Background())
	})
	c, err := consumer.New(consumer.Config{Scope: "traced", Store: e.store, TracerProvider: tp,
		Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	delivery := func(i int) consumer.Delivery {
		return consumer.Delivery{MessageID: fmt.Sprintf("m-%d", i), Position: fmt.Sprintf("test:%d", i),
			Message: &dedup.Message{Topic: "orders", Payload: []byte("x")}}
	}
	handle := func(from, to int) error {
		for i := from; i < to; i++ {
			if res, err := c.Handle(e.ctx, delivery(i)); err != nil || res.Outcome != dedup.OutcomeProcessed {
				return fmt.Errorf("delivery %d: %+v %v", i, res, err)
			}
		}
		return nil
	}
	if err := handle(0, 20); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the exporter stuck in a call", func() bool { return exp.calls.Load() > 0 })

	done := make(chan error, 1)
	go func() {
		if err := handle(20, 320); err != nil {
			done <- err
			return
		}
		var batch []consumer.Delivery
		for i := 320; i < 370; i++ {
			batch = append(batch, delivery(i))
		}
		res, err := c.HandleBatch(e.ctx, batch)
		if err == nil && (len(res) != 50 || res[49].Outcome != dedup.OutcomeProcessed) {
			err = fmt.Errorf("batch: %+v", res)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("deliveries blocked behind a stuck span exporter")
	}
	if n := exp.calls.Load(); n != 1 {
		t.Fatalf("%d export calls, want the 1 that is stuck", n)
	}
}

// Outbox rows keep their error history: a row that failed and was then
// published keeps its last error and its time, and `idemq outbox stats`
// tells it ("published_after_failure") from a row failing now
// ("failing_now").
func TestOutboxErrorHistoryAfterPublish(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	o := setupOutbox(t)
	topic := newTopic(t, 1)
	var recovered atomic.Bool
	tr := newTracker(obKafkaPub(t))
	tr.fail = func(e outbox.Envelope) error {
		switch k := string(e.Key); {
		case k == "key-00" && !recovered.Load():
			return errors.New("NOT_ENOUGH_REPLICAS (simulated, recovers)")
		case k == "key-01":
			return errors.New("TOPIC_AUTHORIZATION_FAILED (simulated, keeps failing)")
		}
		return nil
	}
	cfg := fastRelay("history")
	cfg.RetryInitial, cfg.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	rr := o.startRelay(t, tr.as("history"), cfg)
	o.addRows(t, topic, 6, 3, "history") // key-00, key-01, key-02: 2 rows each
	eventually(t, 30*time.Second, "both failing keys failing", func() bool {
		s := o.stats(t)
		return s.Failing == 2 && s.Published == 2
	})
	recovered.Store(true)
	eventually(t, 30*time.Second, "key-00 published", func() bool { return o.stats(t).Published == 4 })
	rr.stop(t)

	s := o.stats(t)
	if s.Pending != 2 || s.Failing != 1 || s.Published != 4 || s.PublishedAfterFailure != 1 || s.LastErrorAt.IsZero() {
		t.Fatalf("stats %+v, want 2 pending of which 1 failing, 4 published of which 1 after a failure, a last error time", s)
	}
	for _, row := range o.outboxRows(t) {
		head := row.Payload[len(row.Payload)-2] <= '2' // rows 0, 1, 2: the heads of their keys
		switch k := string(row.Key); {
		case k == "key-00" && head:
			if row.PublishedAt == nil || !strings.Contains(row.LastError, "recovers") || row.LastErrorAt == nil || row.LastErrorAt.After(*row.PublishedAt) {
				t.Fatalf("recovered row: published %v, last error %q at %v; want published after its kept error", row.PublishedAt, row.LastError, row.LastErrorAt)
			}
		case k == "key-01" && head:
			if row.PublishedAt != nil || !strings.Contains(row.LastError, "keeps failing") || row.LastErrorAt == nil {
				t.Fatalf("failing row: published %v, last error %q at %v", row.PublishedAt, row.LastError, row.LastErrorAt)
			}
		default:
			if row.LastError != "" || row.LastErrorAt != nil {
				t.Fatalf("row %s of %s never failed, yet has error %q at %v", row.ID, k, row.LastError, row.LastErrorAt)
			}
		}
	}

	out, err := exec.Command(bin, "outbox", "stats", "--dsn", postgresDSN(t), "--schema", o.schema).CombinedOutput()
	if err != nil {
		t.Fatalf("idemq outbox stats: %v\n%s", err, out)
	}
	for _, want := range []string{"pending 2\n", "failing_now 1\n", "published 4\n", "published_after_failure 1\n", "last_error_at 20"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("idemq outbox stats lacks %q:\n%s", want, out)
		}
	}
}
