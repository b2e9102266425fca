package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemq/idemq/broker/kafkaadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/kafkapub"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

// Order is the payload of an orders message.
type Order struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// Confirmation is the payload of an order.confirmed message.
type Confirmation struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Status      string `json:"status"`
}

// app is one process's connection to the pipeline's tables.
type app struct {
	pool  *pgxpool.Pool
	store *pgstore.Store
	ob    *outbox.Outbox
	s     string // quoted schema
}

func openApp(ctx context.Context, c *common) (*app, error) {
	pool, err := pgxpool.New(ctx, c.dsn)
	if err != nil {
		return nil, err
	}
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "demo-1", Secret: []byte("order-pipeline-demo-secret-0123456789")})
	if err != nil {
		return nil, err
	}
	st, err := pgstore.New(pool, pgstore.Config{Schema: c.schema, Fingerprinter: fp})
	if err != nil {
		return nil, err
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: c.schema})
	if err != nil {
		return nil, err
	}
	return &app{pool: pool, store: st, ob: ob, s: pgx.Identifier{c.schema}.Sanitize()}, nil
}

// migrate creates idemq's tables (consumption records, dead letters, outbox)
// and the example's business tables. The business tables have no unique
// constraint on order_id on purpose: exactly-once comes from idemq, and a
// double effect would show as a second row.
func (a *app) migrate(ctx context.Context) error {
	if err := a.store.Migrate(ctx); err != nil {
		return err
	}
	if err := a.ob.Migrate(ctx); err != nil {
		return err
	}
	_, err := a.pool.Exec(ctx, `
create table if not exists `+a.s+`.orders (
  n bigint generated always as identity primary key,
  order_id text not null, amount_cents bigint not null, confirmed_at timestamptz not null default now(),
  confirmation_id uuid not null, confirmed_by text not null default '');
create table if not exists `+a.s+`.shipments (
  n bigint generated always as identity primary key,
  order_id text not null, confirmation_message_id text not null, shipped_at timestamptz not null default now())`)
	return err
}

// confirm is the confirmer's handler: the order row and the order.confirmed
// outbox row go into the transaction idemq hands it, beside the consumption
// record. The row names the process that committed it (instance), so the
// demo counts each process's work from the table, never from timing.
func (a *app) confirm(outTopic, instance string) pgstore.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		var o Order
		if err := json.Unmarshal(m.Payload, &o); err != nil || o.OrderID == "" {
			return dedup.Permanent(fmt.Errorf("bad order payload: %v", err))
		}
		body, _ := json.Marshal(Confirmation{OrderID: o.OrderID, AmountCents: o.AmountCents, Status: "confirmed"})
		id, err := a.ob.Add(ctx, tx, outbox.Message{
			Topic:       outTopic,
			Key:         []byte(o.OrderID),
			Headers:     map[string]string{"content-type": "application/json"},
			Payload:     body,
			CausationID: outbox.Causation(m),
		})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `insert into `+a.s+`.orders (order_id, amount_cents, confirmation_id, confirmed_by) values ($1, $2, $3, $4)`,
			o.OrderID, o.AmountCents, id, instance)
		return err
	}
}

// ship is the shipper's handler: one shipment per confirmation.
func (a *app) ship() pgstore.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *dedup.Message) error {
		var c Confirmation
		if err := json.Unmarshal(m.Payload, &c); err != nil || c.OrderID == "" {
			return dedup.Permanent(fmt.Errorf("bad confirmation payload: %v", err))
		}
		_, err := tx.Exec(ctx, `insert into `+a.s+`.shipments (order_id, confirmation_message_id) values ($1, $2)`,
			c.OrderID, m.Identity.MessageID)
		return err
	}
}

// crashMetrics counts outcomes and, after crashAfter processed deliveries,
// SIGKILLs its own process. Metrics.Delivery runs after the outcome's
// transaction committed and before the offset is handed to the committer:
// exactly between the database commit and the broker ack.
type crashMetrics struct {
	consumer.Counters
	crashAfter int64
	processed  atomic.Int64
}

func (c *crashMetrics) Delivery(scope string, outcome dedup.Outcome, by dedup.MatchedBy) {
	c.Counters.Delivery(scope, outcome, by)
	if outcome == dedup.OutcomeProcessed && c.crashAfter > 0 && c.processed.Add(1) == c.crashAfter {
		fmt.Fprintf(os.Stderr, "[%s] crash point: the %dth delivery committed in Postgres (others in flight on other partitions may commit too), none acked; SIGKILL\n", scope, c.crashAfter)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never ack
	}
}

// stats is the line a process appends to its events file.
type stats struct {
	Role      string           `json:"role"`
	Event     string           `json:"event"`
	Counters  map[string]int64 `json:"counters,omitempty"`
	Published []string         `json:"published,omitempty"`
}

func writeEvent(path string, s stats) error {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(s)
	if _, err := f.Write(append(b, '\n')); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func quietLogs() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// consume runs an idemq consumer until ctx ends.
func consume(ctx context.Context, c *common, role, group, topic string, h func(*app) pgstore.Handler, crashAfter int) error {
	quietLogs()
	a, err := openApp(ctx, c)
	if err != nil {
		return err
	}
	defer a.pool.Close()
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Reader: kafka.ReaderConfig{
		Brokers: c.brokerList(), GroupID: group, Topic: topic, StartOffset: kafka.FirstOffset,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second, RebalanceTimeout: 6 * time.Second,
		MaxWait: 100 * time.Millisecond,
	}})
	if err != nil {
		return err
	}
	m := &crashMetrics{crashAfter: int64(crashAfter)}
	cfg := consumer.Config{Scope: group, Store: a.store, Handler: h(a), Metrics: m,
		CommitEvery: 10, CommitInterval: 200 * time.Millisecond}
	if crashAfter > 0 {
		// Hold every offset commit until after the crash point.
		cfg.CommitEvery, cfg.CommitInterval = 1_000_000, time.Hour
	}
	cons, err := consumer.New(cfg)
	if err != nil {
		return err
	}
	if err := cons.Run(ctx, src); err != nil {
		return err
	}
	return writeEvent(c.events, stats{Role: role, Event: "stopped", Counters: m.Snapshot()})
}

func runConfirm(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("confirm", flag.ExitOnError)
	var c common
	c.register(fs)
	group := fs.String("group", "confirmer", "consumer group (and dedup scope)")
	crashAfter := fs.Int("crash-after", 0, "SIGKILL this process after N committed deliveries, before acking them (0: never)")
	instance := fs.String("instance", "confirmer", "name written to orders.confirmed_by for the rows this process commits")
	_ = fs.Parse(args)
	return consume(ctx, &c, "confirmer", *group, c.ordersTopic, func(a *app) pgstore.Handler { return a.confirm(c.outTopic, *instance) }, *crashAfter)
}

func runShip(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ship", flag.ExitOnError)
	var c common
	c.register(fs)
	group := fs.String("group", "shipper", "consumer group (and dedup scope)")
	_ = fs.Parse(args)
	return consume(ctx, &c, "shipper", *group, c.outTopic, func(a *app) pgstore.Handler { return a.ship() }, 0)
}

func runRelay(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("relay", flag.ExitOnError)
	var c common
	c.register(fs)
	name := fs.String("name", "", "relay instance name (default host-pid-random)")
	crash := fs.Bool("crash-after-publish", false, "SIGKILL this process after its first batch is published, before it is marked")
	_ = fs.Parse(args)
	quietLogs()
	a, err := openApp(ctx, &c)
	if err != nil {
		return err
	}
	defer a.pool.Close()
	pub, err := kafkapub.New(kafkapub.Config{Brokers: c.brokerList()})
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	cfg := outbox.RelayConfig{Name: *name, PollInterval: 250 * time.Millisecond,
		RetryInitial: 200 * time.Millisecond, RetryMax: 2 * time.Second}
	var relayPub outbox.Publisher = pub
	if *crash {
		relayPub = crashAfterPublish{ChainPublisher: pub, kill: func(published []outbox.Envelope) {
			ids := make([]string, len(published))
			for i, e := range published {
				ids[i] = e.ID.String()
			}
			_ = writeEvent(c.events, stats{Role: "relay", Event: "published-before-kill", Published: ids})
			fmt.Fprintf(os.Stderr, "[relay %s] crash point: %d rows acknowledged by Kafka, not yet marked published; SIGKILL\n", *name, len(ids))
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}}
	}
	r, err := outbox.NewRelay(a.ob, relayPub, cfg)
	if err != nil {
		return err
	}
	if err := r.Run(ctx); err != nil {
		return err
	}
	st := r.Stats()
	return writeEvent(c.events, stats{Role: "relay", Event: "stopped", Counters: map[string]int64{
		"published": st.Published, "failed": st.Failed, "parked": st.Parked, "batches": st.Batches, "db_errors": st.DBErrors}})
}

var errInvariant = errors.New("order-pipeline: invariants failed")

// crashAfterPublish wraps the relay's publisher: once a call has had rows
// acknowledged by Kafka, it calls kill with them before returning, so the
// process dies after the publish and before the relay marks the rows
// published (the window the outbox is built to survive: the rows are
// published again, with the same message IDs, by another relay).
type crashAfterPublish struct {
	outbox.ChainPublisher
	kill func(published []outbox.Envelope)
}

// Publish implements outbox.Publisher.
func (c crashAfterPublish) Publish(ctx context.Context, batch []outbox.Envelope) error {
	err := c.ChainPublisher.Publish(ctx, batch)
	var pe outbox.PublishErrors
	var acked []outbox.Envelope
	for i, e := range batch {
		if err == nil || (errors.As(err, &pe) && len(pe) == len(batch) && pe[i] == nil) {
			acked = append(acked, e)
		}
	}
	if len(acked) > 0 {
		c.kill(acked)
	}
	return err
}

// PublishChains implements outbox.ChainPublisher.
func (c crashAfterPublish) PublishChains(ctx context.Context, chains [][]outbox.Envelope) []outbox.ChainResult {
	res := c.ChainPublisher.PublishChains(ctx, chains)
	var acked []outbox.Envelope
	for i, r := range res {
		acked = append(acked, chains[i][:min(max(r.Acked, 0), len(chains[i]))]...)
	}
	if len(acked) > 0 {
		c.kill(acked)
	}
	return res
}
