package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/dedup/redisstore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// recordAdmin is what inspect, dead-letters and redrive need; both stores
// have it.
type recordAdmin interface {
	Lookup(ctx context.Context, scope, messageID string) (dedup.Record, error)
	LookupBusinessKey(ctx context.Context, scope, businessKey string) (dedup.Record, error)
	DeadLetters(ctx context.Context, scope string, afterID int64, limit int) ([]dedup.DeadLetter, error)
	Redrive(ctx context.Context, scope, messageID string) error
	RedriveAsNew(ctx context.Context, scope string, deadLetterID int64, opt dedup.RedriveAsNewOptions) (dedup.RedriveAsNewResult, error)
}

// openStoreAny opens the store the flags name (after checkStore): a
// *pgstore.Store or a *redisstore.Store; closeStore releases it.
func (a *app) openStoreAny(ctx context.Context, f *storeFlags) (st any, closeStore func(), err error) {
	if isRedis, _ := f.useRedis(); isRedis {
		opt, err := redis.ParseURL(f.redisURL)
		if err != nil {
			return nil, nil, usagef("--redis: %v", err)
		}
		c := redis.NewClient(opt)
		rst, err := redisstore.New(redisstore.Config{Client: c, Prefix: f.prefix, Fingerprinter: adminFingerprinter()})
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		return rst, func() { _ = c.Close() }, nil
	}
	pool, pst, err := a.openPG(ctx, f)
	if err != nil {
		return nil, nil, err
	}
	return pst, pool.Close, nil
}

// admin opens the store as a recordAdmin.
func (a *app) admin(ctx context.Context, f *storeFlags) (recordAdmin, func(), error) {
	st, closeStore, err := a.openStoreAny(ctx, f)
	if err != nil {
		return nil, nil, err
	}
	return st.(recordAdmin), closeStore, nil
}

// adminFingerprinter is a placeholder key: administration never computes a
// fingerprint.
func adminFingerprinter() *dedup.Fingerprinter {
	fp, err := dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "cli-admin", Secret: []byte("admin-commands-never-fingerprint")})
	if err != nil {
		panic(err) // a constant key
	}
	return fp
}

// openPG returns a Postgres Store for administration.
func (a *app) openPG(ctx context.Context, f *storeFlags) (*pgxpool.Pool, *pgstore.Store, error) {
	pool, err := a.openPool(ctx, &f.db)
	if err != nil {
		return nil, nil, err
	}
	st, err := pgstore.New(pool, f.pgConfig())
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, st, nil
}

func (f *storeFlags) pgConfig() pgstore.Config {
	return pgstore.Config{Schema: f.db.schema, RecordsTable: f.records, DeadLettersTable: f.deadLetters, Fingerprinter: adminFingerprinter()}
}

// migrateFlags are the flags of `idemq migrate` and `idemq outbox migrate`
// besides the table names: --print writes the SQL instead of applying it,
// --check only verifies the version.
type migrateFlags struct {
	print, check bool
	out          outputFormat
}

func (m *migrateFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.BoolVar(&m.print, "print", false, "print the versioned migration SQL (schema and table names filled in) for Flyway/goose/Atlas/psql instead of applying it; needs no database")
	fs.BoolVar(&m.check, "check", false, "only check, read-only, that the schema version is current (exit 1 with what to run if not); needs no DDL rights")
	cmd.MarkFlagsMutuallyExclusive("print", "check")
	registerOutput(fs, &m.out)
}

// migrateResult is the JSON of migrate and outbox migrate.
type migrateResult struct {
	Schema string   `json:"schema"`
	Tables []string `json:"tables"`
	Action string   `json:"action"` // "migrated" or "checked"
}

func (a *app) printMigrate(out outputFormat, r migrateResult, text string) error {
	if out == "json" {
		return writeJSON(a.stdout, r)
	}
	_, err := fmt.Fprintln(a.stdout, text)
	return err
}

func (a *app) migrateCommand() *cobra.Command {
	var f storeFlags
	var mf migrateFlags
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the consumption-record and dead-letter tables",
		Long: `Create or upgrade the consumption-record and dead-letter tables in --schema.

--print writes the versioned SQL instead (for Flyway, goose, Atlas or psql;
it needs no database). --check only verifies, read-only, that the schema
version is current: it needs no DDL rights and exits 1 naming what to run
when the schema is missing or outdated.`,
		Example: `  idemq migrate --dsn "$IDEMQ_DATABASE_URL" --schema idemq
  idemq migrate --print --schema idemq > V1__idemq.sql
  idemq migrate --check`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if mf.print {
				if f.records == "" || f.deadLetters == "" || f.db.schema == "" {
					return usagef("--schema, --records-table and --dead-letters-table must not be empty")
				}
				sql, err := pgstore.MigrationSQL(f.pgConfig())
				if err != nil {
					return usageError{err}
				}
				_, err = fmt.Fprint(a.stdout, sql)
				return err
			}
			if err := a.checkStore(&f); err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, st, err := a.openPG(ctx, &f)
			if err != nil {
				return err
			}
			defer pool.Close()
			r := migrateResult{Schema: f.db.schema, Tables: []string{f.records, f.deadLetters}, Action: "checked"}
			if mf.check {
				if err := st.CheckSchema(ctx); err != nil {
					return err
				}
				return a.printMigrate(mf.out, r, fmt.Sprintf("consumption records and dead letters are current in schema %q", f.db.schema))
			}
			if err := st.Migrate(ctx); err != nil {
				return err
			}
			r.Action = "migrated"
			return a.printMigrate(mf.out, r, fmt.Sprintf("consumption records and dead letters migrated in schema %q", f.db.schema))
		},
	}
	f.register(cmd, false)
	mf.register(cmd)
	return cmd
}

func (a *app) inspectCommand() *cobra.Command {
	var f storeFlags
	var sf scopeFlags
	var msgID, bk string
	var showBody bool
	out := outputFormat("json")
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Show the consumption record of a message ID or business key",
		Long: `Show the consumption record of a message ID (--message-id) or business key
(--business-key) in a scope: one JSON object on stdout (-o json, the
default), or one "field: value" line per field (-o table).
A record that does not exist exits 3.

For an HTTP request (the --http-* flags, or a scope starting with "http|")
it adds the stored response's status, sealing, size and canonicalization
version; its body only with --show-body, and never a sealed one.`,
		Example: `  idemq inspect --scope payments --message-id m-09
  idemq inspect --scope payments --business-key pay-42
  idemq inspect --http-tenant acme --http-principal alice --http-method POST --http-route "POST /payments" --message-id K1`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scope, err := sf.resolve(cmd, &f, false)
			if err != nil {
				return err
			}
			if (msgID == "") == (bk == "") {
				return usagef("inspect: give exactly one of --message-id and --business-key")
			}
			if err := a.checkStore(&f); err != nil {
				return err
			}
			ctx := cmd.Context()
			if msgID != "" && f.redisURL == "" && isHTTPScope(scope) {
				return a.inspectHTTP(ctx, &f, scope, msgID, showBody, out)
			}
			st, closeStore, err := a.admin(ctx, &f)
			if err != nil {
				return err
			}
			defer closeStore()
			var r dedup.Record
			if msgID != "" {
				r, err = st.Lookup(ctx, scope, msgID)
			} else {
				r, err = st.LookupBusinessKey(ctx, scope, bk)
			}
			if err != nil {
				if errors.Is(err, dedup.ErrNotFound) {
					err = fmt.Errorf("inspect: %w: scope %q, %s", err, scope, lookupName(msgID, bk))
				}
				return err
			}
			return writeObject(a.stdout, out, r)
		},
	}
	f.register(cmd, true)
	sf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&msgID, "message-id", "", "message ID, or an HTTP request's Idempotency-Key (or use --business-key)")
	fs.StringVar(&bk, "business-key", "", "business key")
	fs.BoolVar(&showBody, "show-body", false, "HTTP request: also print the stored response body (never a sealed one)")
	fs.VarP(&out, "output", "o", "output format: json (the default: one JSON object on stdout) or table (one field: value line per field)")
	return cmd
}

func (a *app) redriveCommand() *cobra.Command {
	var f storeFlags
	var sf scopeFlags
	var msgID string
	var an asNewFlags
	cmd := &cobra.Command{
		Use:   "redrive",
		Short: "Make one FAILED_FINAL record retryable again, or re-drive a conflict's dead letter as a new message",
		Long: `Make the FAILED_FINAL record of --message-id in a scope FAILED_RETRYABLE: its
next delivery runs the handler again.

With --as-new --id N, re-drive the conflict's dead letter N as a new message
instead: an audit row is written and the dead letter is published under the
message ID "<message ID>#redrive-<N>" to --broker (a payload conflict needs
--force). For many dead letters at once, by scope, reason or time, see
'idemq dead-letters redrive'.`,
		Example: `  idemq redrive --scope payments --message-id m-09
  idemq redrive --as-new --scope payments --id 42 --kafka-brokers kafka:9092`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scope, err := sf.resolve(cmd, &f, false)
			if err != nil {
				return err
			}
			if an.asNew {
				if msgID != "" {
					return usagef("redrive: --as-new re-drives one dead letter: give its --id (see idemq dead-letters list), not --message-id")
				}
				if err := an.check(a); err != nil {
					return err
				}
				if err := a.checkStore(&f); err != nil {
					return err
				}
				return a.redriveAsNew(cmd.Context(), &an, &f, scope)
			}
			if msgID == "" {
				return usagef("redrive: --message-id is required (or --as-new --id N for a conflict's dead letter)")
			}
			if err := a.checkStore(&f); err != nil {
				return err
			}
			ctx := cmd.Context()
			st, closeStore, err := a.admin(ctx, &f)
			if err != nil {
				return err
			}
			defer closeStore()
			if err := st.Redrive(ctx, scope, msgID); err != nil {
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "%s/%s is FAILED_RETRYABLE: its next delivery runs the handler again\n", scope, msgID)
			return err
		},
	}
	f.register(cmd, true)
	sf.register(cmd)
	cmd.Flags().StringVar(&msgID, "message-id", "", "message ID (an HTTP request's Idempotency-Key) of the FAILED_FINAL record (not with --as-new)")
	an.register(cmd)
	return cmd
}

func (a *app) purgeCommand() *cobra.Command {
	var f storeFlags
	var batch int
	var deadLetters bool
	var olderThan, every time.Duration
	var out outputFormat
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete expired consumption records (--dead-letters: old dead letters)",
		Long: `Delete the expired consumption records, or with --dead-letters the dead
letters created longer ago than --older-than (with their re-drive audit
rows), in bounded statements, with a progress line on stderr.

Interrupted (SIGINT/SIGTERM), it reports how many rows it deleted (the
statement in flight rolls back) and exits 1. Postgres only: a Redis-only
store expires its records itself.`,
		Example: `  idemq purge --batch 5000
  idemq purge --dead-letters --older-than 720h`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case batch < 1 || batch > 100000:
				return usagef("--batch %d must be 1 to 100000", batch)
			case olderThan < time.Minute:
				return usagef("--older-than %s must be at least 1m", olderThan)
			case !deadLetters && cmd.Flags().Changed("older-than"):
				return usagef("--older-than is for --dead-letters (records carry their own expiry)")
			case every < 0:
				return usagef("--progress %s must not be negative", every)
			}
			if err := a.checkStore(&f); err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, st, err := a.openPG(ctx, &f)
			if err != nil {
				return err
			}
			defer pool.Close()
			p := newProgress(a.stderr, every)
			o := pgstore.PurgeOptions{Batch: batch, OlderThan: olderThan, Progress: p.step}
			what := "expired records"
			var n int64
			if deadLetters {
				what = fmt.Sprintf("dead letters older than %s", olderThan)
				n, err = st.PurgeDeadLetters(ctx, o)
			} else {
				n, err = st.PurgeRecords(ctx, o)
			}
			return a.purgeDone(ctx, out, "purge", what, n, p, err)
		},
	}
	f.register(cmd, false)
	fs := cmd.Flags()
	fs.IntVar(&batch, "batch", pgstore.DefaultPurgeBatch, "rows read per statement (the expired ones among them are deleted); 1 to 100000")
	fs.BoolVar(&deadLetters, "dead-letters", false, "purge dead letters older than --older-than (with their re-drive audit rows) instead of expired records")
	fs.DurationVar(&olderThan, "older-than", pgstore.DefaultDeadLetterRetention, "with --dead-letters: delete dead letters created longer ago than this (at least 1m)")
	fs.DurationVar(&every, "progress", time.Second, "print the rows deleted so far and the rate on stderr at most this often (0: after every statement that deleted rows)")
	registerOutput(fs, &out)
	return cmd
}

// purgeResult is the JSON summary of the purges.
type purgeResult struct {
	Deleted int64   `json:"deleted"`
	What    string  `json:"what"`
	Seconds float64 `json:"seconds"`
}

// purgeDone reports a purge: the summary on stdout, or, when it failed or
// was interrupted, what it deleted before in the error (exit 1).
func (a *app) purgeDone(ctx context.Context, out outputFormat, verb, what string, n int64, p *progress, err error) error {
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, context.Canceled) { // SIGINT/SIGTERM: the statement in flight rolled back
			return fmt.Errorf("%s interrupted: %d %s deleted before it stopped (%s)", verb, n, what, p.rate(n))
		}
		return fmt.Errorf("%s failed after deleting %d %s: %w", verb, n, what, err)
	}
	if out == "json" {
		return writeJSON(a.stdout, purgeResult{Deleted: n, What: what, Seconds: time.Since(p.start).Seconds()})
	}
	_, err = fmt.Fprintf(a.stdout, "purged %d %s (%s)\n", n, what, p.rate(n))
	return err
}

// lookupName names what inspect looked up, for its not-found error.
func lookupName(msgID, businessKey string) string {
	if msgID != "" {
		return fmt.Sprintf("message ID %q", msgID)
	}
	return fmt.Sprintf("business key %q", businessKey)
}
