package main

import (
	"flag"

	"github.com/idemq/idemq/internal/devenv"
)

func main() {
	devenv.Main("payments", "payments demo | payments consume [flags]", map[string]devenv.Command{
		"demo":    runDemo,
		"consume": runConsume,
	})
}

// endpoints are the service addresses shared by every subcommand.
type endpoints struct {
	brokers []string
	dsn     string
}

func (e *endpoints) register(fs *flag.FlagSet) *string {
	fs.StringVar(&e.dsn, "dsn", devenv.PostgresDSN(), "Postgres DSN")
	return fs.String("brokers", devenv.KafkaBrokers(), "Kafka bootstrap brokers, comma separated")
}

func splitBrokers(s string) []string { return devenv.Split(s) }
