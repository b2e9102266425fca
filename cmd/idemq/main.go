// Command idemq is idemq's operations tool. Each command lives in its own
// file and registers itself in commands; the outbox commands are:
//
//	idemq relay [flags]             run an outbox relay until SIGINT/SIGTERM
//	idemq outbox migrate [flags]    create or upgrade the outbox table
//	idemq outbox stats [flags]      count pending, parked and published rows
//	idemq outbox parked [flags]     list parked rows with their last error
//	idemq outbox unpark [flags] ID… make parked rows publishable again
//
// The database comes from -dsn, else IDEMQ_DATABASE_URL, else
// TEST_POSTGRES_DSN, else postgres://idemq:idemq@127.0.0.1:5432/idemq.
// Run `idemq <command> -h` for the flags of a command.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// commands maps a command name to its implementation; each gets the
// arguments after its name.
var commands = map[string]func(ctx context.Context, args []string) error{
	"relay":  runRelay,
	"outbox": runOutbox,
}

func main() {
	if len(os.Args) < 2 || commands[os.Args[1]] == nil {
		names := make([]string, 0, len(commands))
		for n := range commands {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: idemq %s [flags] (idemq <command> -h for its flags)\n", strings.Join(names, "|"))
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := commands[os.Args[1]](ctx, os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "idemq:", err)
		os.Exit(1)
	}
}
