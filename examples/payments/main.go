// Command payments is idemq's redelivery demo on a real Kafka broker and a
// real Postgres: a payments consumer that debits accounts, run once wrapped
// by idemq and once naively, against the same troubled stream.
//
// Usage:
//
//	payments demo                 produce the stream, run both consumers as
//	                              separate processes with a SIGKILL between
//	                              the database commit and the offset commit,
//	                              restart them, print the summary; exit 1 if
//	                              an idemq invariant fails
//	payments consume [flags]      run one consumer (used by demo and tests)
//
// Endpoints come from TEST_KAFKA_BROKERS and TEST_POSTGRES_DSN (defaults
// 127.0.0.1:9092 and postgres://idemq:idemq@127.0.0.1:5432/idemq), as
// printed by `scripts/services.sh env`.
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
		fmt.Fprintln(os.Stderr, "usage: payments demo | payments consume [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "demo":
		err = runDemo(ctx, os.Args[2:])
	case "consume":
		err = runConsume(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
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
