package devenv

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Defaults of the local services started by scripts/services.sh.
const (
	DefaultPostgresDSN     = "postgres://idemq:idemq@127.0.0.1:5432/idemq?sslmode=disable"
	DefaultKafkaBrokers    = "127.0.0.1:9092"
	DefaultRocketMQNamesrv = "127.0.0.1:9876"
	DefaultRocketMQBroker  = "127.0.0.1:10911"
)

// Get returns the environment variable name, or def when it is unset or empty.
func Get(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// PostgresDSN is TEST_POSTGRES_DSN or DefaultPostgresDSN.
func PostgresDSN() string { return Get("TEST_POSTGRES_DSN", DefaultPostgresDSN) }

// KafkaBrokers is TEST_KAFKA_BROKERS or DefaultKafkaBrokers (comma separated).
func KafkaBrokers() string { return Get("TEST_KAFKA_BROKERS", DefaultKafkaBrokers) }

// RocketMQNamesrv is TEST_ROCKETMQ_NAMESRV or DefaultRocketMQNamesrv (comma
// separated).
func RocketMQNamesrv() string { return Get("TEST_ROCKETMQ_NAMESRV", DefaultRocketMQNamesrv) }

// RocketMQBroker is TEST_ROCKETMQ_BROKER or DefaultRocketMQBroker.
func RocketMQBroker() string { return Get("TEST_ROCKETMQ_BROKER", DefaultRocketMQBroker) }

// Split splits a comma-separated address list, dropping empty parts.
func Split(list string) []string {
	var out []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// Command is one subcommand of a program: it gets the arguments after its
// name and a context canceled on SIGINT or SIGTERM.
type Command func(ctx context.Context, args []string) error

// Main runs the subcommand named by os.Args[1] from cmds with a context
// canceled on SIGINT/SIGTERM. It prints usage and exits 2 when the name is
// missing or unknown, exits 0 after -h, and prints "prog: error" and exits 1
// when the command fails.
func Main(prog, usage string, cmds map[string]Command) {
	if len(os.Args) < 2 || cmds[os.Args[1]] == nil {
		if len(os.Args) >= 2 && (os.Args[1] == "-h" || os.Args[1] == "-help" || os.Args[1] == "--help" || os.Args[1] == "help") {
			fmt.Fprintln(os.Stderr, "usage:", usage)
			return
		}
		fmt.Fprintln(os.Stderr, "usage:", usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := cmds[os.Args[1]](ctx, os.Args[2:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
		os.Exit(1)
	}
}
