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
