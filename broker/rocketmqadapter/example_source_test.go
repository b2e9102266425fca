package rocketmqadapter_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"github.com/idemq/idemq/broker/rocketmqadapter"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Consume a topic in pull mode, with idemq owning the offsets, and export
// the per-queue redelivery and duplicate counters. It needs Postgres and
// RocketMQ, so it is compiled but not run.
func ExampleNewSource() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://idemq:idemq@127.0.0.1:5432/idemq?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	fp, _ := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "k1", Secret: []byte("a-secret-from-your-secret-store")})
	store, err := pgstore.New(pool, pgstore.Config{Fingerprinter: fp, MaxAttempts: 5})
	if err != nil {
		log.Fatal(err)
	}
	ns := []string{"127.0.0.1:9876"}
	if err := rocketmqadapter.EnsureTopic(ctx, ns, "127.0.0.1:10911", "orders", 4); err != nil {
		log.Fatal(err)
	}
	outcomes, err := consumer.NewPrometheusMetrics(prometheus.DefaultRegisterer)
	if err != nil {
		log.Fatal(err)
	}
	// idemq_rocketmq_{deliveries,redeliveries,duplicates}_total{scope,topic,queue},
	// passing every call on to the outcome counters.
	metrics, err := rocketmqadapter.NewQueueMetrics(prometheus.DefaultRegisterer, outcomes)
	if err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Scope: "order-svc",
		Store: store,
		Handler: func(ctx context.Context, tx pgx.Tx, msg *dedup.Message) error {
			_, err := tx.Exec(ctx, `insert into orders (order_id, body) values ($1, $2)`, msg.Identity.BusinessKey, msg.Payload)
			return err
		},
		BusinessKey: rocketmqadapter.BusinessKeyFromKeys,
		Metrics:     metrics,
	})
	if err != nil {
		log.Fatal(err)
	}
	src, err := rocketmqadapter.NewSource(rocketmqadapter.SourceConfig{NameServers: ns, Group: "order-svc", Topic: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	// Run returns after SIGTERM once the lanes have finished, the completed
	// offsets are committed and the Source is closed.
	if err := c.Run(ctx, src); err != nil {
		log.Fatal(err)
	}
}
