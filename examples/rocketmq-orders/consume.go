package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisfast"
	"github.com/redis/go-redis/v9"

	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// consumeFlags are the consume subcommand's settings.
type consumeFlags struct {
	mode         string
	topic, group string
	schema       string
	maxAttempts  int
	maxReconsume int
	stallOrder   string
	handlerDelay time.Duration
	goroutines   int
	batch        int
	redisAddr    string
	redisPrefix  string
}

func (f *consumeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.mode, "mode", "idemq", "idemq: the listener wrapped by idemq; naive: the same handler without idemq")
	fs.StringVar(&f.topic, "topic", "", "topic to consume (required; must exist)")
	fs.StringVar(&f.group, "group", "", "consumer group (required)")
	fs.StringVar(&f.schema, "schema", "orders_demo", "Postgres schema holding the idemq tables and the orders tables")
	fs.IntVar(&f.maxAttempts, "max-attempts", 4, "idemq: handler attempts before FAILED_FINAL + dead letter")
	fs.IntVar(&f.maxReconsume, "max-reconsume", 0, "broker redeliveries before %DLQ% (0: 16 for idemq, 3 for naive)")
	fs.StringVar(&f.stallOrder, "stall-order", "", "after the outcome of this order is durable, never answer the broker (the process waits to be killed): the crash window between commit and ack")
	fs.DurationVar(&f.handlerDelay, "handler-delay", 0, "extra time each handler run takes")
	fs.IntVar(&f.goroutines, "goroutines", 20, "listener goroutines (ConsumeGoroutineNums)")
	fs.IntVar(&f.batch, "batch", 1, "messages per listener call (ConsumeMessageBatchMaxSize)")
	fs.StringVar(&f.redisAddr, "redis", "", "Redis address for the dedup fast path (empty: Postgres only)")
	fs.StringVar(&f.redisPrefix, "redis-prefix", "idemq", "key prefix of the fast path")
}

// reconsumeTimes is -max-reconsume as the client wants it, clamped to
// RocketMQ's limit of 16 redeliveries (one per delay level).
func (f *consumeFlags) reconsumeTimes() int32 {
	switch {
	case f.maxReconsume < 0:
		return 0
	case f.maxReconsume > 16:
		return 16
	}
	return int32(f.maxReconsume) // #nosec G115 -- clamped to 0..16 above
}

// runConsume runs one consumer process until SIGINT/SIGTERM (or SIGKILL).
// It prints one JSON event per line on stdout: ready, handler (a handler
// run), result (a delivery's outcome) and stalled.
func runConsume(args []string) error {
	fs := flag.NewFlagSet("consume", flag.ExitOnError)
	var f consumeFlags
	f.register(fs)
	_ = fs.Parse(args)
	if f.topic == "" || f.group == "" {
		return errors.New("consume: -topic and -group are required")
	}
	if f.mode != "idemq" && f.mode != "naive" {
		return fmt.Errorf("consume: -mode %q: want idemq or naive", f.mode)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, postgresDSN())
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := createTables(ctx, pool, f.schema); err != nil {
		return err
	}
	ev := newEmitter(f.mode)
	opts := []rmqconsumer.Option{
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
	}
	if f.stallOrder != "" {
		opts = append(opts, rmqconsumer.WithInterceptor(stallAfter(f.stallOrder, ev)))
	}
	if f.mode == "naive" {
		return runNaive(ctx, pool, f, ev, opts)
	}

	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "demo", Secret: fingerprintSecret()})
	if err != nil {
		return err
	}
	cfg := pgstore.Config{Schema: f.schema, Fingerprinter: fp, MaxAttempts: f.maxAttempts}
	if f.redisAddr != "" {
		rc := redis.NewClient(redisfast.ClientOptions(f.redisAddr)) // fails fast: a Redis outage costs next to nothing
		defer func() { _ = rc.Close() }()
		if cfg.FastPath, err = redisfast.New(redisfast.Config{Client: rc, Prefix: f.redisPrefix}); err != nil {
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
	orders := pgx.Identifier{f.schema, ordersTable}.Sanitize()
	handler := func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
		o, err := decodeOrder(msg.Payload)
		if err != nil {
			return dedup.Permanent(err)
		}
		ev.emit(event{Ev: "handler", Order: o.OrderID, MessageID: msg.Identity.MessageID, Attempt: msg.Attempt, Reconsume: msg.ReconsumeTimes, Source: msg.Source})
		if err := sleepCtx(ctx, f.handlerDelay); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `insert into `+orders+` (order_id, customer, amount_cents, message_id) values ($1, $2, $3, $4)`,
			o.OrderID, o.Customer, o.AmountCents, msg.Identity.MessageID); err != nil {
			return fmt.Errorf("insert order %s: %w", o.OrderID, err)
		}
		return o.downstream(msg.Attempt)
	}
	c, err := consumer.New(consumer.Config{
		Scope:       f.group,
		Store:       store,
		Handler:     handler,
		BusinessKey: rocketmqadapter.BusinessKeyFromKeys,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	pc, err := rocketmqadapter.NewPushConsumer(c, rocketmqadapter.Config{
		NameServers:       nameServers(),
		Group:             f.group,
		Topic:             f.topic,
		InstanceName:      rocketmqadapter.InstanceName("orders-" + f.mode),
		MaxReconsumeTimes: f.reconsumeTimes(),
		ConsumeGoroutines: f.goroutines,
		BatchMaxSize:      f.batch,
		ClientOptions:     opts,
		Observe: func(d consumer.Delivery, res dedup.Result, err error) {
			e := event{Ev: "result", Order: orderIDOf(d.Message.Payload), MessageID: d.Message.Identity.MessageID,
				Reconsume: d.Message.ReconsumeTimes, Outcome: string(res.Outcome), By: string(res.MatchedBy),
				Status: string(res.Status), Attempts: res.Attempts, Ack: err == nil && res.Outcome.Acked(), Source: d.Position}
			if err != nil {
				e.Err = err.Error()
			} else if res.Err != nil {
				e.Err = res.Err.Error()
			}
			ev.emit(e)
		},
	})
	if err != nil {
		return err
	}
	if err := pc.Start(); err != nil {
		return err
	}
	ev.emit(event{Ev: "ready"})
	<-ctx.Done()
	return pc.Shutdown()
}

// runNaive consumes with the same business logic and no idemq: the insert
// autocommits, a failure answers ConsumeRetryLater, nothing is recorded.
func runNaive(ctx context.Context, pool *pgxpool.Pool, f consumeFlags, ev *emitter, opts []rmqconsumer.Option) error {
	maxReconsume := f.reconsumeTimes()
	if maxReconsume == 0 {
		maxReconsume = 3
	}
	table := pgx.Identifier{f.schema, naiveTable}.Sanitize()
	listener := func(ctx context.Context, msgs ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		result := rmqconsumer.ConsumeSuccess
		for _, m := range msgs {
			o, err := decodeOrder(m.Body)
			if err != nil {
				continue // a naive consumer drops what it cannot read
			}
			attempt := int(m.ReconsumeTimes) + 1
			ev.emit(event{Ev: "handler", Order: o.OrderID, MessageID: m.MsgId, Attempt: attempt, Reconsume: m.ReconsumeTimes})
			_ = sleepCtx(ctx, f.handlerDelay)
			_, err = pool.Exec(ctx, `insert into `+table+` (order_id, customer, amount_cents, message_id) values ($1, $2, $3, $4)`,
				o.OrderID, o.Customer, o.AmountCents, m.MsgId)
			if err == nil {
				err = o.downstream(attempt)
			}
			e := event{Ev: "result", Order: o.OrderID, MessageID: m.MsgId, Reconsume: m.ReconsumeTimes, Outcome: "processed", Ack: true}
			if err != nil {
				e.Outcome, e.Ack, e.Err = "retry", false, err.Error()
				result = rmqconsumer.ConsumeRetryLater
			}
			ev.emit(e)
		}
		return result, nil
	}
	opts = append(opts,
		rmqconsumer.WithGroupName(f.group),
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver(nameServers())),
		rmqconsumer.WithInstance(rocketmqadapter.InstanceName("orders-naive")),
		rmqconsumer.WithConsumerModel(rmqconsumer.Clustering),
		rmqconsumer.WithMaxReconsumeTimes(maxReconsume),
		rmqconsumer.WithConsumeGoroutineNums(f.goroutines),
		rmqconsumer.WithConsumeMessageBatchMaxSize(f.batch),
	)
	pc, err := rmqconsumer.NewPushConsumer(opts...)
	if err != nil {
		return err
	}
	if err := pc.Subscribe(f.topic, rmqconsumer.MessageSelector{Type: rmqconsumer.TAG, Expression: "*"}, listener); err != nil {
		return err
	}
	if err := pc.Start(); err != nil {
		return err
	}
	ev.emit(event{Ev: "ready"})
	<-ctx.Done()
	return pc.Shutdown()
}

// stallAfter is a client interceptor: once the listener has answered
// ConsumeSuccess for a batch holding order, it never returns, so the broker
// is never acknowledged although the database has committed. The process
// then waits to be killed: the crash window between commit and ack, made
// deterministic (otherwise the client's 5-second offset flush decides).
func stallAfter(order string, ev *emitter) primitive.Interceptor {
	return func(ctx context.Context, req, reply any, next primitive.Invoker) error {
		err := next(ctx, req, reply)
		msgs, _ := req.([]*primitive.MessageExt)
		holder, _ := reply.(*rmqconsumer.ConsumeResultHolder)
		if holder == nil || holder.ConsumeResult != rmqconsumer.ConsumeSuccess {
			return err
		}
		for _, m := range msgs {
			if strings.EqualFold(orderIDOf(m.Body), order) {
				ev.emit(event{Ev: "stalled", Order: order, MessageID: m.MsgId})
				select {} // wait for SIGKILL
			}
		}
		return err
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
