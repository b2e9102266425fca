// Command order-pipeline is idemq's outbox demo on a real Kafka broker and a
// real Postgres: a two-stage pipeline whose every hop is exactly-once in
// effect.
//
//	orders ──▶ confirmer (idemq) ──▶ orders row + outbox row ──▶ relay ──▶ order.confirmed ──▶ shipper (idemq) ──▶ shipments row
//
// The confirmer writes the order and its order.confirmed outbox row in the
// transaction that holds its consumption record; the relay publishes the row
// with its UUIDv7 as the message-id header; the shipper's dedup absorbs relay
// republishes with no code of its own.
//
// Usage:
//
//	order-pipeline demo [flags]     run the whole pipeline with two crashes,
//	                                each a real SIGKILL of a separate process:
//	                                the confirmer after its database commit
//	                                and before its offset commit, the relay
//	                                after publishing and before marking rows
//	                                published; print the summary; exit 1 if
//	                                an invariant fails
//	order-pipeline confirm [flags]  run the confirmer (orders → orders + outbox)
//	order-pipeline relay [flags]    run a relay (outbox → order.confirmed)
//	order-pipeline ship [flags]     run the shipper (order.confirmed → shipments)
//
// Endpoints come from TEST_KAFKA_BROKERS and TEST_POSTGRES_DSN (defaults
// 127.0.0.1:9092 and postgres://idemq:idemq@127.0.0.1:5432/idemq), as printed
// by `scripts/services.sh env`. Every demo run uses its own topics, consumer
// groups and schema.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemq/idemq/internal/devenv"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: order-pipeline demo | confirm | relay | ship [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "demo":
		err = runDemo(ctx, os.Args[2:])
	case "confirm":
		err = runConfirm(ctx, os.Args[2:])
	case "relay":
		err = runRelay(ctx, os.Args[2:])
	case "ship":
		err = runShip(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "order-pipeline:", err)
		os.Exit(1)
	}
}

// common are the flags every subcommand takes.
type common struct {
	dsn, brokers, schema  string
	ordersTopic, outTopic string
	events                string
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dsn, "dsn", devenv.PostgresDSN(), "Postgres DSN")
	fs.StringVar(&c.brokers, "brokers", devenv.KafkaBrokers(), "Kafka bootstrap brokers, comma separated")
	fs.StringVar(&c.schema, "schema", "order_pipeline", "Postgres schema for idemq's and the example's tables")
	fs.StringVar(&c.ordersTopic, "orders-topic", "orders", "input topic")
	fs.StringVar(&c.outTopic, "confirmed-topic", "order.confirmed", "topic the relay publishes confirmations to")
	fs.StringVar(&c.events, "events", "", "append a JSON stats line here on exit (used by demo)")
}

func (c *common) brokerList() []string { return devenv.Split(c.brokers) }

func (c *common) args() []string {
	return []string{"-dsn", c.dsn, "-brokers", c.brokers, "-schema", c.schema,
		"-orders-topic", c.ordersTopic, "-confirmed-topic", c.outTopic}
}
