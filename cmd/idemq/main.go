// Command idemq is idemq's operations tool:
//
//	idemq migrate [flags]           create or upgrade the consumption-record and dead-letter tables
//	idemq inspect [flags]           show the consumption record of a message ID or business key
//	idemq dead-letters [flags]      list the dead letters of a scope
//	idemq redrive [flags]           make a FAILED_FINAL record retryable again
//	idemq purge [flags]             delete expired consumption records
//	idemq relay [flags]             run an outbox relay until SIGINT/SIGTERM
//	idemq outbox migrate [flags]    create or upgrade the outbox table
//	idemq outbox stats [flags]      count pending, parked and published rows
//	idemq outbox parked [flags]     list parked rows with their last error
//	idemq outbox unpark [flags] ID… make parked rows publishable again
//
// Each command lives in its own file and registers itself in commands. The
// database comes from -dsn, else IDEMQ_DATABASE_URL, else TEST_POSTGRES_DSN,
// else postgres://idemq:idemq@127.0.0.1:5432/idemq; -schema names the schema
// of idemq's tables (default "idemq"). Run `idemq <command> -h` for the flags
// of a command.
package main

import (
	"context"
	"errors"
	"flag"
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
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the flag package printed the usage
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "idemq") {
			msg = "idemq: " + msg
		}
		if strings.Contains(msg, "SQLSTATE 42P01") {
			msg += "\n(the table is not in that schema: pass the -schema your consumer's store uses, or run `idemq migrate -schema …` first)"
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}
}
