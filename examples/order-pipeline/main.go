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
