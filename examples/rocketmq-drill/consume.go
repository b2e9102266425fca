package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Tables of the drill, in the run's schema next to idemq's own.
const (
	// effectsTable is the handler's effect: one row per message ID (the
	// unique key); applies counts how many committed handler runs wrote it,
	// so a second effect shows as applies 2 instead of failing.
	effectsTable = "effects"
	// deliveriesTable is one row per delivery that reached an
	// acknowledgeable outcome, written before the broker is answered, so
	// it survives a SIGKILL.
	deliveriesTable = "deliveries"
)

// maxAttempts is pgstore.Config.MaxAttempts in the drill: a message in
// flight at several kills must not be dead-lettered as a process crasher
// (the default is 5), since the drill measures redeliveries, not poison.
// 16 is the most the push consumer accepts with its default
// MaxReconsumeTimes (16 redeliveries, 17 deliveries).
const maxAttempts = 16

// drillTables creates the drill's tables in schema.
func drillTables(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	s := pgx.Identifier{schema}.Sanitize()
	_, err := pool.Exec(ctx, `create schema if not exists `+s+`;
create table if not exists `+s+`.`+effectsTable+` (
	message_id text primary key,
	applies    int not null,
	pid        int not null
);
create table if not exists `+s+`.`+deliveriesTable+` (
	id         bigserial primary key,
	message_id text not null,
	position   text not null,
	outcome    text not null,
	pid        int not null
)`)
	return err
}

// consumeFlags are the consume subcommand's settings (set by run).
type consumeFlags struct {
	mode, topic, group, schema, name string
	handlerDelay                     time.Duration
}

// runConsume runs one consumer process of the drill until SIGTERM (or a
// SIGKILL from run). It prints "ready" on stdout once the consumer started.
func runConsume(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	var f consumeFlags
	fs.StringVar(&f.mode, "mode", "pull", "push (rocketmqadapter.NewPushConsumer) or pull (rocketmqadapter.Source under consumer.Run)")
	fs.StringVar(&f.topic, "topic", "", "topic (required; must exist)")
	fs.StringVar(&f.group, "group", "", "consumer group, also the idemq scope (required)")
	fs.StringVar(&f.schema, "schema", "", "Postgres schema of the idemq and drill tables (required)")
	fs.StringVar(&f.name, "name", "c", "member name, for instance names")
	fs.DurationVar(&f.handlerDelay, "handler-delay", 0, "time each handler run takes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.topic == "" || f.group == "" || f.schema == "" {
		return errors.New("consume: -topic, -group and -schema are required")
	}
	pool, err := pgxpool.New(ctx, postgresDSN())
	if err != nil {
		return err
	}
	defer pool.Close()
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "drill", Secret: fingerprintSecret()})
	if err != nil {
		return err
	}
	store, err := pgstore.New(pool, pgstore.Config{Schema: f.schema, Fingerprinter: fp, MaxAttempts: maxAttempts})
	if err != nil {
		return err
	}
	qm, err := rocketmqadapter.NewQueueMetrics(prometheus.NewRegistry(), nil)
	if err != nil {
		return err
	}
	pid := os.Getpid()
	effects := pgx.Identifier{f.schema, effectsTable}.Sanitize()
	handler := func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		if f.handlerDelay > 0 {
			t := time.NewTimer(f.handlerDelay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		_, err := tx.Exec(ctx, `insert into `+effects+` (message_id, applies, pid) values ($1, 1, $2)
on conflict (message_id) do update set applies = `+effects+`.applies + 1`, m.Identity.MessageID, pid)
		return err
	}
	cc := consumer.Config{
		Scope: f.group, Store: store, Handler: handler,
		Metrics: &deliveryLog{QueueMetrics: qm, pool: pool, pid: pid,
			table: pgx.Identifier{f.schema, deliveriesTable}.Sanitize()},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	c, err := consumer.New(cc)
	if err != nil {
		return err
	}
	instance := rocketmqadapter.InstanceName("drill-" + f.name)
	fromFirst := []rmqconsumer.Option{rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset)}
	switch f.mode {
	case "push":
		pc, err := rocketmqadapter.NewPushConsumer(c, rocketmqadapter.Config{NameServers: nameServers(),
			Group: f.group, Topic: f.topic, InstanceName: instance, ClientOptions: fromFirst})
		if err != nil {
			return err
		}
		if err := pc.Start(); err != nil {
			return err
		}
		fmt.Println("ready")
		<-ctx.Done()
		return pc.Shutdown()
	case "pull":
		src, err := rocketmqadapter.NewSource(rocketmqadapter.SourceConfig{NameServers: nameServers(),
			Group: f.group, Topic: f.topic, InstanceName: instance, ClientOptions: fromFirst})
		if err != nil {
			return err
		}
		fmt.Println("ready")
		return c.Run(ctx, src)
	}
	return fmt.Errorf("consume: -mode %q: want push or pull", f.mode)
}

// deliveryLog is the consumer's Metrics: a rocketmqadapter.QueueMetrics
// that also writes one row per delivery with an acknowledgeable outcome to
// the deliveries table. The consumer calls it after the outcome is durable
// and before the broker is answered, so a SIGKILL loses no acknowledged
// delivery from the count (one killed after the outcome's commit and before
// its row was not acknowledged: its next delivery is counted).
type deliveryLog struct {
	*rocketmqadapter.QueueMetrics
	pool  *pgxpool.Pool
	pid   int
	table string
}

// ObserveMessage implements consumer.MessageObserver.
func (l *deliveryLog) ObserveMessage(scope string, msg *dedup.Message, res dedup.Result) {
	l.QueueMetrics.ObserveMessage(scope, msg, res)
	if msg == nil || !res.Outcome.Acked() {
		return
	}
	// Not the delivery's context: a graceful stop cancels it, and the row
	// must still be written.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := l.pool.Exec(ctx, `insert into `+l.table+` (message_id, position, outcome, pid) values ($1, $2, $3, $4)`,
		msg.Identity.MessageID, msg.Source, string(res.Outcome), l.pid); err != nil {
		fmt.Fprintln(os.Stderr, "drill: count delivery:", err)
	}
}
