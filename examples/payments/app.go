package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
)

// Payment is the message payload: debit Amount cents from Account once.
type Payment struct {
	PaymentID string `json:"payment_id"`
	Account   string `json:"account"`
	Amount    int64  `json:"amount"`
}

// FlakyPayment fails its first handler attempt with a transient error, to
// show a retry in place.
const FlakyPayment = "p-12"

// fingerprintSecret would come from a secret store in production.
var fingerprintSecret = []byte("demo-only-fingerprint-secret-change-me")

// events appends one JSON line per event; lines written before a SIGKILL
// survive it (they are in the kernel's page cache).
type events struct {
	mu sync.Mutex
	f  *os.File
}

func openEvents(path string) (*events, error) {
	if path == "" {
		return &events{}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	return &events{f: f}, err
}

func (e *events) write(v map[string]any) {
	if e.f == nil {
		return
	}
	b, _ := json.Marshal(v)
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.f.Write(append(b, '\n'))
}

// crasher SIGKILLs this process when the n-th durable outcome is reported:
// the database transaction has committed, the offset commit has not run.
type crasher struct {
	mu    sync.Mutex
	after int
	seen  int
}

func (c *crasher) tick() {
	if c == nil || c.after <= 0 {
		return
	}
	c.mu.Lock()
	c.seen++
	n := c.seen
	c.mu.Unlock()
	if n == c.after {
		fmt.Fprintf(os.Stderr, "payments: crash injection: SIGKILL after %d committed deliveries, before the offset commit\n", n)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// recorder is the consumer.Metrics of the demo: it logs each outcome to the
// events file and drives the crash injection.
type recorder struct {
	ev    *events
	crash *crasher
}

func (r *recorder) Delivery(_ string, o dedup.Outcome, by dedup.MatchedBy) {
	r.ev.write(map[string]any{"ev": "outcome", "outcome": o, "by": by})
	if o == dedup.OutcomeProcessed {
		r.crash.tick()
	}
}

// createSchema creates the demo's business tables in schema.
func createSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	s := pgx.Identifier{schema}.Sanitize()
	// Consumer processes start together: DDL under an advisory lock, or two
	// "create table if not exists" race in the catalog.
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtext('idemq-payments-example'))`); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `create schema if not exists `+s+`;
create table if not exists `+s+`.accounts (account text primary key, balance bigint not null);
create table if not exists `+s+`.payments (payment_id text primary key, account text not null, amount bigint not null,
  message_id text not null, applied_at timestamptz not null default now());
create table if not exists `+s+`.naive_accounts (account text primary key, balance bigint not null);
create table if not exists `+s+`.naive_payments (payment_id text not null, account text not null, amount bigint not null,
  applied_at timestamptz not null default now())`)
	if err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// paymentKey is the business-key extractor: the payment ID in the payload.
func paymentKey(m *dedup.Message) (string, error) {
	var p Payment
	if err := json.Unmarshal(m.Payload, &p); err != nil {
		return "", fmt.Errorf("payload is not a payment: %w", err)
	}
	return p.PaymentID, nil
}

// idemqHandler debits the account and records the payment, in idemq's
// transaction.
func idemqHandler(schema string, ev *events) pgstore.Handler {
	s := pgx.Identifier{schema}.Sanitize()
	return func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		var p Payment
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return dedup.Permanent(err)
		}
		ev.write(map[string]any{"ev": "handler", "payment": p.PaymentID, "attempt": m.Attempt})
		if p.Amount <= 0 {
			return dedup.Permanent(fmt.Errorf("payment %s: amount %d must be positive", p.PaymentID, p.Amount))
		}
		if p.PaymentID == FlakyPayment && m.Attempt == 1 {
			return errors.New("ledger busy (transient)")
		}
		if _, err := tx.Exec(ctx, `insert into `+s+`.payments (payment_id, account, amount, message_id) values ($1, $2, $3, $4)`,
			p.PaymentID, p.Account, p.Amount, m.Identity.MessageID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `update `+s+`.accounts set balance = balance - $2 where account = $1`, p.Account, p.Amount)
		return err
	}
}

// naiveApply is what a consumer without idemq does: apply, then commit.
func naiveApply(ctx context.Context, pool *pgxpool.Pool, schema string, m kafka.Message) error {
	s := pgx.Identifier{schema}.Sanitize()
	var p Payment
	if err := json.Unmarshal(m.Value, &p); err != nil {
		return err
	}
	if p.Amount <= 0 {
		return fmt.Errorf("payment %s: amount %d must be positive", p.PaymentID, p.Amount)
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `insert into `+s+`.naive_payments (payment_id, account, amount) values ($1, $2, $3)`, p.PaymentID, p.Account, p.Amount); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `update `+s+`.naive_accounts set balance = balance - $2 where account = $1`, p.Account, p.Amount)
		return err
	})
}

func runConsume(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("consume", flag.ExitOnError)
	var ep endpoints
	brokers := ep.register(fs)
	mode := fs.String("mode", "idemq", "idemq or naive")
	topic := fs.String("topic", "payments", "topic")
	group := fs.String("group", "payments", "consumer group (also the idemq scope)")
	schema := fs.String("schema", "payments_demo", "schema of the business tables and idemq tables")
	crashAfter := fs.Int("crash-after", 0, "SIGKILL this process after N committed deliveries (0: never)")
	commitEvery := fs.Int("commit-every", 5, "offset commit batch size")
	eventsPath := fs.String("events", "", "append JSON event lines to this file")
	maxAttempts := fs.Int("max-attempts", 5, "handler attempts before a dead letter")
	redisAddr := fs.String("redis", "", "Redis address for the dedup fast path (empty: Postgres only)")
	redisPrefix := fs.String("redis-prefix", "idemq", "key prefix of the fast path")
	_ = fs.Parse(args)
	ep.brokers = splitBrokers(*brokers)

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ev, err := openEvents(*eventsPath)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, ep.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := createSchema(ctx, pool, *schema); err != nil {
		return err
	}
	crash := &crasher{after: *crashAfter}
	rc := kafka.ReaderConfig{Brokers: ep.brokers, GroupID: *group, Topic: *topic, SessionTimeout: 6 * time.Second,
		HeartbeatInterval: time.Second, RebalanceTimeout: 6 * time.Second, StartOffset: kafka.FirstOffset, MaxWait: 200 * time.Millisecond}
	if *mode == "naive" {
		return consumeNaive(ctx, pool, *schema, rc, *commitEvery, crash, ev)
	}

	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "demo-1", Secret: fingerprintSecret})
	if err != nil {
		return err
	}
	cfg := pgstore.Config{Schema: *schema, Fingerprinter: fp, MaxAttempts: *maxAttempts, Logger: log}
	if *redisAddr != "" {
		rc := redis.NewClient(redisfast.ClientOptions(*redisAddr)) // fails fast: a Redis outage costs next to nothing
		defer func() { _ = rc.Close() }()
		if cfg.FastPath, err = redisfast.New(redisfast.Config{Client: rc, Prefix: *redisPrefix, Logger: log}); err != nil {
			return err
		}
	}
	store, err := pgstore.New(pool, cfg)
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	c, err := consumer.New(consumer.Config{
		Scope: *group, Store: store, Handler: idemqHandler(*schema, ev), BusinessKey: paymentKey,
		RetryInitial: 50 * time.Millisecond, RetryMax: time.Second,
		CommitEvery: *commitEvery, CommitInterval: 500 * time.Millisecond,
		Metrics: &recorder{ev: ev, crash: crash}, Logger: log,
	})
	if err != nil {
		return err
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: rc})
	if err != nil {
		return err
	}
	return c.Run(ctx, src)
}

// consumeNaive applies each message in its own transaction and commits
// offsets in batches of commitEvery (or after 500ms without messages), like a
// hand-written consumer.
func consumeNaive(ctx context.Context, pool *pgxpool.Pool, schema string, rc kafka.ReaderConfig, commitEvery int, crash *crasher, ev *events) error {
	r := kafka.NewReader(rc)
	defer func() { _ = r.Close() }()
	var pending []kafka.Message
	for {
		fctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		m, err := r.FetchMessage(fctx)
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			if len(pending) > 0 {
				if err := r.CommitMessages(ctx, pending...); err != nil {
					return err
				}
				pending = pending[:0]
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				if len(pending) > 0 {
					return r.CommitMessages(context.Background(), pending...)
				}
				return nil
			}
			return err
		}
		if err := naiveApply(ctx, pool, schema, m); err != nil {
			ev.write(map[string]any{"ev": "naive_error", "err": err.Error()})
		} else {
			ev.write(map[string]any{"ev": "naive_applied"})
			crash.tick()
		}
		pending = append(pending, m)
		if len(pending) >= commitEvery {
			if err := r.CommitMessages(ctx, pending...); err != nil {
				return err
			}
			pending = pending[:0]
		}
	}
}
