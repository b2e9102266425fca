package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/outbox"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Exit codes of idemq.
const (
	exitOK       = 0 // done
	exitRuntime  = 1 // the work failed: database, broker, interrupted
	exitUsage    = 2 // bad command line or configuration; nothing was done
	exitNotFound = 3 // the record, dead letter or outbox row asked for does not exist
)

// usageError is a bad command line or configuration, found before any work
// or connection: exit 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef returns a usageError.
func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// app is one run of idemq: its output streams, environment and the
// openers of what it talks to (replaced by the unit tests).
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// started is set once the flags and arguments of the command parsed:
	// errors cobra returns before are usage errors.
	started bool
	// secrets are the passwords of the DSN and Redis URL in use: every
	// error printed has them replaced.
	secrets []string
	// logger, when set (relay --log-format json), receives the final
	// error as a JSON log line instead of plain text.
	logger *slog.Logger
	// openDeadLetters opens the store of the dead-letter verbs (the unit
	// tests give a fake).
	openDeadLetters func(ctx context.Context, f *storeFlags) (any, func(), error)
}

// run runs idemq with args and returns its exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	a := &app{stdout: stdout, stderr: stderr, getenv: getenv}
	a.openDeadLetters = a.openStoreAny
	return a.execute(ctx, args)
}

func (a *app) execute(ctx context.Context, args []string) int {
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	if cmd, err := singleDashCheck(root, args); err != nil {
		a.printError(cmd, err)
		return exitUsage
	}
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	if !a.started {
		err = usageError{err}
	}
	a.printError(cmd, err)
	return exitCode(err)
}

// exitCode is err's exit code: exitUsage for a usage error, exitNotFound
// when what was asked for does not exist, else exitRuntime.
func exitCode(err error) int {
	switch {
	case isUsage(err):
		return exitUsage
	case errors.Is(err, dedup.ErrNotFound) || errors.Is(err, outbox.ErrNotFound):
		return exitNotFound
	}
	return exitRuntime
}

// printError writes err to stderr, secrets redacted, with a hint for usage
// errors and for a missing table.
func (a *app) printError(cmd *cobra.Command, err error) {
	msg := a.redact(err.Error())
	if !strings.HasPrefix(msg, "idemq") {
		msg = "idemq: " + msg
	}
	if strings.Contains(msg, "SQLSTATE 42P01") {
		msg += "\n(the table is not in that schema: pass the --schema your consumer's store uses, or run `idemq migrate --schema …` first)"
	}
	if a.logger != nil {
		a.logger.Error(msg, "exit", exitCode(err))
		return
	}
	_, _ = fmt.Fprintln(a.stderr, msg)
	var ue usageError
	if errors.As(err, &ue) && cmd != nil {
		_, _ = fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
}

// redact replaces the secrets in s.
func (a *app) redact(s string) string {
	for _, p := range a.secrets {
		if p != "" {
			s = strings.ReplaceAll(s, p, "xxxxx")
		}
	}
	return s
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "idemq",
		Short: "idemq's operations tool: migrations, records, dead letters, outbox and relay",
		Long: `idemq operates idemq's Postgres tables (or a Redis-only store): migrate them,
inspect consumption records, work with dead letters, purge, and run or drain
an outbox relay.

Configuration comes from flags, else from the environment variable named in
each flag's help (IDEMQ_DATABASE_URL for --dsn, IDEMQ_REDIS_URL for --redis,
...). There are no built-in defaults for where the database or brokers are.
Secrets are never printed: help shows no DSN, errors and logs redact
passwords.

Exit codes: 0 done, 1 the work failed (database, broker, interrupted),
2 usage error (unknown flag, bad value, missing or conflicting flags, wrong
arguments; nothing is done), 3 not found (the record, dead letter or outbox
row asked for does not exist).`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		Args:              cobra.NoArgs,
		RunE:              groupRunE,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.applyEnv(cmd); err != nil {
				return err
			}
			// cobra checks flag groups after this hook: check them here so
			// that their errors are usage errors too.
			if err := cmd.ValidateRequiredFlags(); err != nil {
				return usageError{err}
			}
			if err := cmd.ValidateFlagGroups(); err != nil {
				return usageError{err}
			}
			a.started = true
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		if strings.Contains(err.Error(), "shorthand") {
			err = fmt.Errorf("%w (long flags take two dashes, e.g. --dsn)", err)
		}
		return usageError{err}
	})
	root.AddCommand(a.migrateCommand(), a.inspectCommand(), a.redriveCommand(), a.purgeCommand(),
		a.deadLettersCommand(), a.relayCommand(), a.outboxCommand())
	return root
}

// groupRunE is the RunE of a command that only groups others: without a
// subcommand, or with an unknown one, it is a usage error.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return usagef("%s: give a command: %s", cmd.CommandPath(), strings.Join(subNames(cmd), ", "))
}

func subNames(cmd *cobra.Command) []string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return names
}

// exactArgs, rangeArgs wrap cobra's argument checks as usage errors.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s: want %d argument(s) (%s), got %d", cmd.CommandPath(), n, what, len(args))
		}
		return nil
	}
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s: takes no arguments, got %q", cmd.CommandPath(), args)
	}
	return nil
}

var numberArg = regexp.MustCompile(`^-[0-9.]`)

// singleDashCheck refuses a long flag written with one dash (-dsn), as the
// old flag-package CLI took them: pflag would read it as shorthand flags
// (-d -s -n, or -o with value "nce" for -once), silently different.
func singleDashCheck(root *cobra.Command, args []string) (*cobra.Command, error) {
	cmd, _, err := root.Find(args)
	if err != nil || cmd == nil {
		return nil, nil // cobra reports the unknown command
	}
	for _, arg := range args {
		if arg == "--" {
			return nil, nil
		}
		if len(arg) < 3 || arg[0] != '-' || arg[1] == '-' || numberArg.MatchString(arg) {
			continue
		}
		name, _, _ := strings.Cut(arg[1:], "=")
		if f := lookupFlag(cmd, name); f != nil {
			return cmd, usageError{fmt.Errorf("%s: unknown flag %s: long flags take two dashes: --%s", cmd.CommandPath(), arg, arg[1:])}
		}
	}
	return nil, nil
}

func lookupFlag(cmd *cobra.Command, name string) *pflag.Flag {
	if f := cmd.Flags().Lookup(name); f != nil {
		return f
	}
	if name == "help" {
		return &pflag.Flag{Name: "help"}
	}
	return cmd.InheritedFlags().Lookup(name)
}
