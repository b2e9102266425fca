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
