package main

import (
	"flag"

	"github.com/idemq/idemq/internal/devenv"
)

func main() {
	devenv.Main("order-pipeline", "order-pipeline demo | confirm | relay | ship [flags]", map[string]devenv.Command{
		"demo":    runDemo,
		"confirm": runConfirm,
		"relay":   runRelay,
		"ship":    runShip,
	})
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
