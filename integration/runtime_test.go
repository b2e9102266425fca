package integration

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// outcomeLog is a user middleware recording each attempt's outcome per
// message ID, as the runtime's chain hands them back.
type outcomeLog struct {
	mu   sync.Mutex
	seen map[string][]dedup.Outcome
}

func (o *outcomeLog) middleware(next consumer.ProcessFunc) consumer.ProcessFunc {
	return func(ctx context.Context, d *consumer.Delivery) (dedup.Result, error) {
		res, err := next(ctx, d)
		o.mu.Lock()
		if o.seen == nil {
			o.seen = map[string][]dedup.Outcome{}
		}
		o.seen[d.Message.Identity.MessageID] = append(o.seen[d.Message.Identity.MessageID], res.Outcome)
		o.mu.Unlock()
		return res, err
	}
}

func (o *outcomeLog) get(id string) []dedup.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]dedup.Outcome(nil), o.seen[id]...)
}

// slowHandler sleeps in Postgres for a minute on "slow-*" messages: only
// the handler's deadline (consumer.Config.MaxHandlerDuration) stops it.
func slowHandler(table string) pgstore.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if strings.HasPrefix(m.Identity.MessageID, "slow-") {
			_, err := tx.Exec(ctx, `select pg_sleep(60)`)
			return err
		}
		_, err := tx.Exec(ctx, `insert into `+table+` (message_id, payload) values ($1, $2)`, m.Identity.MessageID, m.Payload)
		return err
	}
}

// cancelRequestStore is e's store over a pool of its own whose connections
// answer a query's ctx ending with a cancel request (pgconn's
// CancelRequestContextWatcherHandler) instead of pgx's default, closing the
// connection: the handler's deadline then cancels the statement, the
// transaction survives to its savepoint, and the timeout is a recorded,
// counted attempt.
func cancelRequestStore(t *testing.T, e *env, maxAttempts int) *pgstore.Store {
	t.Helper()
	pc, err := pgxpool.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 5 * time.Second}
	}
	pool, err := pgxpool.NewWithConfig(e.ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := pgstore.New(pool, pgstore.Config{Schema: e.schema, Fingerprinter: testFingerprinter(t), MaxAttempts: maxAttempts})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// checkTimedOut asserts that id ended FAILED_FINAL after MaxAttempts
// attempts that each hit the handler deadline, and that the user middleware
// saw each attempt.
func checkTimedOut(t *testing.T, e *env, scope, id string, outcomes *outcomeLog) {
	t.Helper()
	rec := e.record(scope, id)
	// The class is the statement's (pg:57014, query canceled); the error
	// says it was the deadline.
	if rec.Status != dedup.StatusFailedFinal || rec.Attempts != 3 ||
		!strings.Contains(rec.LastError, "handler exceeded MaxHandlerDuration 300ms: context deadline exceeded") {
		t.Fatalf("record %+v; want FAILED_FINAL after 3 attempts cut off by MaxHandlerDuration", rec)
	}
	want := []dedup.Outcome{dedup.OutcomeRetry, dedup.OutcomeRetry, dedup.OutcomeDeadLetter}
	if got := outcomes.get(id); len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("middleware saw %v, want %v", got, want)
	}
}

// One MaxHandlerDuration for every broker, and a user middleware in the
// chain of both drive modes: under Kafka (pull, consumer.Run) a handler
// stuck in Postgres is cut off at the deadline, each cut a failed attempt of
// class timeout, until the message is dead-lettered and the partition moves
// on.
func TestRuntimeKafkaHandlerTimeoutAndMiddleware(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *pgstore.Config) { c.MaxAttempts = 3 })
	applies := e.appliesTable()
	topic, group := newTopic(t, 1), randomName("g-")
	produce(t, topic, kmsg{id: "slow-1", payload: `{"n":1}`}, kmsg{id: "fast-2", payload: `{"n":2}`})
	outcomes := &outcomeLog{}
	r := startConsumer(t, consumer.Config{Scope: group, Store: cancelRequestStore(t, e, 3), Handler: slowHandler(applies),
		MaxHandlerDuration: 300 * time.Millisecond, RetryInitial: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		Middleware: []consumer.Middleware{outcomes.middleware}}, newSpySource(t, group, topic))
	eventually(t, 60*time.Second, "offset 2 committed", func() bool { return groupOffset(t, group, topic) == 2 })
	r.stop(t)
	checkTimedOut(t, e, group, "slow-1", outcomes)
	if got := outcomes.get("fast-2"); len(got) != 1 || got[0] != dedup.OutcomeProcessed {
		t.Fatalf("fast-2: middleware saw %v", got)
	}
}

// The same under RocketMQ (push, the listener calling consumer.Pusher): the
// broker's last copy is retried in place with the same deadline per attempt
// until it is dead-lettered, and only then answered ConsumeSuccess; the
// user middleware sees every attempt.
func TestRuntimeRocketMQHandlerTimeoutAndMiddleware(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *pgstore.Config) { c.MaxAttempts = 3 })
	applies := e.appliesTable()
	outcomes := &outcomeLog{}
	l, err := rocketmqadapter.NewListener(rmqConsumer(t, consumer.Config{Scope: "ledger", Store: cancelRequestStore(t, e, 3), Handler: slowHandler(applies),
		MaxHandlerDuration: 300 * time.Millisecond, RetryInitial: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		Middleware: []consumer.Middleware{outcomes.middleware}}), rocketmqadapter.Config{MaxReconsumeTimes: 2})
	if err != nil {
		t.Fatal(err)
	}
	q := primitive.MessageQueue{Topic: "%RETRY%ledger", BrokerName: "broker-a"}
	first := rmqExt("ledger", "fast-2", "O2", "", q, 1, 0, "y")
	first.WithProperty("message-id", "fast-2")
	if r, err := l.Consume(context.Background(), first); err != nil || r != rmqconsumer.ConsumeSuccess {
		t.Fatalf("fast-2 answered %v (%v)", r, err)
	}
	last := rmqExt("ledger", "U1", "O1", "", q, 2, 2, "x")
	last.WithProperty("message-id", "slow-1")
	if r, err := l.Consume(context.Background(), last); err != nil || r != rmqconsumer.ConsumeSuccess {
		t.Fatalf("last copy answered %v (%v), want ConsumeSuccess once dead-lettered", r, err)
	}
	checkTimedOut(t, e, "ledger", "slow-1", outcomes)
	if got := outcomes.get("fast-2"); len(got) != 1 || got[0] != dedup.OutcomeProcessed {
		t.Fatalf("fast-2: middleware saw %v", got)
	}
}
