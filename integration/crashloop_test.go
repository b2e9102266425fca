package integration

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// S17: messages that kill their consumer. Lease mode here; atomic and
// batched modes with real processes in crashloop_process_test.go.

// adminStore is a consumer.Store with the operator's reads and re-drive:
// *pgstore.Store and *redisstore.Store.
type adminStore interface {
	consumer.Store
	Lookup(ctx context.Context, scope, messageID string) (dedup.Record, error)
	DeadLetters(ctx context.Context, scope string, afterID int64, limit int) ([]dedup.DeadLetter, error)
	Redrive(ctx context.Context, scope, messageID string) error
}

// S17, lease mode, on the Postgres store and on the Redis-only store:
// MaxAttempts 2, lease TTL 1 s, heartbeat off. ingest/big-77 is claimed by
// two copies in turn; each owner dies (never returns) and its lease expires.
// The third copy does not run the handler: the record is FAILED_FINAL with
// attempts 2 and one dead letter attempts_exhausted, and the delivery is
// acked. Handler starts never exceed MaxAttempts. A re-drive then allows one
// more execution.
func TestS17LeaseOwnersThatDieAreBounded(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T) adminStore{
		"postgres": func(t *testing.T) adminStore {
			return setup(t, func(c *pgstore.Config) { c.MaxAttempts = 2 }).store
		},
		"redis-only": func(t *testing.T) adminStore {
			return newRedisStore(t, func(c *redisstore.Config) { c.MaxAttempts = 2 })
		},
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := newStore(t)
			testS17Lease(t, st)
		})
	}
}

func testS17Lease(t *testing.T, st adminStore) {
	ctx := context.Background()
	const scope, id = "ingest", "ingest/big-77"
	opt := dedup.LeaseOptions{TTL: time.Second, DisableHeartbeat: true}
	// Dead owners never return while the test runs; they are released (and
	// fenced) at its end, before the store's tables go away.
	release := make(chan struct{})
	var owners sync.WaitGroup
	t.Cleanup(func() { close(release); owners.Wait() })
	var starts atomic.Int32
	started := make(chan int, 2)
	die := func(_ context.Context, m *dedup.Message) error {
		starts.Add(1)
		started <- m.Attempt
		<-release
		return nil
	}
	for copyNo := 1; copyNo <= 2; copyNo++ {
		owners.Add(1)
		go func() {
			defer owners.Done()
			_, _ = st.ProcessLeased(ctx, msg(t, scope, id, "", "big"), die, opt)
		}()
		select {
		case a := <-started:
			if a != copyNo {
				t.Fatalf("copy %d ran attempt %d", copyNo, a)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("copy %d did not take over the expired lease", copyNo)
		}
		// The owner "dies" holding the lease (no heartbeat): its lease ends
		// TTL after the claim, in the store's own time.
		waitLeaseExpired(t, st, scope, id)
	}

	third, err := st.ProcessLeased(ctx, msg(t, scope, id, "", "big"), func(context.Context, *dedup.Message) error {
		starts.Add(1)
		return errors.New("the third copy must not run the handler")
	}, opt)
	if err != nil {
		t.Fatal(err)
	}
	if third.Outcome != dedup.OutcomeDeadLetter || !third.Outcome.Acked() || third.HandlerCalled || third.Attempts != 2 ||
		third.Status != dedup.StatusFailedFinal || third.DeadLetterID == 0 || !errors.Is(third.Err, dedup.ErrExecutionLost) {
		t.Fatalf("third copy: %+v; want an acked dead letter, handler not run, attempts 2, Err wrapping ErrExecutionLost", third)
	}
	if n := starts.Load(); n != 2 {
		t.Fatalf("handler starts = %d, want MaxAttempts (2)", n)
	}
	rec, err := st.Lookup(ctx, scope, id)
	if err != nil || rec.Status != dedup.StatusFailedFinal || rec.Attempts != 2 || rec.LastErrorClass != "attempts_exhausted" {
		t.Fatalf("record = %+v, %v; want FAILED_FINAL attempts 2 class attempts_exhausted", rec, err)
	}
	dls, err := st.DeadLetters(ctx, scope, 0, 10)
	if err != nil || len(dls) != 1 || dls[0].Reason != dedup.ReasonAttemptsExhausted || dls[0].MessageID != id || dls[0].Attempts != 2 ||
		string(dls[0].Payload) != "big" {
		t.Fatalf("dead letters = %+v, %v; want one attempts_exhausted with attempts 2 and the payload", dls, err)
	}
	// A later copy is a duplicate; a re-drive allows one more execution.
	again, err := st.ProcessLeased(ctx, msg(t, scope, id, "", "big"), func(context.Context, *dedup.Message) error {
		return errors.New("a copy of a dead letter must not run")
	}, opt)
	if err != nil || again.Outcome != dedup.OutcomeDuplicate {
		t.Fatalf("copy after the dead letter: %+v %v", again, err)
	}
	if err := st.Redrive(ctx, scope, id); err != nil {
		t.Fatal(err)
	}
	redriven, err := st.ProcessLeased(ctx, msg(t, scope, id, "", "big"), func(context.Context, *dedup.Message) error { return nil }, opt)
	if err != nil || redriven.Outcome != dedup.OutcomeProcessed || redriven.Attempts != 3 {
		t.Fatalf("copy after a re-drive: %+v %v; want processed at attempt 3", redriven, err)
	}
}

// stmtCounter is a pgx tracer counting the statements (batched ones too)
// whose SQL contains each of a few markers.
type stmtCounter struct {
	mu     sync.Mutex
	counts map[string]int
	marks  []string
}

func newStmtCounter(marks ...string) *stmtCounter {
	return &stmtCounter{counts: map[string]int{}, marks: marks}
}

func (s *stmtCounter) note(sql string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.marks {
		if strings.Contains(sql, m) {
			s.counts[m]++
		}
	}
}

func (s *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.note(d.SQL)
	return ctx
}

func (s *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (s *stmtCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.note(d.SQL)
}

func (s *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (s *stmtCounter) count(mark string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[mark]
}

func (s *stmtCounter) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts = map[string]int{}
}

// Markers of the crash-loop statements, for stmtCounter.
const (
	sqlWatermark = "_lane_watermarks"                                   // AdvanceLaneWatermark
	sqlMarkStart = "values ($1, $2, $3, $4, $5, 'FAILED_RETRYABLE', 0," // MarkStart (its first statement)
	sqlStartMark = "start_mark"                                         // any statement of MarkStart or ClearStart
	sqlPeek      = "select message_id, fingerprint, fingerprint_key_id, status, attempts\nfrom"
)

// tracedStore is a store on e's schema whose statements stmtCounter counts.
func tracedStore(t *testing.T, e *env, counter *stmtCounter) *pgstore.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = counter
	cfg.MaxConns = 8
	p, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	st, err := pgstore.New(p, e.store.Config())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// The cost of start markers, counted in statements on a real Kafka lane
// (CrashLoop.Window 10). First deliveries (95 messages, no restart): no
// start marker, no replay check, and a watermark write at most once per 11
// offsets (9 for offsets 0–94). Then the lane restarts (a new consumer
// group with the same scope replays the partition from offset 0, with 5 new
// messages at offsets 95–99): the 95 final ones are answered by one read
// each without a transaction or a handler run, the first new one below the
// watermark (95) is the only one marked, and those after it run as first
// deliveries.
func TestCrashLoopMarkersCostNothingOnFirstDeliveries(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	a := newApplier(e.appliesTable())
	counter := newStmtCounter(sqlWatermark, sqlMarkStart, sqlStartMark, sqlPeek)
	st := tracedStore(t, e, counter)
	topic, scope := newTopic(t, 1), randomName("s-")
	produce(t, topic, s17Messages(95)...)
	cfg := consumer.Config{Scope: scope, Store: st, Handler: a.handler(), CrashLoop: consumer.CrashLoopConfig{Window: 10}}

	group := randomName("g-")
	first := startConsumer(t, cfg, newSpySource(t, group, topic))
	waitCaughtUp(t, group, topic)
	first.stop(t)
	if w := counter.count(sqlWatermark); w < 1 || w > 9 {
		t.Errorf("first deliveries of offsets 0–94: %d watermark writes, want 1 to 9 (at most one per Window+1 offsets)", w)
	}
	if n := counter.count(sqlStartMark) + counter.count(sqlPeek); n != 0 {
		t.Errorf("first deliveries: %d start-marker or replay-check statements, want 0", n)
	}
	if n := e.count(`select count(*) from ` + e.table("consumption_records") + ` where start_mark is not null`); n != 0 {
		t.Errorf("records with a start marker after first deliveries = %d, want 0", n)
	}
	if a.total() != 95 {
		t.Fatalf("handler calls = %d, want 95", a.total())
	}

	counter.reset()
	produce(t, topic, kmsg{id: "new-95", payload: "new"}, kmsg{id: "new-96", payload: "new"}, kmsg{id: "new-97", payload: "new"},
		kmsg{id: "new-98", payload: "new"}, kmsg{id: "new-99", payload: "new"})
	metrics := &consumer.Counters{}
	cfg.Metrics = metrics
	replay := randomName("g-")
	second := startConsumer(t, cfg, newSpySource(t, replay, topic))
	waitCaughtUp(t, replay, topic)
	second.stop(t)
	if n := counter.count(sqlPeek); n != 96 {
		t.Errorf("replay checks after the restart = %d, want 96 (95 final, then the first new delivery)", n)
	}
	if n := counter.count(sqlMarkStart); n != 1 {
		t.Errorf("start markers after the restart = %d, want 1 (the first delivery without a final record)", n)
	}
	if w := counter.count(sqlWatermark); w != 2 {
		t.Errorf("watermark writes after the restart = %d, want 2 (at the start, and at offset 99 above the watermark 98)", w)
	}
	if d, p := metrics.Get("duplicate"), metrics.Get("processed"); d != 95 || p != 5 || a.total() != 100 {
		t.Errorf("after the restart: %d duplicates, %d processed, %d handler calls in all; want 95, 5, 100", d, p, a.total())
	}
	if n := e.count(`select count(*) from ` + e.table("consumption_records") + ` where status = 'SUCCEEDED' and attempts = 1`); n != 100 {
		t.Errorf("SUCCEEDED records with attempts 1 = %d, want 100", n)
	}
}
